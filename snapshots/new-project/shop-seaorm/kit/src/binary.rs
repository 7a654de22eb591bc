//! The start and end of each of the service's binaries: `.env`, the
//! settings, the logs, a runtime, and the exit code; and (feature
//! `mimalloc`, on by default) their allocator.

use std::process::ExitCode;

use crate::otlp::SpanExport;
use crate::telemetry::{self, LogFormat};
use crate::{config, env_file};

/// The allocator of every binary and test that links the kit: mimalloc
/// allocates and frees the many small buffers of each task (its message,
/// its replies, its futures) for less CPU than glibc's allocator.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Runs the binary `name`: loads `.env` (first, while the process has one
/// thread, since it sets variables), then in a multi-threaded tokio runtime
/// loads the settings `S` with [`config::load`], starts the logs (`RUST_LOG`,
/// default `info`; `LOG_FORMAT=json`) and, with `OTEL_EXPORTER_OTLP_ENDPOINT`
/// set, the export of its spans over OTLP (service name `OTEL_SERVICE_NAME`,
/// default `name`), and runs `main` on the settings. The spans still
/// buffered are sent when `main` returns. A settings error is printed, and
/// an error of `main` logged as `<name> stopped`; both exit with 1.
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
    let mut export = None;
    let code = runtime.block_on(async {
        let settings: S = match config::load() {
            Ok(settings) => settings,
            Err(err) => {
                eprintln!("error: {err}");
                return ExitCode::FAILURE;
            }
        };
        export = match SpanExport::from_env(name) {
            Ok(export) => export,
            Err(err) => {
                eprintln!("error: {err}");
                return ExitCode::FAILURE;
            }
        };
        telemetry::init_subscriber(telemetry::subscriber(
            "info",
            LogFormat::from_env(),
            std::io::stdout,
            export.as_ref().map(SpanExport::tracer),
        ));
        match main(settings).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                tracing::error!(error = format!("{err:#}"), "{name} stopped");
                ExitCode::FAILURE
            }
        }
    });
    if let Some(export) = export {
        export.shutdown();
    }
    code
}
