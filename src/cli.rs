//! The command line: clap types only. Each command's arguments are turned
//! into options and handed to `crate::commands`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Scaffold Rust backend services whose events go out through a
/// transactional outbox.
#[derive(Debug, Parser)]
#[command(name = "gpkit", version, arg_required_else_help = true, after_help = EXAMPLES)]
pub struct Cli {
    #[command(flatten)]
    pub(crate) global: GlobalArgs,
    #[command(subcommand)]
    pub(crate) command: Command,
}

const EXAMPLES: &str = "\
Examples:
  gpkit new project shop
  gpkit -C shop add worker
  gpkit --dry-run --diff new project shop
  gpkit -C shop new migration add_orders
  gpkit -C shop upgrade templates
  gpkit -C shop doctor
  gpkit -C shop dev";

/// Flags every command takes.
#[derive(Debug, Args)]
pub(crate) struct GlobalArgs {
    /// Print the plan (every file created or changed, and why); write nothing
    #[arg(long, global = true)]
    pub(crate) dry_run: bool,

    /// Show a unified diff of every change in the plan
    #[arg(long, global = true)]
    pub(crate) diff: bool,

    /// Never prompt; take defaults and flags only
    ///
    /// A value that has no default and was not given is then an error. gpkit
    /// never prompts when standard input is not a terminal either.
    #[arg(long, global = true)]
    pub(crate) no_input: bool,

    /// Run as if gpkit was started in DIR
    #[arg(short = 'C', value_name = "DIR", global = true)]
    pub(crate) directory: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Create a new project, or a new migration in this project
    #[command(subcommand)]
    New(NewCommand),
    /// Add a component to this project
    #[command(subcommand)]
    Add(AddCommand),
    /// Bring this project up to date with gpkit's current templates
    #[command(subcommand)]
    Upgrade(UpgradeCommand),
    /// The same as `gpkit upgrade templates`
    #[command(name = "upgrade-templates", hide = true)]
    UpgradeTemplates(UpgradeArgs),
    /// Check that this project can run here: toolchain, settings, servers
    ///
    /// Checks the Rust toolchain against the project's `rust-version`, reads
    /// the settings as the project's binaries do (the environment over
    /// `.env`), connects to Postgres and Valkey, compares the migrations in
    /// `migrations/` with those applied, and tells whether a template upgrade
    /// is available. Each problem comes with its fix. Writes nothing.
    ///
    /// Exit codes: 0 when every check passed (warnings allowed), 1 when one
    /// failed.
    #[command(after_help = "\
Examples:
  gpkit doctor
  gpkit -C shop doctor --format json")]
    Doctor(DoctorArgs),
    /// Run the project locally: its own Postgres and Valkey, migrations,
    /// server and worker
    ///
    /// Starts a Postgres cluster and (with the worker) a Valkey server that
    /// belong to the project, on free loopback ports, with their data under
    /// `.gpkit/dev/` (kept from one run to the next); when `DATABASE_URL` or
    /// `VALKEY_ADDR` (environment or `.env`) names a server that answers,
    /// uses it instead. Then runs `cargo build --bins`, applies the pending
    /// migrations (`migrate up --create-database`) and runs `server` and
    /// `worker` with `DATABASE_URL`, `VALKEY_ADDR` and `HTTP_ADDR` set, each
    /// output line prefixed by the process's name. A process that exits is
    /// restarted, with a growing pause while it keeps failing. A change
    /// under `src/`, `kit/`, `migrations/` or to `Cargo.toml` rebuilds,
    /// migrates and restarts them; a failed build keeps them running.
    /// Ctrl-C or SIGTERM stops the processes, then the servers. One `gpkit
    /// dev` per project at a time.
    ///
    /// Exit codes: 0 after an orderly stop, 1 on an error (no Postgres found,
    /// a failed build or migration, another `gpkit dev` running here).
    #[command(after_help = "\
Examples:
  gpkit dev
  gpkit dev --port 3000
  gpkit dev --fresh
  eval \"$(gpkit dev --print-env)\"   # in another terminal: psql \"$DATABASE_URL\"")]
    Dev(DevArgs),
    /// Print a shell completion script for gpkit
    #[command(after_help = "\
Examples:
  gpkit completions bash > ~/.local/share/bash-completion/completions/gpkit
  gpkit completions zsh > ~/.zfunc/_gpkit
  gpkit completions fish > ~/.config/fish/completions/gpkit.fish")]
    Completions(CompletionsArgs),
    /// Print gpkit's manual page (roff)
    #[command(after_help = "\
Examples:
  gpkit man > ~/.local/share/man/man1/gpkit.1
  gpkit man | man -l -")]
    Man,
}

