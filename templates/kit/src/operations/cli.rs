//! The `outbox` command's arguments (clap), one struct per subcommand in
//! that subcommand's module.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use super::output::Format;
use super::{USAGE, cancel, console, list, purge, replay, retry_archived, show, skip, status};

/// Operates the outbox: follow an event from its commit to every listener,
/// replay it, run archived listener tasks again, cancel its listener
/// tasks, purge published rows.
#[derive(Debug, Parser)]
#[command(name = "outbox", version)]
pub struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
    /// Output: `text` for people, `json` for scripts (a stable shape, see
    /// `kit/docs/operations.md`)
    #[arg(long, value_enum, default_value_t = Format::Text, global = true)]
    pub(crate) format: Format,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// The relay's lag, recent throughput, rows due for cleanup, the
    /// table's size, and each queue's tasks by state
    Status(status::Args),
    /// One event: its row, its task and each listener's task in the queue
    Show(show::Args),
    /// Events, newest first
    List(list::Args),
    /// Delivers published events again, under new task ids (the event id
    /// stays the same)
    Replay(replay::Args),
    /// Puts archived listener tasks back to pending, as asynq's "run" does
    RetryArchived(retry_archived::Args),
    /// Moves an ordered listener's key past its first run, which failed for
    /// good: the key's next event runs; the failed task stays archived
    Skip(skip::Args),
    /// Cancels an event's listener tasks: deletes those that wait (pending,
    /// scheduled, retry) and asks those that run to stop; recorded as
    /// cancelled, not failed
    Cancel(cancel::Args),
    /// Deletes published rows in bounded batches
    Purge(purge::Args),
    /// Serves the web console: the outbox at work, one event from its
    /// commit to every listener, and the failures to retry
    Console(console::Args),
}

impl Cli {
    /// The process's arguments. On a mistake, or `--help`, what clap has
    /// to say is printed and the exit code returned (`usage_error`).
    pub fn from_args() -> Result<Self, ExitCode> {
        Self::try_parse().map_err(|err| usage_error(&err))
    }
}

/// Reports an argument error (exit 64) or prints the help or version
/// that clap was asked for (exit 0).
pub(crate) fn usage_error(err: &clap::Error) -> ExitCode {
    // Printing to a closed pipe is not worth a panic.
    let _ = err.print();
    if err.use_stderr() {
        ExitCode::from(USAGE)
    } else {
        ExitCode::SUCCESS
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_arguments_are_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn an_id_and_filters_do_not_mix() {
        let id = "0193a5c2-5b6e-7d1f-9a2b-3c4d5e6f7a8b";
        let err = Cli::try_parse_from(["outbox", "replay", id, "--name", "x", "--since", "1h"])
            .unwrap_err();
        assert!(err.use_stderr());
        assert!(Cli::try_parse_from(["outbox", "replay"]).is_err());
        assert!(Cli::try_parse_from(["outbox", "replay", "--name", "x"]).is_err());
        assert!(Cli::try_parse_from(["outbox", "replay", "--name", "x", "--since", "1h"]).is_ok());
        assert!(Cli::try_parse_from(["outbox", "replay", "--lost", "--since", "1h"]).is_ok());
        assert!(Cli::try_parse_from(["outbox", "replay", "--since", "1h"]).is_err());
        assert!(Cli::try_parse_from(["outbox", "replay", "--lost"]).is_err());
        assert!(
            Cli::try_parse_from([
                "outbox",
                "replay",
                "--lost",
                "--since",
                "1h",
                "--listener",
                "a"
            ])
            .is_err()
        );
    }
}
