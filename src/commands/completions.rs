//! `gpkit completions <shell>` and `gpkit man`: shell completion scripts
//! and the manual page, both generated from the clap command tree.

use std::process::ExitCode;

use anyhow::Result;
use clap::CommandFactory;
use clap_complete::Shell;

use crate::cli::Cli;

/// Prints the completion script for `shell` to standard output.
pub(crate) fn completions(shell: Shell) -> Result<ExitCode> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "gpkit", &mut script);
    super::print_out(&String::from_utf8_lossy(&script))?;
    Ok(ExitCode::SUCCESS)
}

/// Prints the manual page, in roff, to standard output.
pub(crate) fn man() -> Result<ExitCode> {
    let mut page = Vec::new();
    clap_mangen::Man::new(Cli::command()).render(&mut page)?;
    super::print_out(&String::from_utf8_lossy(&page))?;
    Ok(ExitCode::SUCCESS)
}