#[derive(Debug, Args)]
pub(crate) struct DoctorArgs {
    /// Report format
    #[arg(long, value_enum, default_value_t = ReportFormat::Text)]
    pub(crate) format: ReportFormat,
}

#[derive(Debug, Args)]
pub(crate) struct DevArgs {
    /// The port the server listens on, on 127.0.0.1
    #[arg(long, default_value_t = 8080)]
    pub(crate) port: u16,

    /// Start from empty: remove the project's dev Postgres and Valkey data
    /// first
    #[arg(long, conflicts_with = "print_env")]
    pub(crate) fresh: bool,

    /// Do not watch the sources: no rebuild and restart on a change
    #[arg(long)]
    pub(crate) no_watch: bool,

    /// Print DATABASE_URL and VALKEY_ADDR of the `gpkit dev` running in this
    /// project, as NAME=value lines, and exit (1 when none runs)
    #[arg(long)]
    pub(crate) print_env: bool,

    /// Install a missing Postgres or Valkey server with apt-get (Debian and
    /// Ubuntu; through sudo when not root) before starting
    #[arg(long, conflicts_with = "print_env")]
    pub(crate) install: bool,

    /// Run the Postgres and Valkey of the project's compose.yaml (`gpkit
    /// add deploy`) with docker compose, instead of servers of its own
    #[arg(long, conflicts_with_all = ["print_env", "install"])]
    pub(crate) compose: bool,
}

#[derive(Debug, Args)]
pub(crate) struct CompletionsArgs {
    /// The shell to complete in
    #[arg(value_enum)]
    pub(crate) shell: clap_complete::Shell,
}

#[derive(Debug, Subcommand)]
pub(crate) enum UpgradeCommand {
    /// Refresh the kit's files to the current templates, keeping your edits
    ///
    /// For every file gpkit generated, it compares what it last wrote (kept
    /// in `.gpkit/base/`), the file now, and what the current templates
    /// render: files you did not change are replaced, files you changed are
    /// merged 3-way (overlapping edits get conflict markers), and
    /// `Cargo.toml` is merged entry by entry. Works without git.
    ///
    /// Exit codes: 0 up to date or upgraded cleanly, 2 with `--check` when an
    /// upgrade is available, 3 when conflicts were left to resolve.
    #[command(after_help = "\
Examples:
  gpkit upgrade templates --dry-run --diff
  gpkit upgrade templates
  gpkit upgrade templates --check --format json")]
    Templates(UpgradeArgs),
}

#[derive(Debug, Args)]
pub(crate) struct UpgradeArgs {
    /// Only check: exit 2 when an upgrade is available, 0 when up to date
    #[arg(long)]
    pub(crate) check: bool,

    /// Report format
    #[arg(long, value_enum, default_value_t = ReportFormat::Text)]
    pub(crate) format: ReportFormat,

    /// Recreate kit files you deleted
    #[arg(long)]
    pub(crate) restore_deleted: bool,

    /// Run even when files it would change have uncommitted git changes
    #[arg(long)]
    pub(crate) allow_dirty: bool,
}

/// How a report is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ReportFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub(crate) enum AddCommand {
    /// Add the worker: queue consumer, listener fan-out and the outbox relay
    ///
    /// Adds the `worker` binary, the queue module (asynq wire format on
    /// Valkey), the outbox relay and cleanup loop, the listener registry,
    /// the `WORKER_*` configuration and the Cargo dependencies. Running it
    /// again changes nothing.
    #[command(after_help = "\
Examples:
  gpkit add worker
  gpkit --dry-run --diff add worker
  gpkit -C shop add worker")]
    Worker,
    /// Add container files: a Dockerfile, .dockerignore and compose.yaml
    ///
    /// The Dockerfile builds one image holding `server`, `migrate` and (with
    /// the worker) `worker`: a cached dependency layer, `cargo build
    /// --locked`, and a small runtime image running as a non-root user.
    /// `compose.yaml` runs Postgres and Valkey with health checks, `migrate
    /// up` once, then the server and the worker, and for local runs
    /// Prometheus, Jaeger and Grafana with the outbox dashboard (configured
    /// under `deploy/`). Kit files: `gpkit upgrade templates` keeps them up
    /// to date. Running it again changes nothing.
    #[command(after_help = "\
Examples:
  gpkit add deploy
  gpkit --dry-run --diff add deploy
  gpkit -C shop add deploy")]
    Deploy,
    /// Add a typed event, and listeners for it
    ///
    /// The name may be spelled `OrderPlaced`, `order_placed` or `orderPlaced`:
    /// the Rust type is `OrderPlaced`, the module `order_placed` and the wire
    /// name `orderPlaced`. The first event also puts the `Transactor` into
    /// the server's `AppState`. On an existing
    /// event, `--listener` adds just the listeners.
    #[command(after_help = "\
