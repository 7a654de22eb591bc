//! The `outbox` command (`src/bin/outbox.rs`): operating the outbox and its
//! queue together. It follows one event from its row in `outbox_events` to
//! its `event:` task and each listener's task in the queue, replays
//! published events, runs archived listener tasks again and purges
//! published rows. It reads the same configuration as the worker.
//!
//! - [`cli`]: the arguments, and [`run`], which connects and runs one
//!   subcommand;
//! - one module per subcommand (internal to the kit): `status`, `show`,
//!   `list`, `replay`, `retry_archived`, `purge`, and `console`, which
//!   serves [`crate::console`];
//! - `rows`: the SQL on `outbox_events` they need;
//! - `tasks`: from an event to its tasks in the queue;
//! - `time`: times given as `2h` (that long ago) or RFC 3339;
//! - `output`: text for people, JSON (`--format json`) for scripts.
//!
//! Exit codes: 0 done, 1 failed (an unknown event, a database or queue
//! error), 2 `status --max-lag` exceeded, 64 invalid arguments. A command
//! that fails on its input changes nothing.

pub mod cli;
pub(crate) mod console;
pub(crate) mod list;
pub(crate) mod output;
pub(crate) mod purge;
pub(crate) mod replay;
pub(crate) mod retry_archived;
pub(crate) mod rows;
pub(crate) mod show;
pub(crate) mod status;
pub(crate) mod tasks;
pub(crate) mod time;

use std::process::ExitCode;
use std::sync::OnceLock;

use anyhow::Context as _;
use sqlx::PgPool;

use self::cli::{Cli, Command};
use self::output::Format;
use crate::config::Config;
use crate::database;
use crate::queue::Client;
use crate::worker::listeners::Listeners;

/// Exit code when `status --max-lag` is exceeded.
pub(crate) const LAG_EXCEEDED: u8 = 2;
/// Exit code for invalid arguments (`EX_USAGE`).
pub(crate) const USAGE: u8 = 64;

/// What every subcommand works with.
pub(crate) struct Context {
    pub pool: PgPool,
    /// Connected at first use: `list` and `purge` work while Valkey is down.
    queue: OnceLock<Client>,
    pub config: Config,
    /// This service's listeners, to find an event's listener tasks.
    pub listeners: Listeners,
}

impl Context {
    /// The queue, connected (and PINGed) the first time it is needed.
    pub async fn queue(&self) -> anyhow::Result<&Client> {
        if let Some(client) = self.queue.get() {
            return Ok(client);
        }
        let client = Client::from_config(&self.config.valkey)
            .await
            .context("this command needs Valkey")?;
        Ok(self.queue.get_or_init(|| client))
    }

    /// The queues events go to (`OUTBOX_QUEUES`): where their event tasks
    /// and, after the fan-out, their listener tasks are.
    pub(crate) fn outbox_queues(&self) -> &[String] {
        self.config.outbox.queues.names()
    }

    /// Every queue of the service: `OUTBOX_QUEUES`, then the other queues
    /// of `WORKER_QUEUES`.
    pub(crate) fn all_queues(&self) -> Vec<String> {
        let mut queues = self.outbox_queues().to_vec();
        for queue in self.config.worker.queues.names() {
            if !queues.iter().any(|q| q == queue) {
                queues.push(queue.to_string());
            }
        }
        queues
    }
}

impl Context {
    /// Connects to Postgres and Valkey when first needed.
    pub(crate) fn new(config: Config, listeners: Listeners) -> Self {
        Self {
            pool: database::connect_lazy(&config.database),
            queue: OnceLock::new(),
            config,
            listeners,
        }
    }
}

/// Connects to Postgres and Valkey and runs `cli`'s subcommand.
pub async fn run(config: Config, listeners: Listeners, cli: Cli) -> ExitCode {
    let context = Context::new(config, listeners);
    let result = match cli.command {
        // The console keeps the context, and its pool, while it serves.
        Command::Console(args) => console::run(context, args).await,
        command => {
            let result = dispatch(&context, command, cli.format).await;
            context.pool.close().await;
            result
        }
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn dispatch(context: &Context, command: Command, format: Format) -> anyhow::Result<ExitCode> {
    match command {
        Command::Status(args) => status::run(context, &args, format).await,
        Command::Show(args) => show::run(context, &args, format).await,
        Command::List(args) => list::run(context, &args, format).await,
        Command::Replay(args) => replay::run(context, &args, format).await,
        Command::RetryArchived(args) => retry_archived::run(context, &args, format).await,
        Command::Purge(args) => purge::run(context, &args, format).await,
        Command::Console(args) => unreachable!("{args:?} is served by `run`"),
    }
}
