//! The start and end of each of the service's binaries: `.env`, the
//! settings, the logs, a runtime, and the exit code; and (feature
//! `mimalloc`, on by default) their allocator. The services (`server`,
//! `worker`) start with [`run`], the commands (`migrate`, `outbox`) with
//! [`run_command`]: both load `.env` first and print an error that stops
//! the binary before it runs as `error: <what went wrong>`.

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
    let runtime = match start() {
        Ok(runtime) => runtime,
        Err(code) => return code,
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

/// Runs a command of the service (`migrate`, `outbox`): loads `.env` (first,
/// as [`run`] does), then runs `main` in a multi-threaded tokio runtime and
/// exits with the code it returns. An error of `main` is printed as
/// `error: <error>`, with its causes, and exits with 1. No logs are set up:
/// a command prints what it has to say, on stdout for its results (text or
/// JSON) and on stderr for its errors. Parse the arguments before, so that
/// `--help` and a mistake need no `.env`, or in `main`, when they read
/// variables that `.env` may set.
///
/// ```no_run
/// use std::process::ExitCode;
///
/// fn main() -> ExitCode {
///     kit::binary::run_command(async || {
///         println!("done");
///         Ok(ExitCode::SUCCESS)
///     })
/// }
/// ```
pub fn run_command<F>(main: F) -> ExitCode
where
    F: AsyncFnOnce() -> anyhow::Result<ExitCode>,
{
    let runtime = match start() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    runtime.block_on(async {
        match main().await {
            Ok(code) => code,
            Err(err) => {
                eprintln!("error: {err:#}");
                ExitCode::FAILURE
            }
        }
    })
}

/// What every binary does first: loads `.env` while the process has one
/// thread (it sets variables), then builds the runtime. On failure, the
/// error is printed and the exit code returned.
fn start() -> Result<tokio::runtime::Runtime, ExitCode> {
    if let Err(err) = env_file::load() {
        eprintln!("error: {err}");
        return Err(ExitCode::FAILURE);
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|err| {
            eprintln!("error: cannot start the async runtime: {err}");
            ExitCode::FAILURE
        })
}
