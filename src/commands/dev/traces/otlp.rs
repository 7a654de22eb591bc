//! The part of OTLP's trace messages that `gpkit dev` keeps, decoded with
//! prost from the protocol's field numbers
//! (`opentelemetry/proto/trace/v1/trace.proto`, `common/v1/common.proto`,
//! `resource/v1/resource.proto`): a request body is a `TracesData`, which
//! the protocol defines to be wire-compatible with
//! `ExportTraceServiceRequest`. Fields left out here are skipped on decode,
//! as protobuf skips any unknown field.
//!
//! [`records`] turns a body into one JSON object per span, the lines the
//! tests' OTLP receiver (`tests/interop/go/cmd/otlpsink`, the official Go
//! definitions) writes for the same body.

use serde_json::{Map, Value, json};

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct TracesData {
    #[prost(message, repeated, tag = "1")]
    pub(crate) resource_spans: Vec<ResourceSpans>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ResourceSpans {
    #[prost(message, optional, tag = "1")]
    pub(crate) resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    pub(crate) scope_spans: Vec<ScopeSpans>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Resource {
    #[prost(message, repeated, tag = "1")]
    pub(crate) attributes: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ScopeSpans {
    #[prost(message, optional, tag = "1")]
    pub(crate) scope: Option<InstrumentationScope>,
    #[prost(message, repeated, tag = "2")]
    pub(crate) spans: Vec<Span>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct InstrumentationScope {
    #[prost(string, tag = "1")]
    pub(crate) name: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Span {
    #[prost(bytes = "vec", tag = "1")]
    pub(crate) trace_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub(crate) span_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "4")]
    pub(crate) parent_span_id: Vec<u8>,
    #[prost(string, tag = "5")]
    pub(crate) name: String,
    #[prost(int32, tag = "6")]
    pub(crate) kind: i32,
    #[prost(fixed64, tag = "7")]
    pub(crate) start_time_unix_nano: u64,
    #[prost(fixed64, tag = "8")]
    pub(crate) end_time_unix_nano: u64,
    #[prost(message, repeated, tag = "9")]
    pub(crate) attributes: Vec<KeyValue>,
    #[prost(message, repeated, tag = "11")]
    pub(crate) events: Vec<SpanEvent>,
    #[prost(message, repeated, tag = "13")]
    pub(crate) links: Vec<Link>,
    #[prost(message, optional, tag = "15")]
    pub(crate) status: Option<Status>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct SpanEvent {
    #[prost(string, tag = "2")]
    pub(crate) name: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Link {
    #[prost(bytes = "vec", tag = "1")]
    pub(crate) trace_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub(crate) span_id: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Status {
    #[prost(string, tag = "2")]
    pub(crate) message: String,
    #[prost(int32, tag = "3")]
    pub(crate) code: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct KeyValue {
    #[prost(string, tag = "1")]
    pub(crate) key: String,
    #[prost(message, optional, tag = "2")]
    pub(crate) value: Option<AnyValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct AnyValue {
    #[prost(oneof = "any_value::Value", tags = "1, 2, 3, 4")]
    pub(crate) value: Option<any_value::Value>,
}

pub(crate) mod any_value {
    /// The scalar values a span's attributes carry (arrays, maps and
    /// bytes are skipped).
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub(crate) enum Value {
        #[prost(string, tag = "1")]
        String(String),
        #[prost(bool, tag = "2")]
        Bool(bool),
        #[prost(int64, tag = "3")]
        Int(i64),
        #[prost(double, tag = "4")]
        Double(f64),
    }
}

/// The name protobuf gives a `SpanKind`.
fn kind_name(kind: i32) -> String {
    match kind {
        0 => "SPAN_KIND_UNSPECIFIED".into(),
        1 => "SPAN_KIND_INTERNAL".into(),
        2 => "SPAN_KIND_SERVER".into(),
        3 => "SPAN_KIND_CLIENT".into(),
        4 => "SPAN_KIND_PRODUCER".into(),
        5 => "SPAN_KIND_CONSUMER".into(),
        other => other.to_string(),
    }
}

/// The name protobuf gives a `Status.StatusCode`.
fn status_name(code: i32) -> String {
    match code {
        0 => "STATUS_CODE_UNSET".into(),
        1 => "STATUS_CODE_OK".into(),
        2 => "STATUS_CODE_ERROR".into(),
        other => other.to_string(),
    }
}

fn attributes(pairs: &[KeyValue]) -> Map<String, Value> {
    pairs
        .iter()
        .map(|pair| {
            let value = match pair.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(any_value::Value::String(text)) => json!(text),
                Some(any_value::Value::Bool(flag)) => json!(flag),
                Some(any_value::Value::Int(number)) => json!(number),
                Some(any_value::Value::Double(number)) => json!(number),
                None => Value::String(String::new()),
            };
            (pair.key.clone(), value)
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Every span of the request `body` as a JSON object, in the order of the
/// request.
pub(crate) fn records(body: &[u8]) -> Result<Vec<Value>, prost::DecodeError> {
    let data: TracesData = prost::Message::decode(body)?;
    let mut records = Vec::new();
    for resource_spans in &data.resource_spans {
        let resource = resource_spans
            .resource
            .as_ref()
            .map(|resource| attributes(&resource.attributes))
            .unwrap_or_default();
        let service = resource
            .get("service.name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        for scope_spans in &resource_spans.scope_spans {
            let scope = scope_spans
                .scope
                .as_ref()
                .map_or("", |scope| scope.name.as_str());
            for span in &scope_spans.spans {
                let status = span.status.clone().unwrap_or_default();
                records.push(json!({
                    "service": service,
                    "scope": scope,
                    "trace_id": hex(&span.trace_id),
                    "span_id": hex(&span.span_id),
                    "parent_span_id": hex(&span.parent_span_id),
                    "name": span.name,
                    "kind": kind_name(span.kind),
                    "start_unix_nanos": span.start_time_unix_nano,
                    "end_unix_nanos": span.end_time_unix_nano,
                    "attributes": attributes(&span.attributes),
                    "links": span.links.iter().map(|link| json!({
                        "trace_id": hex(&link.trace_id),
                        "span_id": hex(&link.span_id),
                    })).collect::<Vec<_>>(),
                    "status": status_name(status.code),
                    "status_message": status.message,
                    "events": span.events.iter().map(|event| event.name.clone()).collect::<Vec<_>>(),
                }));
            }
        }
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four exports recorded from a generated service's server and worker
    /// (a POST, its event and two listeners, one failing once), beside the
    /// lines the tests' OTLP receiver wrote for each from the official Go
    /// definitions (`tests/fixtures/otlp/README.md`).
    const EXPORTS: [(&[u8], &str); 4] = [
        (
            include_bytes!("../../../../tests/fixtures/otlp/export-0.bin"),
            include_str!("../../../../tests/fixtures/otlp/export-0.jsonl"),
        ),
        (
            include_bytes!("../../../../tests/fixtures/otlp/export-1.bin"),
            include_str!("../../../../tests/fixtures/otlp/export-1.jsonl"),
        ),
        (
            include_bytes!("../../../../tests/fixtures/otlp/export-2.bin"),
            include_str!("../../../../tests/fixtures/otlp/export-2.jsonl"),
        ),
        (
            include_bytes!("../../../../tests/fixtures/otlp/export-3.bin"),
            include_str!("../../../../tests/fixtures/otlp/export-3.jsonl"),
        ),
    ];

    #[test]
    fn each_span_decodes_as_the_official_definitions_decode_it() {
        let mut kinds = std::collections::BTreeSet::new();
        for (body, lines) in EXPORTS {
            let expected: Vec<Value> = lines
                .lines()
                .map(|line| serde_json::from_str(line).unwrap())
                .collect();
            let decoded = records(body).unwrap();
            assert_eq!(decoded, expected);
            for span in &decoded {
                kinds.insert(span["kind"].as_str().unwrap().to_string());
                kinds.insert(span["status"].as_str().unwrap().to_string());
                if !span["links"].as_array().unwrap().is_empty() {
                    kinds.insert("a link".to_string());
                }
            }
        }
        // What the recordings cover.
        for seen in [
            "SPAN_KIND_SERVER",
            "SPAN_KIND_PRODUCER",
            "SPAN_KIND_CONSUMER",
            "SPAN_KIND_INTERNAL",
            "STATUS_CODE_ERROR",
            "a link",
        ] {
            assert!(kinds.contains(seen), "no span with {seen}");
        }
    }

    #[test]
    fn a_body_that_is_not_protobuf_is_an_error() {
        assert!(records(b"\xff\xff\xff\xff not protobuf").is_err());
    }
}
