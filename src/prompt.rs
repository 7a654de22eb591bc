//! Questions to the user. gpkit asks only when both standard input and
//! standard error are terminals and `--no-input` is not set; otherwise a
//! missing value is an error that names the flag or argument to pass, and a
//! choice takes its default. An invalid answer is explained and asked again.

use std::io::IsTerminal;

use anyhow::{Result, bail};

/// Whether gpkit may ask questions in this run.
pub(crate) fn interactive(no_input: bool) -> bool {
    !no_input && std::io::stdin().is_terminal() && std::io::stderr().is_terminal()
}

/// A value that has no default: `given`, or the answer to `question`, which
/// `parse` must accept (its error is shown and the question asked again).
/// Without a terminal a missing value is an error with `how_to_pass` as help.
pub(crate) fn value<T>(
    given: Option<String>,
    no_input: bool,
    question: &str,
    what: &str,
    how_to_pass: &str,
    parse: impl Fn(&str) -> Result<T>,
) -> Result<T> {
    if let Some(raw) = given {
        return parse(&raw);
    }
    if !interactive(no_input) {
        bail!("missing {what}\nhelp: pass it as `{how_to_pass}`");
    }
    let answer = dialoguer::Input::<String>::new()
        .with_prompt(question)
        .validate_with(|raw: &String| parse(raw).map(|_| ()).map_err(|err| format!("{err:#}")))
        .interact_text()?;
    parse(&answer)
}

/// A yes/no choice: `given` (from a flag), or the answer to `question` with
/// `default` preselected, or `default` without a terminal.
pub(crate) fn choice(
    given: Option<bool>,
    no_input: bool,
    question: &str,
    default: bool,
) -> Result<bool> {
    if let Some(value) = given {
        return Ok(value);
    }
    if !interactive(no_input) {
        return Ok(default);
    }
    Ok(dialoguer::Confirm::new()
        .with_prompt(question)
        .default(default)
        .interact()?)
}

/// One of `options` (each shown with its description): `given` (from a
/// flag), or the one picked from a list with `default` preselected, or
/// `default` without a terminal.
pub(crate) fn select<T: Copy + PartialEq>(
    given: Option<T>,
    no_input: bool,
    question: &str,
    options: &[(T, &str)],
    default: T,
) -> Result<T> {
    if let Some(value) = given {
        return Ok(value);
    }
    if !interactive(no_input) {
        return Ok(default);
    }
    let items: Vec<&str> = options.iter().map(|(_, label)| *label).collect();
    let preselected = options.iter().position(|(v, _)| *v == default).unwrap_or(0);
    let picked = dialoguer::Select::new()
        .with_prompt(question)
        .items(&items)
        .default(preselected)
        .interact()?;
    Ok(options[picked].0)
}
