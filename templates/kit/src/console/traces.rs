//! The trace page, under `gpkit dev`: one trace's spans as a waterfall,
//! from the request through the event's `create` to each listener's
//! `process`. `gpkit dev` receives the spans its processes export and keeps
//! them for an hour as JSON lines, one span a line, in a directory it names
//! in `OUTBOX_CONSOLE_TRACES` ([`super::Console::traces_from`]). A span of
//! another trace that links to one of this trace's spans (the relay's
//! `send`, in the relay round's own trace, links to the event's `create`)
//! is drawn under the span it links to, marked as reached through a link.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::html;
use serde::Deserialize;

use super::State as Console;
use super::page::{self, Depth, Section};

/// One span, as `gpkit dev` keeps it.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Span {
    #[serde(default)]
    service: String,
    trace_id: String,
    span_id: String,
    #[serde(default)]
    parent_span_id: String,
    name: String,
    #[serde(default)]
    kind: String,
    start_unix_nanos: u64,
    end_unix_nanos: u64,
    #[serde(default)]
    status: String,
    #[serde(default)]
    status_message: String,
    #[serde(default)]
    links: Vec<Link>,
}

#[derive(Debug, Clone, Deserialize)]
struct Link {
    trace_id: String,
    span_id: String,
}

/// A span in the waterfall: how deep it sits, and whether it hangs under
/// its place through a link rather than as a child.
#[derive(Debug)]
pub(crate) struct Row {
    span: Span,
    depth: usize,
    linked: bool,
}

