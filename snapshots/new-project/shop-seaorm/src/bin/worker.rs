//! The worker: consumes queued tasks (event fan-out, listeners and
//! scheduled jobs), relays the outbox to the queue, runs the scheduler, and
//! cleans up published events.

use std::process::ExitCode;

use kit::config::Config;
use kit::scheduler::Schedules;
use kit::signals::shutdown_signal;
use kit::telemetry::{self, LogFormat};
use kit::worker::{self, listeners::Listeners};

use shop::listeners::register as register_listeners;
use shop::schedules::register as register_schedules;

fn main() -> ExitCode {
    // First, while the process has one thread: `.env` sets variables.
    if let Err(err) = kit::env_file::load() {
        eprintln!("error: {err}");
        return ExitCode::FAILURE;
    }
    run()
}

#[tokio::main]
async fn run() -> ExitCode {
    let config = match Config::from_env() {
        Ok(config) => config,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
    };
    telemetry::init_subscriber(telemetry::get_subscriber(
        "info",
        LogFormat::from_env(),
        std::io::stdout,
    ));
    let mut listeners = Listeners::new();
    register_listeners(&mut listeners);
    let mut schedules = Schedules::new();
    register_schedules(&mut schedules);
    if let Err(err) = worker::run(&config, listeners, schedules, shutdown_signal()).await {
        tracing::error!(error = format!("{err:#}"), "worker stopped");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
