//! The `outbox` command (`src/bin/outbox.rs`): operating the outbox and its
//! queue together. It follows one event from its row in `outbox_events` to
//! its `event:` task and each listener's task in the queue, replays
//! published events, runs archived listener tasks again, cancels an
//! event's listener tasks and purges published rows. It reads the same configuration as the worker.
//!
//! - [`cli`]: the arguments, and [`run`], which connects and runs one
//!   subcommand;
//! - one module per subcommand (internal to the kit): `status`, `show`,
//!   `list`, `replay`, `retry_archived`, `skip`, `cancel`, `purge`, and
//!   `console`, which serves [`crate::console`];
//! - [`cancel_event`]: `outbox cancel` as a call, for a service's own
//!   endpoints or jobs;
//! - `output`: text for people, JSON (`--format json`) for scripts.
//!
//! What they read (an event's row and its tasks, through one `Context`)
//! is `crate::follow`'s, which the console reads too.
//!
//! Exit codes: 0 done, 1 failed (an unknown event, a database or queue
//! error), 2 `status --max-lag` exceeded, 64 invalid arguments. A command
//! that fails on its input changes nothing.

pub(crate) mod cancel;
pub mod cli;
pub(crate) mod console;
pub(crate) mod list;
pub(crate) mod output;
pub(crate) mod purge;
pub(crate) mod replay;
pub(crate) mod retry_archived;
pub(crate) mod show;
pub(crate) mod skip;
pub(crate) mod status;

use std::process::ExitCode;

pub use self::cancel::{Cancellation, ListenerTask, cancel_event};

use self::cli::{Cli, Command};
use self::output::Format;
use crate::config::Config;
use crate::follow::Context;
use crate::worker::listeners::Listeners;

/// Exit code when `status --max-lag` is exceeded.
pub(crate) const LAG_EXCEEDED: u8 = 2;
/// Exit code for invalid arguments (`EX_USAGE`).
pub(crate) const USAGE: u8 = 64;

/// Connects to Postgres and Valkey and runs `cli`'s subcommand.
pub async fn run(config: Config, mut listeners: Listeners, cli: Cli) -> ExitCode {
    // The tasks it makes again (replay, retry-archived, the console's send
    // back) take the listeners' policies as the worker's `WORKER_RETRIES`
    // gives them, when it is set here too.
    let overridden = crate::worker::retry_settings::overrides_from_env()
        .map_err(anyhow::Error::from)
        .and_then(|overrides| listeners.override_policies(&overrides));
    if let Err(err) = overridden {
        eprintln!("error: {err:#}");
        return ExitCode::FAILURE;
    }
    let context = Context::new(config, listeners);
    match dispatch(context, cli.command, cli.format).await {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs `command`, then closes the pool; the console keeps the context,
/// and its pool, while it serves.
async fn dispatch(context: Context, command: Command, format: Format) -> anyhow::Result<ExitCode> {
    let result = match command {
        Command::Console(args) => return console::run(context, args).await,
        Command::Status(args) => status::run(&context, &args, format).await,
        Command::Show(args) => show::run(&context, &args, format).await,
        Command::List(args) => list::run(&context, &args, format).await,
        Command::Replay(args) => replay::run(&context, &args, format).await,
        Command::RetryArchived(args) => retry_archived::run(&context, &args, format).await,
        Command::Skip(args) => skip::run(&context, &args, format).await,
        Command::Cancel(args) => cancel::run(&context, &args, format).await,
        Command::Purge(args) => purge::run(&context, &args, format).await,
    };
    context.pool.close().await;
    result
}
