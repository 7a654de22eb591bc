//! `outbox`: operates the outbox and its queue, with the worker's
//! configuration (`.env` and the environment). `outbox --help` lists the
//! subcommands; `kit/docs/operations.md` documents them and their JSON
//! output.

use std::process::ExitCode;

use kit::operations::{self, cli::Cli};
use kit::worker::listeners::Listeners;

use shop::listeners::register as register_listeners;
use shop::settings::Settings;

fn main() -> ExitCode {
    // Arguments first: `--help` and mistakes need no configuration.
    let cli = match Cli::from_args() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    kit::binary::run_command(async move || {
        let settings = Settings::from_env()?;
        let mut listeners = Listeners::new();
        register_listeners(&mut listeners);
        Ok(operations::run(settings.kit, listeners, cli).await)
    })
}