Examples:
  gpkit add event orderPlaced --field order_id:uuid --field total_cents:i64
  gpkit add event order_placed --field note:Option<string> --listener audit --listener email
  gpkit add event orderPlaced --listener shipping
  gpkit add event order_cancelled --field order_id:i64 --listener shipping --ordered-by order_id
  gpkit add event orderPlaced --listener email --concurrency 5 --rate 10/s
  gpkit add event paymentDue --listener charge --retries 3 --timeout 60s --backoff fixed:20s")]
    Event(AddEventArgs),
    /// Add a schedule: an event dispatched, or a job run, on every tick
    ///
    /// Writes `src/schedules/<name>.rs` (for `--event`, the function that
    /// builds the event for a tick; for `--job`, the job's handler) and
    /// registers it in `src/schedules/mod.rs`. The worker runs the scheduler:
    /// one replica at a time leads (a lease on Valkey) and enqueues each tick
    /// once, with an id derived from the schedule's name and the tick's time.
    #[command(after_help = "\
Examples:
  gpkit add schedule nightly_report --cron \"0 2 * * *\" --tz Europe/Paris --event reportDue
  gpkit add schedule heartbeat --cron \"@every 30s\" --job
  gpkit add schedule cleanup --cron @hourly --job --catch-up 3")]
    Schedule(AddScheduleArgs),
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["event", "job"])))]
pub(crate) struct AddScheduleArgs {
    /// The schedule's name, snake_case (its module and its job's task type)
    pub(crate) name: String,

    /// When it runs: 5 cron fields (minute hour day-of-month month
    /// day-of-week), 6 with seconds first, @hourly, @daily, @weekly,
    /// @monthly, or `@every <duration>` (such as `@every 30s`)
    #[arg(long, value_name = "SPEC")]
    pub(crate) cron: crate::domain::schedule::ScheduleSpec,

    /// Dispatch this event (added with `gpkit add event`) through the outbox
    /// on every tick
    #[arg(long, value_name = "EVENT")]
    pub(crate) event: Option<String>,

    /// Run a job (`job:<name>` task) on every tick
    #[arg(long)]
    pub(crate) job: bool,

    /// The IANA time zone the spec is read in, such as Europe/Paris
    /// (default: UTC)
    ///
    /// On the day a local time is skipped (clocks go forward) the tick runs
    /// once at the next valid time; on the day it repeats (clocks go back)
    /// it runs once.
    #[arg(long, value_name = "ZONE")]
    pub(crate) tz: Option<String>,

    /// Ticks missed while no replica led (downtime) that a new leader
    /// enqueues, at most this many; 0 skips missed ticks
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub(crate) catch_up: u32,
}

#[derive(Debug, Args)]
pub(crate) struct AddEventArgs {
    /// The event's name, in any spelling
    pub(crate) name: String,

    /// A field, as name:type (repeatable)
    ///
    /// Types: string, bool, i32, i64, f64, uuid, datetime, json, and
    /// Option<...> or Vec<...> of these.
    #[arg(long = "field", value_name = "NAME:TYPE")]
    pub(crate) fields: Vec<String>,

    /// A listener to add, run by the worker for each event (repeatable)
    #[arg(long = "listener", value_name = "NAME")]
    pub(crate) listeners: Vec<String>,

    /// Run the listeners given here one event of each value of this field
    /// at a time, in the order their transactions committed (the event's
    /// `order_key`); a field of type string, i32, i64 or uuid
    #[arg(long, value_name = "FIELD")]
    pub(crate) ordered_by: Option<String>,

    /// Run at most N of the listeners' runs at once, across every worker
    #[arg(long, value_name = "N")]
    pub(crate) concurrency: Option<u32>,

    /// Start at most this many of the listeners' runs per second, minute or
    /// hour, across every worker: N/s, N/m or N/h
    #[arg(long, value_name = "RATE")]
    pub(crate) rate: Option<String>,

    /// The burst `--rate` allows: runs that may start at once (default 1)
    #[arg(long, value_name = "N")]
    pub(crate) burst: Option<u32>,

    /// Retry a failed run of the listeners at most N times, then archive it
    /// (default 25)
    #[arg(long, value_name = "N")]
    pub(crate) retries: Option<u32>,

    /// Stop a run of the listeners that takes longer, and retry it: 500ms,
    /// 90s, 10m or 1h (default 30m)
    #[arg(long, value_name = "DURATION")]
    pub(crate) timeout: Option<String>,

