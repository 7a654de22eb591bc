//! How the commands print: plain text for people, or with `--format json`
//! one JSON document on stdout for scripts. The JSON shapes are documented
//! in `docs/operations.md` and stable: fields may be added, never renamed or removed.

use std::io::{self, IsTerminal as _, Write as _};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;

/// `--format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    Text,
    Json,
}

/// Prints `value` as pretty JSON on stdout.
pub(crate) fn print_json(value: &impl Serialize) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    println!("{text}");
    Ok(())
}

/// A time as RFC 3339 in UTC, to the microsecond Postgres stores.
pub(crate) fn time(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// An optional time, or `-`.
pub(crate) fn maybe_time(value: Option<DateTime<Utc>>) -> String {
    value.map_or_else(|| "-".to_string(), time)
}

/// A duration to the second, such as `1h 2m 3s`.
pub(crate) fn age(duration: Duration) -> String {
    humantime::format_duration(Duration::from_secs(duration.as_secs())).to_string()
}

/// Asks `question` on the terminal; true on `y` or `yes`. Without a
/// terminal, or when `yes` was given, asks nothing: `Ok(yes)`.
pub(crate) fn confirm(question: &str, yes: bool) -> anyhow::Result<bool> {
    if yes {
        return Ok(true);
    }
    if !io::stdin().is_terminal() {
        anyhow::bail!("{question}: not on a terminal, so pass --yes to go ahead");
    }
    eprint!("{question} [y/N] ");
    io::stderr().flush()?;
    let mut answer = String::new();
    io::stdin().read_line(&mut answer)?;
    Ok(matches!(answer.trim().to_lowercase().as_str(), "y" | "yes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_ages_read_well() {
        let at: DateTime<Utc> = "2026-11-30T08:00:00.5Z".parse().unwrap();
        assert_eq!(time(at), "2026-11-30T08:00:00.500000Z");
        assert_eq!(maybe_time(None), "-");
        assert_eq!(age(Duration::from_millis(3_723_400)), "1h 2m 3s");
    }
}
