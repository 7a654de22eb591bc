//! Replaying the events that match a filter, from the failures page, as
//! `outbox replay --name <event> --since <time> [--until] [--listener]`
//! does, through the same `crate::replay`: the published events of that
//! name created in the window are delivered again under new task ids, to every
//! listener or to one. A page first says how many events and tasks it
//! would queue, with the window fixed (an open end becomes the time of
//! that page), then its button replays exactly those.

use std::sync::Arc;

use axum::Form;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use chrono::{DateTime, SecondsFormat, Utc};
use maud::{Markup, html};
use serde::Deserialize;

use super::State as Console;
use super::guard::{self, CSRF_FIELD};
use super::page::{self, Depth, Section};
use crate::follow::time;
use crate::replay::{self, ByName};

/// The filter, as the failures page's form (a query string) and the
/// confirmation's form carry it.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Filter {
    #[serde(default)]
    csrf: Option<String>,
    #[serde(default)]
    name: String,
    /// `2h` (that long ago) or a time.
    #[serde(default)]
    since: String,
    /// Created before; now when empty.
    #[serde(default)]
    until: String,
    /// One listener only, when given.
    #[serde(default)]
    listener: String,
}

impl Filter {
    /// What it asks for, its open end closed at `now`; or what to fix.
    fn chosen(&self, now: DateTime<Utc>) -> Result<ByName, String> {
        let name = self.name.trim();
        if name.is_empty() {
            return Err("Give the name of the events to replay, such as orderPlaced.".into());
        }
        let since = time::parse_time(self.since.trim())
            .map_err(|err| format!("`since`: {err}; such as 2h, or 2026-11-30T08:00:00Z"))?;
        let until = match self.until.trim() {
            "" => now,
            until => time::parse_time(until)
                .map_err(|err| format!("`until`: {err}; such as 1h, or 2026-11-30T09:00:00Z"))?,
        };
        if until <= since {
            return Err(format!(
                "`until` ({}) is not after `since` ({}): nothing would match.",
                rfc3339(until),
                rfc3339(since)
            ));
        }
        let listener = Some(self.listener.trim().to_string()).filter(|l| !l.is_empty());
        Ok(ByName {
            name: name.to_string(),
            since,
            until: Some(until),
            listener,
        })
    }
}