/// Whether `id` is a trace id as OTLP writes it: 32 lowercase hex digits.
fn is_trace_id(id: &str) -> bool {
    id.len() == 32
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The spans of `trace_id` in the files of `dir`, and those of other
/// traces that link to one of them. Lines that do not parse (a file being
/// written) are skipped.
pub(crate) fn read(dir: &Path, trace_id: &str) -> std::io::Result<Vec<Span>> {
    let mut spans = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_none_or(|ext| ext != "jsonl") {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        spans.extend(
            text.lines()
                .filter(|line| line.contains(trace_id))
                .filter_map(|line| serde_json::from_str::<Span>(line).ok())
                .filter(|span| {
                    span.trace_id == trace_id
                        || span.links.iter().any(|link| link.trace_id == trace_id)
                }),
        );
    }
    Ok(spans)
}

/// The waterfall's rows: each span after the span it hangs under (its
/// parent, or the span it links to), siblings by start time; a span whose
/// parent was not received starts a tree of its own.
pub(crate) fn rows(spans: Vec<Span>, trace_id: &str) -> Vec<Row> {
    let ids: std::collections::HashSet<String> = spans
        .iter()
        .filter(|span| span.trace_id == trace_id)
        .map(|span| span.span_id.clone())
        .collect();
    // Where each span hangs: (the span it hangs under, through a link).
    let place = |span: &Span| -> Option<(String, bool)> {
        if span.trace_id == trace_id {
            (!span.parent_span_id.is_empty() && ids.contains(&span.parent_span_id))
                .then(|| (span.parent_span_id.clone(), false))
        } else {
            span.links
                .iter()
                .find(|link| link.trace_id == trace_id && ids.contains(&link.span_id))
                .map(|link| (link.span_id.clone(), true))
        }
    };
    let mut children: BTreeMap<Option<String>, Vec<(Span, bool)>> = BTreeMap::new();
    for span in spans {
        match place(&span) {
            Some((under, linked)) => children
                .entry(Some(under))
                .or_default()
                .push((span, linked)),
            None => children.entry(None).or_default().push((span, false)),
        }
    }
    for list in children.values_mut() {
        list.sort_by_key(|(span, _)| (span.start_unix_nanos, span.span_id.clone()));
    }
    let mut rows = Vec::new();
    let mut stack: Vec<(Span, bool, usize)> = children
        .remove(&None)
        .unwrap_or_default()
        .into_iter()
        .rev()
        .map(|(span, linked)| (span, linked, 0))
        .collect();
    while let Some((span, linked, depth)) = stack.pop() {
        if let Some(under) = children.remove(&Some(span.span_id.clone())) {
            stack.extend(
                under
                    .into_iter()
                    .rev()
                    .map(|(child, linked)| (child, linked, depth + 1)),
            );
        }
        rows.push(Row {
            span,
            depth,
            linked,
        });
    }
    rows
}

/// `GET /traces/<trace id>`.
pub(crate) async fn page(
    State(console): State<Arc<Console>>,
    UrlPath(id): UrlPath<String>,
) -> Response {
    let refuse = |status: StatusCode, message: String| {
        let body = html! { p.error role="alert" { (message) } };
        (
            status,
            page::layout(Depth::Nested, Section::Events, "Trace", body),
        )
            .into_response()
    };
    let Some(dir) = console.options.traces.clone() else {
        return refuse(
            StatusCode::NOT_FOUND,
            "Traces are drawn here under `gpkit dev`, which keeps them; elsewhere the event's \
             page links to your tracing backend (OUTBOX_CONSOLE_TRACE_URL)."
                .into(),
        );
    };
    if !is_trace_id(&id) {
        return refuse(
            StatusCode::BAD_REQUEST,
            format!("{id:?} is not a trace id: 32 hex digits, as an event's page shows it."),
        );
    }
    let wanted = id.clone();
    let read_dir = dir.clone();
    let spans = match tokio::task::spawn_blocking(move || read(&read_dir, &wanted)).await {
        Ok(Ok(spans)) => spans,
        Ok(Err(err)) => {
            return refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("cannot read the traces in {}: {err}", dir.display()),
            );
        }
        Err(err) => return refuse(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()),
    };
    if !spans.iter().any(|span| span.trace_id == id) {
        return refuse(
            StatusCode::NOT_FOUND,
            format!(
                "No span of trace {id} in {}: spans arrive about a second after they end, and \
                 are kept for an hour.",
                dir.display()
            ),
        );
    }
    let rows = rows(spans, &id);
    let start = rows
        .iter()
        .map(|row| row.span.start_unix_nanos)
        .min()
        .unwrap_or(0);
    let end = rows
        .iter()
        .map(|row| row.span.end_unix_nanos)
        .max()
        .unwrap_or(start);
    let total = (end.saturating_sub(start)).max(1) as f64;
    let percent = |nanos: u64| 100.0 * nanos as f64 / total;
    let millis = |nanos: u64| format!("{:.1} ms", nanos as f64 / 1e6);
    let body = html! {
        p {
            code { (id) } ": " (rows.len()) " spans over " (millis(end - start)) ", from "
            (page::time(chrono::DateTime::from_timestamp_nanos(start as i64))) "."
        }
        table.waterfall {
            thead { tr { th { "span" } th { "service" } th { "starts" } th { "takes" } th.bar-column { "timeline" } } }
            tbody {
                @for row in &rows {
                    @let span = &row.span;
                    @let offset = span.start_unix_nanos.saturating_sub(start);
                    @let took = span.end_unix_nanos.saturating_sub(span.start_unix_nanos);
                    @let failed = span.status == "STATUS_CODE_ERROR";
                    tr data-span=(span.name) class=[failed.then_some("failed")] {
                        td style={ "padding-left:" (0.6 + 1.2 * row.depth as f64) "rem" } {
                            @if row.linked { span.link title="in another trace, linked to the span above" { "↪ " } }
                            (span.name)
                            @if !span.kind.is_empty() { " " span.kind { (span.kind.trim_start_matches("SPAN_KIND_").to_lowercase()) } }
                            @if failed && !span.status_message.is_empty() { br; code.error { (span.status_message) } }
                        }
                        td { (span.service) }
                        td { "+" (millis(offset)) }
                        td { (millis(took)) }
                        td.bar-column {
                            span.bar style={ "margin-left:" (format!("{:.2}", percent(offset))) "%;width:" (format!("{:.2}", percent(took).max(0.4))) "%" } {}
                        }
                    }
                }
            }
        }
    };
    page::layout(Depth::Nested, Section::Events, "Trace", body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = "c41583b15e88c5c0fcaa80a2f87824ba";

    fn span(trace: &str, id: &str, parent: &str, name: &str, start: u64, links: &[&str]) -> Span {
        Span {
            service: "test".into(),
            trace_id: trace.into(),
            span_id: id.into(),
            parent_span_id: parent.into(),
            name: name.into(),
            kind: String::new(),
            start_unix_nanos: start,
            end_unix_nanos: start + 10,
            status: String::new(),
            status_message: String::new(),
            links: links
                .iter()
                .map(|id| Link {
                    trace_id: TRACE.into(),
                    span_id: (*id).into(),
                })
                .collect(),
        }
    }

    #[test]
    fn spans_hang_under_their_parent_or_the_span_they_link_to() {
        let other = "ac8bdf5b8dcdcf000000000000000000";
        let spans = vec![
            span(TRACE, "listener-b", "create", "process listener b", 40, &[]),
            span(TRACE, "create", "post", "create orderPlaced", 10, &[]),
            span(other, "send", "", "send default", 20, &["create"]),
            span(TRACE, "post", "", "POST /orders", 0, &[]),
            span(TRACE, "listener-a", "create", "process listener a", 30, &[]),
            span(TRACE, "run-a", "listener-a", "listener", 31, &[]),
            span(TRACE, "orphan", "never-received", "late", 50, &[]),
        ];
        let rows: Vec<(String, usize, bool)> = rows(spans, TRACE)
            .into_iter()
            .map(|row| (row.span.name, row.depth, row.linked))
            .collect();
        let expect = |name: &str, depth, linked| (name.to_string(), depth, linked);
        assert_eq!(
            rows,
            [
                expect("POST /orders", 0, false),
                expect("create orderPlaced", 1, false),
                expect("send default", 2, true),
                expect("process listener a", 2, false),
                expect("listener", 3, false),
                expect("process listener b", 2, false),
                expect("late", 0, false),
            ]
        );
    }

    #[test]
    fn only_the_trace_and_what_links_to_it_is_read() {
        let dir = std::env::temp_dir().join(format!("kit-traces-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir(&dir).unwrap();
        let line = |span: serde_json::Value| format!("{span}\n");
        let mine = serde_json::json!({"trace_id": TRACE, "span_id": "a", "name": "mine",
            "start_unix_nanos": 1, "end_unix_nanos": 2});
        let linked = serde_json::json!({"trace_id": "ff".repeat(16), "span_id": "b", "name": "send",
            "start_unix_nanos": 1, "end_unix_nanos": 2, "links": [{"trace_id": TRACE, "span_id": "a"}]});
        let unrelated = serde_json::json!({"trace_id": "ee".repeat(16), "span_id": "c", "name": "other",
            "start_unix_nanos": 1, "end_unix_nanos": 2});
        std::fs::write(
            dir.join("1800000000.jsonl"),
            line(mine) + &line(unrelated) + "{\"trace_id\": \"" + TRACE + "\", cut short",
        )
        .unwrap();
        std::fs::write(dir.join("1800000600.jsonl"), line(linked)).unwrap();
        std::fs::write(dir.join("notes.txt"), TRACE).unwrap();
        let mut names: Vec<String> = read(&dir, TRACE)
            .unwrap()
            .into_iter()
            .map(|span| span.name)
            .collect();
        names.sort();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(names, ["mine", "send"]);
    }

    #[test]
    fn a_trace_id_is_32_lowercase_hex_digits() {
        assert!(is_trace_id(TRACE));
        for bad in [
            "",
            "c41583b1",
            &TRACE.to_uppercase(),
            &format!("{TRACE}0"),
            "../../etc/passwd",
        ] {
            assert!(!is_trace_id(bad), "{bad}");
        }
    }
}
