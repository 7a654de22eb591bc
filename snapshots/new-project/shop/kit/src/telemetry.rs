//! Logging and tracing set-up.
//!
//! Logs are human-readable by default and JSON with `LOG_FORMAT=json`; the
//! level comes from `RUST_LOG` (default `info`). The subscriber takes its
//! output sink as a parameter so that tests can capture or silence logs.
//! When spans are exported over OTLP (see the binaries' `OTEL_*` settings),
//! the info-level spans and events go to the exporter too, whatever
//! `RUST_LOG` says.

use opentelemetry_sdk::trace::SdkTracer;
use tracing::Subscriber;
use tracing::level_filters::LevelFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::{Layer as _, SubscriberExt};
use tracing_subscriber::{EnvFilter, Registry};

/// Output format of the logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    /// Reads `LOG_FORMAT` (`json` or `text`; anything else means text).
    pub fn from_env() -> Self {
        match std::env::var("LOG_FORMAT").as_deref() {
            Ok("json") => Self::Json,
            _ => Self::Text,
        }
    }
}

/// Builds a subscriber that writes to `sink`, filtered by `RUST_LOG` or
/// else `default_filter`.
pub fn get_subscriber<Sink>(
    default_filter: &str,
    format: LogFormat,
    sink: Sink,
) -> Box<dyn Subscriber + Send + Sync>
where
    Sink: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    subscriber(default_filter, format, sink, None)
}

/// [`get_subscriber`], and with `tracer` a layer that turns spans into
/// OpenTelemetry span data.
pub(crate) fn subscriber<Sink>(
    default_filter: &str,
    format: LogFormat,
    sink: Sink,
    tracer: Option<SdkTracer>,
) -> Box<dyn Subscriber + Send + Sync>
where
    Sink: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let spans = tracer.map(|tracer| {
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_filter(LevelFilter::INFO)
    });
    let registry = Registry::default().with(spans);
    match format {
        LogFormat::Json => Box::new(
            registry.with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_current_span(true)
                    .with_writer(sink)
                    .with_filter(filter),
            ),
        ),
        LogFormat::Text => Box::new(
            registry.with(
                tracing_subscriber::fmt::layer()
                    .with_writer(sink)
                    .with_filter(filter),
            ),
        ),
    }
}

/// Installs `subscriber` as the global default. Call once per process.
pub fn init_subscriber(subscriber: Box<dyn Subscriber + Send + Sync>) {
    tracing::subscriber::set_global_default(subscriber)
        .expect("init_subscriber is called once per process");
}
