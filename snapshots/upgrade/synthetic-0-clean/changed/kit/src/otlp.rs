//! Span export over OTLP, configured by the standard OpenTelemetry
//! environment variables.
//!
//! With `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)
//! set, [`binary::run`](crate::binary::run) starts an exporter that sends
//! the process's spans (the `tracing` spans, as `tracing-opentelemetry` makes
//! them span data) over HTTP in protobuf, batched, and flushes it when the
//! binary ends. `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` name the
//! service (default: the binary's name), `OTEL_TRACES_SAMPLER` and
//! `OTEL_TRACES_SAMPLER_ARG` sample, `OTEL_SDK_DISABLED=true` or
//! `OTEL_TRACES_EXPORTER=none` turn it off. Without an endpoint nothing is
//! exported, and the kit creates none of the spans that only an exporter
//! reads.
//!
//! Built in: `http/protobuf` over plain HTTP (a collector beside the
//! service, port 4318). Not built in: gRPC and `http/json`, and HTTPS (the
//! collector forwards over TLS); asking for them is an error at start.

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

/// Set once an exporter runs in this process.
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Whether this process exports spans.
pub(crate) fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// A setting the exporter cannot work with, or an exporter that did not
/// start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ExportError {
    /// A protocol other than `http/protobuf`.
    #[error(
        "{variable}={value}: this service exports traces over http/protobuf only; \
         unset it or set it to http/protobuf, and point OTEL_EXPORTER_OTLP_ENDPOINT at \
         the collector's HTTP port (4318)"
    )]
    Protocol {
        /// The variable that asked for it.
        variable: &'static str,
        /// What it asked for.
        value: String,
    },
    /// An endpoint that is not plain HTTP.
    #[error(
        "{variable}={value}: this service exports traces over plain HTTP only; \
         send them to a collector beside it (http://localhost:4318), which forwards them over TLS"
    )]
    Endpoint {
        /// The variable that names it.
        variable: &'static str,
        /// The endpoint.
        value: String,
    },
    /// The exporter did not build.
    #[error("cannot start the OTLP span exporter: {0}")]
    Build(#[from] opentelemetry_otlp::ExporterBuildError),
}

/// What the environment asks of the exporter, checked.
#[derive(Debug, PartialEq, Eq)]
struct Settings {
    /// Whether the environment names the service.
    named: bool,
}

impl Settings {
    /// `None` when nothing is to be exported; an error for a setting this
    /// exporter cannot serve. `var` reads one variable.
    fn read(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, ExportError> {
        let var = |name: &str| var(name).filter(|value| !value.is_empty());
        if var("OTEL_SDK_DISABLED").is_some_and(|value| value.eq_ignore_ascii_case("true"))
            || var("OTEL_TRACES_EXPORTER").is_some_and(|value| value == "none")
        {
            return Ok(None);
        }
        let Some((variable, endpoint)) = [
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ]
        .into_iter()
        .find_map(|name| var(name).map(|value| (name, value))) else {
            return Ok(None);
        };
        if !endpoint.starts_with("http://") {
            return Err(ExportError::Endpoint {
                variable,
                value: endpoint,
            });
        }
        for variable in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Some(value) = var(variable).filter(|value| value != "http/protobuf") {
                return Err(ExportError::Protocol { variable, value });
            }
        }
        let named = var("OTEL_SERVICE_NAME").is_some()
            || var("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|attributes| {
                attributes
                    .split(',')
                    .any(|pair| pair.trim_start().starts_with("service.name="))
            });
        Ok(Some(Self { named }))
    }
}

/// The running exporter of this process's spans.
#[derive(Debug)]
pub(crate) struct SpanExport {
    provider: SdkTracerProvider,
}

impl SpanExport {
    /// Starts an exporter if the environment asks for one; `service` names
    /// the service unless `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES`
    /// does.
    pub(crate) fn from_env(service: &str) -> Result<Option<Self>, ExportError> {
        let Some(settings) = Settings::read(|name| std::env::var(name).ok())? else {
            return Ok(None);
        };
        // The exporter reads the endpoint (and any headers, timeout and
        // compression) from the same variables itself.
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .build()?;
        let resource = if settings.named {
            Resource::builder().build()
        } else {
            Resource::builder()
                .with_service_name(service.to_string())
                .build()
        };
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        EXPORTING.store(true, Ordering::Relaxed);
        Ok(Some(Self { provider }))
    }

    /// The tracer that `tracing-opentelemetry` records spans with.
    pub(crate) fn tracer(&self) -> SdkTracer {
        self.provider.tracer("kit")
    }

    /// Sends the spans still buffered and stops the exporter. Call it
    /// outside the async runtime: it waits for the export.
    pub(crate) fn shutdown(self) {
        if let Err(err) = self.provider.shutdown() {
            eprintln!("warning: the last spans may not have been exported: {err}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(vars: &[(&str, &str)]) -> Result<Option<Settings>, ExportError> {
        Settings::read(|name| {
            vars.iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| value.to_string())
        })
    }

    #[test]
    fn nothing_is_exported_without_an_endpoint_or_when_turned_off() {
        assert_eq!(read(&[]).unwrap(), None);
        assert_eq!(read(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "")]).unwrap(), None);
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318");
        assert_eq!(
            read(&[endpoint, ("OTEL_SDK_DISABLED", "TRUE")]).unwrap(),
            None
        );
        assert_eq!(
            read(&[endpoint, ("OTEL_TRACES_EXPORTER", "none")]).unwrap(),
            None
        );
        assert_eq!(read(&[endpoint]).unwrap(), Some(Settings { named: false }));
        let traces = (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://collector:4318/v1/traces",
        );
        assert_eq!(read(&[traces]).unwrap(), Some(Settings { named: false }));
    }

    #[test]
    fn the_service_is_named_by_either_variable() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318");
        for named in [
            ("OTEL_SERVICE_NAME", "shop-server"),
            ("OTEL_RESOURCE_ATTRIBUTES", "team=a, service.name=shop"),
        ] {
            assert_eq!(
                read(&[endpoint, named]).unwrap(),
                Some(Settings { named: true })
            );
        }
        let unnamed = ("OTEL_RESOURCE_ATTRIBUTES", "team=a");
        assert_eq!(
            read(&[endpoint, unnamed]).unwrap(),
            Some(Settings { named: false })
        );
    }

    #[test]
    fn what_is_not_built_in_is_refused_with_the_fix() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318");
        let err = read(&[endpoint, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]).unwrap_err();
        let message = err.to_string();
        assert!(
            message.starts_with("OTEL_EXPORTER_OTLP_PROTOCOL=grpc:"),
            "{message}"
        );
        assert!(
            message.contains("http/protobuf") && message.contains("4318"),
            "{message}"
        );
        let json = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json");
        assert!(matches!(
            read(&[endpoint, json]),
            Err(ExportError::Protocol {
                variable: "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                ..
            })
        ));
        let protobuf = ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf");
        assert!(read(&[endpoint, protobuf]).unwrap().is_some());
        let tls = ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://api.example.com");
        let message = read(&[tls]).unwrap_err().to_string();
        assert!(
            message.starts_with("OTEL_EXPORTER_OTLP_ENDPOINT=https://api.example.com:"),
            "{message}"
        );
        assert!(message.contains("collector"), "{message}");
    }
}
