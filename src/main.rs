//! The `gpkit` binary: parses the command line, runs it, and turns errors
//! into messages and exit codes (0 success, 1 error, 2 usage error; a
//! closed output pipe ends quietly).

use std::process::ExitCode;

use clap::Parser;
use gpkit::cli::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match gpkit::run(cli) {
        Ok(code) => code,
        // The reader of our output went away (`gpkit ... | head`): not an error.
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(1)
        }
    }
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