fn rfc3339(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// The form on the failures page: the filter to count and then replay.
pub(crate) fn form() -> Markup {
    html! {
        form.search method="get" action="failures/replay" {
            label { "Event name" input name="name" required placeholder="orderPlaced"; }
            label { "Created since" input name="since" required placeholder="2h or 2026-11-30T08:00:00Z"; }
            label { "Created before" input name="until" placeholder="now"; }
            label { "Listener (all when empty)" input name="listener"; }
            button type="submit" { "Count them" }
        }
    }
}

/// A refusal that says what to fix, on a page of its own.
fn refused(status: StatusCode, message: &str) -> Response {
    let body = html! {
        p.error role="alert" { (message) }
        p { a href="../failures" { "Back to the failures" } }
    };
    (
        status,
        page::layout(Depth::Nested, Section::Failures, "Replay events", body),
    )
        .into_response()
}

/// `GET failures/replay?name=&since=&until=&listener=`: how many events
/// and tasks the replay would queue, and the button that does it.
pub(crate) async fn confirm(
    State(console): State<Arc<Console>>,
    Query(filter): Query<Filter>,
) -> Response {
    let chosen = match filter.chosen(Utc::now()) {
        Ok(chosen) => chosen,
        Err(message) => return refused(StatusCode::BAD_REQUEST, &message),
    };
    let planned = match replay::plan_by_name(&console.context, &chosen).await {
        Ok(planned) => planned,
        Err(err) if err.downcast_ref::<sqlx::Error>().is_some() => {
            let err = anyhow::anyhow!("Postgres: {err}");
            return page::unavailable(Depth::Nested, Section::Failures, &err);
        }
        Err(err) => return refused(StatusCode::BAD_REQUEST, &format!("{err:#}")),
    };
    let until = chosen.until.unwrap_or_else(Utc::now);
    let target = chosen
        .listener
        .as_ref()
        .map_or_else(String::new, |l| format!(" to listener {l} only"));
    let body = html! {
        p {
            "Replay " strong data-count=(planned.events) { (planned.events) } " published event(s) named "
            code { (chosen.name) } " created from " (page::time(chosen.since)) " to " (page::time(until))
            (target) ": " (planned.tasks.len()) " task(s) through queue(s) " code { (planned.queues.join(",")) } "?"
        }
        p { "Each runs again under a new task id; a listener's inbox skips the work it already did once (ctx.once)." }
        @if console.options.read_only {
            p { "This console is read-only." }
        } @else if planned.events == 0 {
            p { "Nothing to replay. " a href="../failures" { "Back to the failures" } }
        } @else {
            form method="post" action="replay" {
                input type="hidden" name=(CSRF_FIELD) value=(console.csrf);
                input type="hidden" name="name" value=(chosen.name);
                input type="hidden" name="since" value=(rfc3339(chosen.since));
                input type="hidden" name="until" value=(rfc3339(until));
                input type="hidden" name="listener" value=(chosen.listener.clone().unwrap_or_default());
                button type="submit" { "Replay " (planned.events) " event(s)" }
                " "
                a href="../failures" { "Cancel" }
            }
        }
    };
    page::layout(Depth::Nested, Section::Failures, "Replay events", body).into_response()
}

/// `POST failures/replay`: replays the events the confirmation counted,
/// logs what it queued, and goes back to the failures page.
pub(crate) async fn replay(
    State(console): State<Arc<Console>>,
    Form(filter): Form<Filter>,
) -> Response {
    if !guard::csrf_ok(&console, filter.csrf.as_deref()) {
        return guard::csrf_refused();
    }
    let chosen = match filter.chosen(Utc::now()) {
        Ok(chosen) => chosen,
        Err(message) => return refused(StatusCode::BAD_REQUEST, &message),
    };
    let context = &console.context;
    let replayed = async {
        let planned = replay::plan_by_name(context, &chosen).await?;
        let replayed = replay::enqueue(context, &planned.tasks).await?;
        anyhow::Ok((planned.events, replayed.len()))
    };
    match replayed.await {
        Ok((events, tasks)) => {
            tracing::info!(
                action = "replay",
                name = chosen.name,
                since = %chosen.since,
                until = ?chosen.until,
                listener = ?chosen.listener,
                events,
                tasks,
                "console: replay the events matching a filter"
            );
            Redirect::to(&format!("../failures?replayed={events}")).into_response()
        }
        Err(err) => page::unavailable(Depth::Nested, Section::Failures, &err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(name: &str, since: &str, until: &str) -> Filter {
        Filter {
            name: name.into(),
            since: since.into(),
            until: until.into(),
            ..Filter::default()
        }
    }

    #[test]
    fn an_open_end_is_closed_at_the_confirmation() {
        let now = Utc::now();
        let chosen = filter("orderPlaced", "2h", "").chosen(now).unwrap();
        assert_eq!(chosen.until, Some(now));
        assert!(chosen.since < now);
        assert_eq!(chosen.listener, None);
    }

    #[test]
    fn a_bad_filter_says_what_to_fix() {
        let now = Utc::now();
        let err = filter("", "2h", "").chosen(now).unwrap_err();
        assert!(err.contains("Give the name"), "{err}");
        let err = filter("orderPlaced", "yesterday-ish", "")
            .chosen(now)
            .unwrap_err();
        assert!(err.contains("`since`"), "{err}");
        let err = filter("orderPlaced", "1h", "2h").chosen(now).unwrap_err();
        assert!(err.contains("is not after"), "{err}");
    }
}
