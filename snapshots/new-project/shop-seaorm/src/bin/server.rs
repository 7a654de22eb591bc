//! The HTTP server.

use std::process::ExitCode;

use kit::config::Config;
use kit::env_file;
use kit::signals::shutdown_signal;
use kit::telemetry::{self, LogFormat};

use shop::startup::Application;

fn main() -> ExitCode {
    // First, while the process has one thread: `.env` sets variables.
    if let Err(err) = env_file::load() {
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
    if let Err(err) = serve(&config).await {
        tracing::error!(error = format!("{err:#}"), "server stopped");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

async fn serve(config: &Config) -> anyhow::Result<()> {
    let app = Application::build(config).await?;
    tracing::info!(addr = %app.local_addr(), database = %config.database.url.redacted(), "listening");
    app.run_until_stopped(shutdown_signal()).await?;
    tracing::info!("stopped");
    Ok(())
}