    /// The delay before each retry: fixed:<delay>, exponential:<first>:<most>
    /// (doubling, with jitter) or asynq (Go asynq's, the default)
    #[arg(long, value_name = "BACKOFF")]
    pub(crate) backoff: Option<String>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum NewCommand {
    /// Create a new service with a transactional outbox
    #[command(after_help = "\
Examples:
  gpkit new project shop
  gpkit new project shop --no-worker
  gpkit new project shop --example
  gpkit new project shop --db sea-orm
  gpkit -C ~/src new project order-service
  gpkit --dry-run --diff new project shop")]
    Project(NewProjectArgs),
    /// Create a goose migration in `migrations/`
    ///
    /// The file is named `<UTC YYYYMMDDhhmmss>_<snake_case_name>.sql` (or
    /// `<%05d>_<name>.sql` with `--sequential`) and holds goose's template
    /// with `-- +goose Up` and `-- +goose Down` sections.
    #[command(after_help = "\
Examples:
  gpkit new migration add_orders
  gpkit new migration \"add index on users.email\"
  gpkit new migration add_orders --sequential")]
    Migration(NewMigrationArgs),
}

#[derive(Debug, Args)]
pub(crate) struct NewMigrationArgs {
    /// What the migration does, in any spelling; it becomes snake_case
    pub(crate) name: String,

    /// Number sequentially (00001, 00002, ...) instead of by timestamp
    #[arg(long, short = 's')]
    pub(crate) sequential: bool,
}

#[derive(Debug, Args)]
pub(crate) struct NewProjectArgs {
    /// The Cargo package name, also the new directory's name
    ///
    /// Lowercase letters, digits, `-` and `_`, starting with a letter. Asked
    /// for when missing and standard input is a terminal.
    pub(crate) name: Option<String>,

    /// Include the worker (the default; asked when interactive)
    #[arg(long, conflicts_with = "no_worker")]
    pub(crate) worker: bool,

    /// Leave out the worker (add it later with `gpkit add worker`)
    #[arg(long)]
    pub(crate) no_worker: bool,

    /// Add a working example: orders with `POST /orders`, `GET /orders/{id}`,
    /// the `orderPlaced` event and a listener that confirms orders
    ///
    /// Made of what `gpkit add event` and `gpkit new migration` make, filled
    /// in, so it upgrades like the rest. Needs the worker. Asked when
    /// interactive (default: no).
    #[arg(long, conflicts_with_all = ["no_example", "no_worker"])]
    pub(crate) example: bool,

    /// Leave out the example (the default)
    #[arg(long)]
    pub(crate) no_example: bool,

    /// Add container files (Dockerfile, .dockerignore, compose.yaml), as
    /// `gpkit add deploy` does; asked when interactive (default: no)
    #[arg(long, conflicts_with = "no_deploy")]
    pub(crate) deploy: bool,

    /// Leave out the container files (the default)
    #[arg(long)]
    pub(crate) no_deploy: bool,

    /// The data layer: `sqlx` (the default) or `sea-orm`
    ///
    /// With `sea-orm`, transactions hand out SeaORM's `DatabaseTransaction`
    /// (on the same sqlx pool), and events dispatched on it commit with your
    /// entities. Asked when interactive. `--example` is written for either.
    #[arg(long, value_name = "LAYER")]
    pub(crate) db: Option<crate::engine::manifest::DataLayer>,
}

impl NewProjectArgs {
    /// Whether a flag chose the example: `Some(true)` for `--example`,
    /// `Some(false)` for `--no-example`, `None` to ask or take the default.
    pub(crate) fn example(&self) -> Option<bool> {
        match (self.example, self.no_example) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        }
    }

    /// Whether a flag chose the container files: `Some(true)` for
    /// `--deploy`, `Some(false)` for `--no-deploy`, `None` to ask or take
    /// the default.
    pub(crate) fn deploy(&self) -> Option<bool> {
        match (self.deploy, self.no_deploy) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        }
    }

    /// Whether a flag chose the worker: `Some(true)` for `--worker`,
    /// `Some(false)` for `--no-worker`, `None` to ask or take the default.
    pub(crate) fn worker(&self) -> Option<bool> {
        match (self.worker, self.no_worker) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_tree_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn global_flags_go_anywhere() {
        let cli =
            Cli::try_parse_from(["gpkit", "new", "project", "shop", "--dry-run", "-C", "/tmp"])
                .unwrap();
        assert!(cli.global.dry_run);
        assert_eq!(cli.global.directory, Some(PathBuf::from("/tmp")));
    }
}
