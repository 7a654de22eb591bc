//! W3C trace context (`traceparent`, `tracestate`) carried through the
//! outbox, so that one trace spans the request that dispatched an event,
//! the relay and every listener.
//!
//! The context lives in a task-local: the HTTP middleware [`propagate`]
//! takes it from the request's `traceparent` header (or starts a new trace)
//! and runs the handler inside it; the outbox dispatcher writes a child of
//! it into the envelope's metadata; the relay also writes it into the
//! event task's headers (asynq's `TaskMessage.headers`, which the fan-out
//! copies to every listener task), where a Go service's asynq middleware
//! reads it; the worker runs each listener inside the context of its task's
//! headers or, without one, of the envelope. A scheduler's event tick starts
//! a trace of its own. Logs carry the trace id, so they can be joined
//! across services.
//!
//! When spans are exported over OTLP, each of these steps is a span of its
//! own (see `spans`), started as a child of the context it continues, and
//! the context passed on is that span's: the trace a backend shows is the
//! one the envelope and the headers carry. Without export, the same
//! contexts are made here with new span ids, and no span data at all.

use std::collections::BTreeMap;
use std::future::Future;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId};
use tracing::{Instrument, Span};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::{otlp, spans};

/// W3C trace context and other string metadata (`traceparent`, `tracestate`)
/// that travels with an event, in its envelope.
pub type Metadata = BTreeMap<String, String>;

tokio::task_local! {
    static CURRENT: TraceContext;
}

/// One position in a trace: a trace id, the id of the current span, and the
/// vendor state passed along with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    trace_id: String,
    span_id: String,
    sampled: bool,
    tracestate: Option<String>,
}

impl TraceContext {
    /// A new trace, with random ids.
    pub(crate) fn new_root() -> Self {
        Self {
            trace_id: uuid::Uuid::new_v4().simple().to_string(),
            span_id: new_span_id(),
            sampled: true,
            tracestate: None,
        }
    }

    /// Parses a `traceparent` header (`00-<32 hex>-<16 hex>-<2 hex>`);
    /// `None` for anything malformed, as the W3C spec asks.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<Self> {
        let mut parts = traceparent.trim().split('-');
        let (version, trace_id, span_id, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let hex = |s: &str, len: usize| {
            s.len() == len
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        let valid = parts.next().is_none()
            && hex(version, 2)
            && version != "ff"
            && hex(trace_id, 32)
            && trace_id.bytes().any(|b| b != b'0')
            && hex(span_id, 16)
            && span_id.bytes().any(|b| b != b'0')
            && hex(flags, 2);
        valid.then(|| Self {
            trace_id: trace_id.to_string(),
            span_id: span_id.to_string(),
            sampled: u8::from_str_radix(flags, 16).is_ok_and(|f| f & 1 == 1),
            tracestate: tracestate.map(str::to_string).filter(|s| !s.is_empty()),
        })
    }

    /// The context found in an event's metadata, if any.
    pub fn from_metadata(metadata: &Metadata) -> Option<Self> {
        let traceparent = metadata.get("traceparent")?;
        Self::parse(traceparent, metadata.get("tracestate").map(String::as_str))
    }

    /// The same trace, one span further down.
    pub fn child(&self) -> Self {
        Self {
            span_id: new_span_id(),
            ..self.clone()
        }
    }

    /// The trace id, 32 lowercase hex digits.
    pub fn trace_id(&self) -> &str {
        &self.trace_id
    }

    /// The `traceparent` header value.
    pub fn traceparent(&self) -> String {
        let flags = if self.sampled { "01" } else { "00" };
        format!("00-{}-{}-{flags}", self.trace_id, self.span_id)
    }

    /// The context in a task's headers (asynq's `TaskMessage.headers`, as
    /// the relay writes them and Go middleware reads and writes them), else
    /// the one in the event's metadata.
    pub fn from_headers_or(headers: &Metadata, metadata: &Metadata) -> Option<Self> {
        Self::from_metadata(headers).or_else(|| Self::from_metadata(metadata))
    }

    /// Writes `traceparent` (and `tracestate`) into event metadata.
    pub(crate) fn inject(&self, metadata: &mut Metadata) {
        metadata.insert("traceparent".to_string(), self.traceparent());
        if let Some(state) = &self.tracestate {
            metadata.insert("tracestate".to_string(), state.clone());
        }
    }

    /// This context as OpenTelemetry's, received from elsewhere: the
    /// parent of a span started here, or a span linked to.
    pub(crate) fn span_context(&self) -> SpanContext {
        let flags = if self.sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        SpanContext::new(
            TraceId::from_hex(&self.trace_id).unwrap_or(TraceId::INVALID),
            SpanId::from_hex(&self.span_id).unwrap_or(SpanId::INVALID),
            flags,
            true,
            self.tracestate
                .as_deref()
                .and_then(|state| state.parse().ok())
                .unwrap_or_default(),
        )
    }

    /// The context of a span started here, if it is a valid one.
    fn of_span(context: &SpanContext) -> Option<Self> {
        context.is_valid().then(|| Self {
            trace_id: context.trace_id().to_string(),
            span_id: context.span_id().to_string(),
            sampled: context.is_sampled(),
            tracestate: Some(context.trace_state().header()).filter(|state| !state.is_empty()),
        })
    }
}

/// Starts `span` as a child of `parent` (a new trace without one) and
/// returns the context that continues from it: the span's own when spans
/// are exported, else a new span id under `parent` (or a new root). The
/// span's `trace_id` field, if it has one, gets the trace id.
pub(crate) fn start(span: &Span, parent: Option<&TraceContext>) -> TraceContext {
    let mut started = None;
    if otlp::exporting() {
        if let Some(parent) = parent {
            let remote =
                opentelemetry::Context::new().with_remote_span_context(parent.span_context());
            // Refused only for a span no layer records (filtered out).
            let _ = span.set_parent(remote);
        }
        started = TraceContext::of_span(span.context().span().span_context());
    }
    let context =
        started.unwrap_or_else(|| parent.map_or_else(TraceContext::new_root, TraceContext::child));
    span.record("trace_id", context.trace_id());
    context
}

/// Spawns `run`, a task's processing, in the trace a consumer runs a task
/// in: instrumented with `span` (its `process` span), which continues
/// `parent` (the trace of the task's headers, as a Go producer's
/// middleware writes them) or starts a new trace, and with that trace as
/// the current context. The consumer and the testing kit's drain both run
/// listeners this way, so that what a listener dispatches carries the same
/// trace under either.
#[cfg(feature = "worker")]
pub(crate) fn spawn_in_task_trace<F>(
    span: Span,
    parent: Option<&TraceContext>,
    run: F,
) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let context = start(&span, parent);
    tokio::spawn(within(context, run.instrument(span)))
}

