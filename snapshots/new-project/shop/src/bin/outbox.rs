//! `outbox`: operates the outbox and its queue, with the worker's
//! configuration (`.env` and the environment). `outbox --help` lists the
//! subcommands; the README documents them and their JSON output.

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
    // Then, while the process has one thread: `.env` sets variables.
    if let Err(err) = kit::env_file::load() {
        eprintln!("error: {err}");
        return ExitCode::FAILURE;
    }
    run(cli)
}

#[tokio::main]
async fn run(cli: Cli) -> ExitCode {
    let settings = match Settings::from_env() {
        Ok(settings) => settings,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
    };
    let mut listeners = Listeners::new();
    register_listeners(&mut listeners);
    operations::run(settings.kit, listeners, cli).await
}
