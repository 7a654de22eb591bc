//! Questions to the user. gpkit asks only when both standard input and
//! standard error are terminals and `--no-input` is not set; otherwise a
//! missing value is an error that names the flag or argument to pass.

use std::io::IsTerminal;

use anyhow::{Result, bail};

/// Whether gpkit may ask questions in this run.
pub fn interactive(no_input: bool) -> bool {
    !no_input && std::io::stdin().is_terminal() && std::io::stderr().is_terminal()
}

/// Returns `given`, or asks for it, or fails with `how_to_pass` as help.
pub fn text(
    given: Option<String>,
    no_input: bool,
    question: &str,
    what: &str,
    how_to_pass: &str,
) -> Result<String> {
    if let Some(value) = given {
        return Ok(value);
    }
    if !interactive(no_input) {
        bail!("missing {what}\nhelp: pass it as `{how_to_pass}`");
    }
    Ok(dialoguer::Input::<String>::new()
        .with_prompt(question)
        .interact_text()?)
}
