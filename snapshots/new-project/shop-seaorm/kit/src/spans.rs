//! The spans of one event's way, named and attributed as the OpenTelemetry
//! conventions for HTTP servers and messaging ask: the request (`server`),
//! the dispatch (`create`, the context the envelope carries), the relay's
//! round (`send`, linked to each event it publishes) and each task's run
//! (`process`, a child of the context in the task's headers).
//!
//! They are `tracing` spans: the exporter (see `otlp`) turns them into span
//! data. When nothing is exported, each is the lean span the logs need, or
//! none at all, so that tracing costs nothing it does not show.

use axum::extract::{MatchedPath, Request};
use tracing::Span;
use tracing::field::Empty;

use crate::otlp::exporting;

/// The span of an HTTP request, `<method> <route>` (its matched route);
/// without export, a span that only gives the logs the trace id.
pub(crate) fn http_request(request: &Request) -> Span {
    if !exporting() {
        return tracing::info_span!("trace", trace_id = Empty);
    }
    let method = request.method().as_str();
    let path = request.uri().path();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str);
    let name = match route {
        Some(route) => format!("{method} {route}"),
        None => method.to_string(),
    };
    tracing::info_span!(
        "request",
        otel.name = name,
        otel.kind = "server",
        http.request.method = method,
        url.path = path,
        http.route = route,
        http.response.status_code = Empty,
        otel.status_code = Empty,
        trace_id = Empty,
    )
}

/// Records the response's status on an [`http_request`] span; a server
/// error marks it failed.
pub(crate) fn record_response(span: &Span, status: u16) {
    // As i64: `tracing-opentelemetry` records unsigned values as text.
    span.record("http.response.status_code", i64::from(status));
    if status >= 500 {
        span.record("otel.status_code", "ERROR");
    }
}

/// The `create` span of an event stored in the outbox; none without export.
pub(crate) fn create(event: &str, id: &uuid::Uuid) -> Span {
    if !exporting() {
        return Span::none();
    }
    tracing::info_span!(
        "create",
        otel.name = format!("create {event}"),
        otel.kind = "producer",
        messaging.system = "asynq",
        "messaging.operation.type" = "create",
        messaging.operation.name = "create",
        messaging.message.id = %id,
        outbox.event.name = event,
    )
}

/// The `send` span of one relay round that enqueues `count` tasks on
/// `queues`; without export, a debug span for the logs.
#[cfg(feature = "worker")]
pub(crate) fn send(queues: &[String], count: usize) -> Span {
    if !exporting() {
        return tracing::debug_span!("outbox.enqueue", rows = count);
    }
    let queues = queues.join(",");
    tracing::info_span!(
        "send",
        otel.name = format!("send {queues}"),
        otel.kind = "producer",
        messaging.system = "asynq",
        "messaging.operation.type" = "send",
        messaging.operation.name = "send",
        messaging.destination.name = queues.as_str(),
        messaging.batch.message_count = count as i64,
    )
}

/// The `process` span of one run of a task; without export, the span that
/// gives the logs the task and its trace id.
#[cfg(feature = "worker")]
pub(crate) fn process(id: &str, task_type: &str, queue: &str, retried: i32) -> Span {
    if !exporting() {
        return tracing::info_span!("task", id, task_type, queue, trace_id = Empty);
    }
    tracing::info_span!(
        "task",
        otel.name = format!("process {task_type}"),
        otel.kind = "consumer",
        messaging.system = "asynq",
        "messaging.operation.type" = "process",
        messaging.operation.name = "process",
        messaging.destination.name = queue,
        messaging.message.id = id,
        "asynq.task.type" = task_type,
        asynq.task.retry_count = retried,
        asynq.task.outcome = Empty,
        "error.type" = Empty,
        otel.status_code = Empty,
        otel.status_description = Empty,
        trace_id = Empty,
    )
}

/// Records how a [`process`] run ended: `succeeded`, or the kind of failure
/// (which also marks the span failed, with `error` as its message).
#[cfg(feature = "worker")]
pub(crate) fn record_outcome(span: &Span, outcome: &str, error: Option<&str>) {
    span.record("asynq.task.outcome", outcome);
    if let Some(error) = error {
        span.record("error.type", outcome);
        span.record("otel.status_code", "ERROR");
        span.record("otel.status_description", error);
    }
}