/// Runs `future` with `context` as the current one (see [`current`]).
#[cfg(feature = "worker")]
pub(crate) fn within<F: Future>(
    context: TraceContext,
    future: F,
) -> tokio::task::futures::TaskLocalFuture<TraceContext, F> {
    CURRENT.scope(context, future)
}

/// The W3C trace context headers of `metadata` (`traceparent` and
/// `tracestate`), for a task's headers: what an asynq middleware, in Go or
/// Rust, reads to continue the trace. Empty when the metadata has no valid
/// context.
#[cfg(feature = "worker")]
pub(crate) fn task_headers(metadata: &Metadata) -> BTreeMap<String, String> {
    let mut headers = BTreeMap::new();
    if let Some(context) = TraceContext::from_metadata(metadata) {
        context.inject(&mut headers);
    }
    headers
}

fn new_span_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..16].to_string()
}

/// The trace context the current task runs in, if any.
pub fn current() -> Option<TraceContext> {
    CURRENT.try_with(TraceContext::clone).ok()
}

/// Runs `future` inside `context`, in a span that logs its trace id.
pub async fn scope<F: Future>(context: TraceContext, future: F) -> F::Output {
    let span = tracing::info_span!("trace", trace_id = %context.trace_id);
    CURRENT.scope(context, future.instrument(span)).await
}

/// Axum middleware: runs each request inside the trace context of its
/// `traceparent` header (a child span of it), or of a new trace; with
/// export, in a `server` span named after its method and matched route.
pub async fn propagate(request: Request, next: Next) -> Response {
    let span = spans::http_request(&request);
    let context = start(&span, incoming(&request).as_ref());
    let response = CURRENT
        .scope(context, next.run(request).instrument(span.clone()))
        .await;
    spans::record_response(&span, response.status().as_u16());
    response
}

/// The context of a request's `traceparent` (and `tracestate`) header.
fn incoming(request: &Request) -> Option<TraceContext> {
    let header = |name: &str| request.headers().get(name).and_then(|v| v.to_str().ok());
    TraceContext::parse(header("traceparent")?, header("tracestate"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "worker")]
    #[test]
    fn task_headers_carry_the_context_and_headers_come_first() {
        let mut metadata = Metadata::new();
        assert!(task_headers(&metadata).is_empty());
        metadata.insert("traceparent".into(), PARENT.into());
        metadata.insert("tracestate".into(), "rojo=1".into());
        metadata.insert("tenant".into(), "acme".into());
        let headers = task_headers(&metadata);
        assert_eq!(headers.len(), 2, "only the trace context: {headers:?}");
        assert_eq!(headers["traceparent"], PARENT);
        assert_eq!(headers["tracestate"], "rojo=1");

        let other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let from_go = Metadata::from([("traceparent".to_string(), other.to_string())]);
        let context = TraceContext::from_headers_or(&from_go, &metadata).unwrap();
        assert_eq!(context.trace_id(), "0af7651916cd43dd8448eb211c80319c");
        let bad = Metadata::from([("traceparent".to_string(), "junk".to_string())]);
        let context = TraceContext::from_headers_or(&bad, &metadata).unwrap();
        assert_eq!(context.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
    }

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_and_prints_a_traceparent() {
        let context = TraceContext::parse(PARENT, Some("rojo=00f067aa0ba902b7")).unwrap();
        assert_eq!(context.traceparent(), PARENT);
        assert_eq!(context.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        let child = context.child();
        assert_eq!(child.trace_id(), context.trace_id());
        assert_ne!(child.traceparent(), context.traceparent());
        assert!(TraceContext::parse(&child.traceparent(), None).is_some());
    }

    #[test]
    fn rejects_malformed_traceparents() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        ] {
            assert!(TraceContext::parse(bad, None).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn metadata_round_trips() {
        let context = TraceContext::parse(PARENT, Some("rojo=1")).unwrap();
        let mut metadata = Metadata::new();
        context.inject(&mut metadata);
        assert_eq!(metadata["traceparent"], PARENT);
        assert_eq!(metadata["tracestate"], "rojo=1");
        assert_eq!(TraceContext::from_metadata(&metadata), Some(context));
    }

    #[tokio::test]
    async fn the_current_context_is_the_scoped_one() {
        assert!(current().is_none());
        let context = TraceContext::new_root();
        let inside = scope(context.clone(), async { current() }).await;
        assert_eq!(inside, Some(context));
    }
}
