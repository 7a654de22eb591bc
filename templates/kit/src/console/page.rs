//! What every page of the console has alike: the layout (navigation, the
//! stylesheet and the script, both in the binary), the page for an error,
//! and how times, durations and payloads are shown.

use std::time::Duration;

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use maud::{DOCTYPE, Markup, html};

/// The stylesheet: one file, no framework.
const STYLESHEET: &str = include_str!("assets/console.css");
/// The script of the live parts (the overview's figures and charts).
const SCRIPT: &str = include_str!("assets/console.js");

/// Where a page is, relative to the console's root: its links are
/// relative, so that the console works nested under any path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Depth {
    /// `/`, `/events`, `/failures`, `/queues`, `/schedules`, `/later`.
    Top,
    /// `/events/<id>`.
    Nested,
}

impl Depth {
    /// The console's root, relative to a page at this depth.
    pub(crate) fn root(self) -> &'static str {
        match self {
            Depth::Top => "./",
            Depth::Nested => "../",
        }
    }
}

/// The section of the navigation a page belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Section {
    Overview,
    Events,
    Failures,
    Queues,
    Schedules,
    Later,
}

const SECTIONS: [(Section, &str, &str); 6] = [
    (Section::Overview, "", "Overview"),
    (Section::Events, "events", "Events"),
    (Section::Failures, "failures", "Failures"),
    (Section::Queues, "queues", "Queues"),
    (Section::Schedules, "schedules", "Schedules"),
    (Section::Later, "later", "Later"),
];

/// A whole page: `body` under the navigation, with `title` as its heading.
pub(crate) fn layout(depth: Depth, section: Section, title: &str, body: Markup) -> Markup {
    let root = depth.root();
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · outbox console" }
                link rel="stylesheet" href={ (root) "assets/console.css" };
                script src={ (root) "assets/console.js" } defer {}
            }
            body {
                header {
                    nav aria-label="Sections" {
                        span.brand { "outbox" }
                        @for (each, path, name) in SECTIONS {
                            @if each == section {
                                a href={ (root) (path) } aria-current="page" { (name) }
                            } @else {
                                a href={ (root) (path) } { (name) }
                            }
                        }
                    }
                }
                main {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

/// The page for a store that does not answer (503): it says which (the
/// error names Postgres or Valkey), and the next load of the page tries
/// again, so it recovers by itself once the store is back.
pub(crate) fn unavailable(depth: Depth, section: Section, err: &anyhow::Error) -> Response {
    let body = html! {
        p.error role="alert" { (format!("{err:#}")) }
        p { "Reload the page to try again; it recovers by itself once the cause is gone." }
    };
    (
        StatusCode::SERVICE_UNAVAILABLE,
        layout(depth, section, "Unavailable", body),
    )
        .into_response()
}

/// A page of one message, without the navigation (a refusal).
pub(crate) fn plain(title: &str, message: &str) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head { meta charset="utf-8"; title { (title) } }
            body { h1 { (title) } p { (message) } }
        }
    }
}

pub(crate) async fn stylesheet() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        STYLESHEET,
    )
        .into_response()
}

pub(crate) async fn script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT,
    )
        .into_response()
}

/// A time as people read it, in UTC to the millisecond.
pub(crate) fn time(time: DateTime<Utc>) -> String {
    time.format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string()
}

/// How long from `from` to `to`, as `85 ms`, `3.2 s` or `4 min`.
pub(crate) fn between(from: DateTime<Utc>, to: DateTime<Utc>) -> String {
    duration((to - from).to_std().unwrap_or_default())
}

/// A duration as `85 ms`, `3.2 s`, `4 min` or `2 h`.
pub(crate) fn duration(duration: Duration) -> String {
    let seconds = duration.as_secs_f64();
    if seconds < 1.0 {
        format!("{} ms", duration.as_millis())
    } else if seconds < 60.0 {
        format!("{seconds:.1} s")
    } else if seconds < 3600.0 {
        format!("{} min", (seconds / 60.0).round())
    } else {
        format!("{:.1} h", seconds / 3600.0)
    }
}

/// What a masked field's value is shown as.
pub(crate) const MASK: &str = "***";

/// `value` with the values of the fields named in `masked` replaced by
/// [`MASK`], at any depth.
pub(crate) fn masked(value: &serde_json::Value, masked: &[String]) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .map(|(name, value)| {
                    let shown = if masked.iter().any(|m| m == name) {
                        Value::String(MASK.to_string())
                    } else {
                        self::masked(value, masked)
                    };
                    (name.clone(), shown)
                })
                .collect(),
        ),
        Value::Array(items) => {
            Value::Array(items.iter().map(|v| self::masked(v, masked)).collect())
        }
        other => other.clone(),
    }
}

/// A payload as indented JSON, masked.
pub(crate) fn payload(value: &serde_json::Value, masked_fields: &[String]) -> String {
    serde_json::to_string_pretty(&masked(value, masked_fields)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_fields_are_hidden_at_any_depth() {
        let value = serde_json::json!({
            "email": "a@example.com",
            "order": {"id": 7, "email": "b@example.com"},
            "lines": [{"email": "c@example.com", "sku": "x"}]
        });
        let shown = payload(&value, &["email".to_string()]);
        assert!(!shown.contains("example.com"), "{shown}");
        assert_eq!(shown.matches(MASK).count(), 3, "{shown}");
        assert!(shown.contains("\"sku\": \"x\""), "{shown}");
    }

    #[test]
    fn a_payload_is_escaped_in_the_page() {
        let value = serde_json::json!({"note": "<script>window.marker = 1</script>"});
        let page = html! { pre { (payload(&value, &[])) } }.into_string();
        assert!(!page.contains("<script>"), "{page}");
        assert!(page.contains("&lt;script&gt;"), "{page}");
    }

    #[test]
    fn durations_read_as_people_say_them() {
        assert_eq!(duration(Duration::from_millis(85)), "85 ms");
        assert_eq!(duration(Duration::from_millis(3_240)), "3.2 s");
        assert_eq!(duration(Duration::from_secs(240)), "4 min");
        assert_eq!(duration(Duration::from_secs(7_200)), "2.0 h");
    }
}
