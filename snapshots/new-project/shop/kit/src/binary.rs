//! The start and end of each of the service's binaries: `.env`, the
//! settings, the logs, a runtime, and the exit code.

use std::process::ExitCode;

use crate::telemetry::{self, LogFormat};
use crate::{config, env_file};

/// Runs the binary `name`: loads `.env` (first, while the process has one
/// thread, since it sets variables), then in a multi-threaded tokio runtime
/// loads the settings `S` with [`config::load`], starts the logs (`RUST_LOG`,
/// default `info`; `LOG_FORMAT=json`) and runs `main` on the settings. A
/// settings error is printed, and an error of `main` logged as `<name>
/// stopped`; both exit with 1.
///
/// ```no_run
/// use std::process::ExitCode;
///
/// fn main() -> ExitCode {
///     kit::binary::run("server", async |settings: kit::config::Config| {
///         tracing::info!(addr = %settings.http.addr, "would listen");
///         Ok(())
///     })
/// }
/// ```
pub fn run<S, F>(name: &str, main: F) -> ExitCode
where
    S: confique::Config,
    F: AsyncFnOnce(S) -> anyhow::Result<()>,
{
    if let Err(err) = env_file::load() {
        eprintln!("error: {err}");
        return ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let settings: S = match config::load() {
            Ok(settings) => settings,
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
        match main(settings).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                tracing::error!(error = format!("{err:#}"), "{name} stopped");
                ExitCode::FAILURE
            }
        }
    })
}
