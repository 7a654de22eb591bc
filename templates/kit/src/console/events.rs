//! The events pages: a search (by event id, name and creation time, or by
//! a payload field within a time range), newest first, fifty to a page
//! and paged by the row's id (keyset: the next page starts below the last
//! row shown, however many rows there are); and one event's page, with
//! its times, envelope, task in the queue and each listener's task and
//! inbox record, and for an ordered listener's run that waits for the
//! earlier runs of its key, how many and the first of them.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, TimeDelta, Utc};
use maud::{Markup, html};
use serde::Deserialize;
use sqlx::{Postgres, QueryBuilder};
use uuid::Uuid;

use super::State as Console;
use super::page::{self, Depth, Section};
use crate::follow::{tasks, time};
use crate::queue::TaskInfo;
use crate::worker::ordering::Standing;

/// Events on a page.
const PAGE: i64 = 50;

/// The search form's fields, as the query string carries them.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Search {
    #[serde(default)]
    id: String,
    #[serde(default)]
    name: String,
    /// Created at or after: `2h` (that long ago) or a time.
    #[serde(default)]
    from: String,
    /// Created before.
    #[serde(default)]
    to: String,
    /// A payload field, `customer.id` for a nested one.
    #[serde(default)]
    field: String,
    #[serde(default)]
    value: String,
    /// The page starts below this row id.
    #[serde(default)]
    before: Option<i64>,
}

/// A search, checked: what the query asks for.
#[derive(Debug, PartialEq)]
struct Filter {
    id: Option<Uuid>,
    name: Option<String>,
    from: Option<DateTime<Utc>>,
    to: Option<DateTime<Utc>>,
    field: Option<(Vec<String>, String)>,
    before: Option<i64>,
}

/// Checks the form: a message that names the field and the fix when it
/// cannot be searched.
fn filter(search: &Search) -> Result<Filter, String> {
    let text = |s: &str| Some(s.trim().to_string()).filter(|s| !s.is_empty());
    let id = text(&search.id)
        .map(|id| {
            Uuid::parse_str(&id)
                .map_err(|_| format!("`{id}` is not an event id: expected a UUID such as 0193a5c2-5b6e-7d1f-9a2b-3c4d5e6f7a8b"))
        })
        .transpose()?;
    let from = text(&search.from)
        .map(|t| time::parse_time(&t))
        .transpose()?;
    let to = text(&search.to).map(|t| time::parse_time(&t)).transpose()?;
    if let (Some(from), Some(to)) = (from, to)
        && from >= to
    {
        return Err("`from` is not before `to`: give a range that is not empty".into());
    }
    let field = match (text(&search.field), text(&search.value)) {
        (None, None) => None,
        (Some(_), None) => return Err("a payload field needs a value to look for".into()),
        (None, Some(_)) => return Err("a value needs the payload field to look in".into()),
        (Some(field), Some(value)) => {
            if from.is_none() {
                return Err(
                    "a payload search reads every event of its time range: give `from` \
                     (such as 1h) to bound it"
                        .into(),
                );
            }
            let path: Vec<String> = field.split('.').map(str::to_string).collect();
            if path.iter().any(String::is_empty) {
                return Err(format!(
                    "`{field}` is not a payload field: use names joined by dots, such as customer.id"
                ));
            }
            Some((path, value))
        }
    };
    Ok(Filter {
        id,
        name: text(&search.name),
        from,
        to,
        field,
        before: search.before,
    })
}

/// One row of the list.
struct Listed {
    row: i64,
    id: Uuid,
    name: String,
    created_at: DateTime<Utc>,
    published_at: Option<DateTime<Utc>>,
}

/// A row of the list as the query returns it.
type ListedRow = (i64, Uuid, String, DateTime<Utc>, Option<DateTime<Utc>>);

/// The page of events `filter` finds, and whether there are more.
async fn find(console: &Console, filter: &Filter) -> Result<(Vec<Listed>, bool), sqlx::Error> {
    let mut query: QueryBuilder<Postgres> = QueryBuilder::new(
        "SELECT id, event_id, event_name, created_at, published_at FROM outbox_events WHERE true",
    );
    if let Some(id) = filter.id {
        query.push(" AND event_id = ").push_bind(id);
    }
    if let Some(name) = &filter.name {
        query.push(" AND event_name = ").push_bind(name.clone());
    }
    if let Some(from) = filter.from {
        query.push(" AND created_at >= ").push_bind(from);
    }
    if let Some(to) = filter.to {
        query.push(" AND created_at < ").push_bind(to);
    }
    if let Some((path, value)) = &filter.field {
        query
            .push(" AND payload #>> ")
            .push_bind(path.clone())
            .push(" = ")
            .push_bind(value.clone());
    }
    if let Some(before) = filter.before {
        query.push(" AND id < ").push_bind(before);
    }
    // Newest first. Rows are inserted in creation order, which the planner
    // does not know: for a closed window of a day or less it may walk the
    // primary key from the newest row down to a window far back. Ordering
    // by an expression of the id (the same order) leaves it the creation
    // time's BRIN index and a sort of the window's rows instead.
    let narrow = matches!((filter.from, filter.to), (Some(from), Some(to)) if to - from <= TimeDelta::days(1));
    query.push(if narrow {
        " ORDER BY id + 0 DESC LIMIT "
    } else {
        " ORDER BY id DESC LIMIT "
    });
    query.push_bind(PAGE + 1);
    let rows: Vec<ListedRow> = query
        .build_query_as()
        .fetch_all(&console.context.pool)
        .await?;
    let more = rows.len() as i64 > PAGE;
    let listed = rows
        .into_iter()
        .take(PAGE as usize)
        .map(|(row, id, name, created_at, published_at)| Listed {
            row,
            id,
            name,
            created_at,
            published_at,
        })
        .collect();
    Ok((listed, more))
}

/// The search form, filled with what was asked.
fn form(search: &Search) -> Markup {
    html! {
        form.search method="get" action="events" role="search" {
            label { "Event id" input type="search" name="id" value=(search.id) placeholder="UUID"; }
            label { "Name" input type="text" name="name" value=(search.name) placeholder="orderPlaced"; }
            label { "From" input type="text" name="from" value=(search.from) placeholder="1h or 2026-12-01T08:00:00Z"; }
            label { "To" input type="text" name="to" value=(search.to) placeholder="now"; }
            label { "Payload field" input type="text" name="field" value=(search.field) placeholder="customer.id"; }
            label { "equals" input type="text" name="value" value=(search.value); }
            button type="submit" { "Search" }
        }
    }
}

/// The query string of the next page: the same search, below `row`.
fn next_page(search: &Search, row: i64) -> String {
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    for (name, value) in [
        ("id", &search.id),
        ("name", &search.name),
        ("from", &search.from),
        ("to", &search.to),
        ("field", &search.field),
        ("value", &search.value),
    ] {
        if !value.trim().is_empty() {
            query.append_pair(name, value);
        }
    }
    query.append_pair("before", &row.to_string());
    format!("events?{}", query.finish())
}

/// `GET events`: the search and its results.
pub(crate) async fn list(
    State(console): State<Arc<Console>>,
    Query(search): Query<Search>,
) -> Response {
    let filter = match filter(&search) {
        Ok(filter) => filter,
        Err(message) => {
            let body = html! {
                (form(&search))
                p.error role="alert" { (message) }
            };
            return (
                StatusCode::BAD_REQUEST,
                page::layout(Depth::Top, Section::Events, "Events", body),
            )
                .into_response();
        }
    };
    let (events, more) = match find(&console, &filter).await {
        Ok(found) => found,
        Err(err) => {
            let err = anyhow::anyhow!("Postgres: {err}");
            return page::unavailable(Depth::Top, Section::Events, &err);
        }
    };
    let body = html! {
        (form(&search))
        @if events.is_empty() {
            p { "No event matches." }
        } @else {
            table.events {
                thead { tr { th { "created" } th { "name" } th { "event id" } th { "published" } } }
                tbody {
                    @for event in &events {
                        tr {
                            td { (page::time(event.created_at)) }
                            td { (event.name) }
                            td { a href={ "events/" (event.id) } { code { (event.id) } } }
                            td {
                                @match event.published_at {
                                    Some(at) => { "after " (page::between(event.created_at, at)) }
                                    None => span.pending { "not yet" },
                                }
                            }
                        }
                    }
                }
            }
            @if more {
                @if let Some(last) = events.last() {
                    p { a rel="next" href=(next_page(&search, last.row)) { "Older events" } }
                }
            }
        }
    };
    page::layout(Depth::Top, Section::Events, "Events", body).into_response()
}

/// The inbox records of an event: which listeners recorded it, and when.
async fn inbox(console: &Console, id: Uuid) -> Result<Vec<(String, DateTime<Utc>)>, sqlx::Error> {
    sqlx::query_as("SELECT listener, processed_at FROM inbox_processed WHERE event_id = $1")
        .bind(id)
        .fetch_all(&console.context.pool)
        .await
}

/// `GET events/<id>`: one event, from its commit to every listener.
pub(crate) async fn one(
    State(console): State<Arc<Console>>,
    Path(id): Path<String>,
    Query(done): Query<super::cancelled::Done>,
) -> Response {
    let nested = |status, message: String| {
        let body = html! {
            p.error role="alert" { (message) }
            p { a href="../events" { "Search the events" } }
        };
        (
            status,
            page::layout(Depth::Nested, Section::Events, "Event", body),
        )
            .into_response()
    };
    let Ok(id) = Uuid::parse_str(&id) else {
        return nested(
            StatusCode::BAD_REQUEST,
            format!("`{id}` is not an event id: expected a UUID"),
        );
    };
    let context = &console.context;
    let event = match context.event(id).await {
        Ok(event) => event,
        Err(err) if err.downcast_ref::<sqlx::Error>().is_some() => {
            let err = anyhow::anyhow!("Postgres: {err}");
            return page::unavailable(Depth::Nested, Section::Events, &err);
        }
        Err(err) => return nested(StatusCode::NOT_FOUND, format!("{err:#}")),
    };
    let records = match inbox(&console, id).await {
        Ok(records) => records,
        Err(err) => {
            let err = anyhow::anyhow!("Postgres: {err}");
            return page::unavailable(Depth::Nested, Section::Events, &err);
        }
    };
    let cancelled = match super::cancelled::of_event(&console, id).await {
        Ok(cancelled) => cancelled,
        Err(err) => {
            let err = anyhow::anyhow!("Postgres: {err}");
            return page::unavailable(Depth::Nested, Section::Events, &err);
        }
    };
    let (queued, ordered) = match tasks::of_event(context, &event).await {
        // Ordered runs wait in Valkey, beside the queue.
        Ok(tasks) => match context.ordered_runs(&event).await {
            Ok(ordered) => (Ok(tasks), ordered),
            Err(err) => (Err(err), Vec::new()),
        },
        Err(err) => (Err(err), Vec::new()),
    };
    let options = &console.options;
    let trace = event.trace_id().map(|trace_id| {
        let link = options
            .trace_url
            .as_ref()
            .map(|template| template.replace("{trace_id}", trace_id));
        (trace_id.to_string(), link)
    });
    let body = html! {
        (super::cancelled::done(&done))
        dl.facts {
            dt { "Event id" } dd { code { (event.id) } }
            dt { "Name" } dd { (event.name) }
            dt { "Committed" } dd { (page::time(event.created_at)) }
            dt { "Published" }
            dd {
                @match event.published_at {
                    Some(at) => { (page::time(at)) " (" (page::between(event.created_at, at)) " after its commit)" }
                    None => span.pending { "not yet: waiting for the relay" },
                }
            }
            dt { "Trace" }
            dd {
                @match &trace {
                    Some((id, Some(link))) => a href=(link) { code { (id) } },
                    Some((id, None)) => code { (id) },
                    None => "none (the event was stored without a trace context)",
                }
                @if let (Some((id, _)), Some(_)) = (&trace, &options.traces) {
                    " " a.waterfall href={ "../traces/" (id) } { "see the waterfall" }
                }
            }
        }
        h2 { "Listeners" }
        @match &queued {
            Err(err) => p.error role="alert" { "Valkey: " (format!("{err:#}")) },
            Ok(tasks) => {
                @if tasks.listener_tasks.is_empty() {
                    p { "No listener is registered for " code { (event.name) } "." }
                } @else {
                    table.listeners {
                        thead { tr { th { "listener" } th { "task" } th { "attempts" } th { "last error" } th { "inbox" } th { "from commit" } th { "policy" } } }
                        tbody {
                            @for listener in &tasks.listener_tasks {
                                @let record = records.iter().find(|(name, _)| *name == listener.listener);
                                @let waiting = ordered.iter().find(|run| run.task_id == listener.task.id && run.after > 0);
                                tr data-listener=(listener.listener) {
                                    td { (listener.listener) }
                                    td {
                                        @match waiting {
                                            Some(run) => (waits(run)),
                                            None => (state(&listener.task)),
                                        }
                                    }
                                    td { (listener.task.retried) " failed of " (listener.task.max_retry + 1) " allowed" }
                                    td { @if let Some(error) = &listener.task.last_error { code.error { (error) } } @else { "-" } }
                                    td { @match record { Some((_, at)) => { "recorded " (page::time(*at)) }, None => "-" } }
                                    td { @match record { Some((_, at)) => (page::between(event.created_at, *at)), None => "-" } }
                                    td.policy { code { (listener.policy) } }
                                }
                            }
                        }
                    }
                }
                (super::cancelled::on_event_page(&console, event.id, &cancelled))
                h2 { "In the queue" }
                ul {
                    @for task in &tasks.event_tasks {
                        li { code { (task.task_type) } " in " (task.queue) ": " (state(task)) }
                    }
                }
            }
        }
        h2 { "Payload" }
        pre.payload { (page::payload(&event.payload, &options.masked_fields)) }
        h2 { "Metadata" }
        pre.payload { (serde_json::to_string_pretty(&event.metadata).unwrap_or_default()) }
    };
    page::layout(
        Depth::Nested,
        Section::Events,
        &format!("Event {}", event.name),
        body,
    )
    .into_response()
}

/// An ordered listener's run that is not in the queue yet: it waits for
/// the earlier runs of its key (`outbox show` says the same).
fn waits(run: &Standing) -> Markup {
    html! {
        span class="state state-waiting" { "waiting" }
        " for " (run.after) " earlier run(s) of key " code { (run.key) }
        @if let Some(head) = &run.waits_for {
            " (the first: task " code { (head) } ")"
        }
    }
}

/// A task's state, with what comes next for one that waits.
fn state(task: &TaskInfo) -> Markup {
    html! {
        span class={ "state state-" (task.state) } { (task.state) }
        @if let Some(at) = task.next_process_at.filter(|_| task.state == "retry") {
            " (next run " (page::time(at)) ")"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn search(pairs: &[(&str, &str)]) -> Search {
        let query: String = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(pairs)
            .finish();
        serde_urlencoded_like(&query)
    }

    /// The form as axum's `Query` reads it.
    fn serde_urlencoded_like(query: &str) -> Search {
        let uri: axum::http::Uri = format!("/events?{query}").parse().unwrap();
        Query::<Search>::try_from_uri(&uri).unwrap().0
    }

    #[test]
    fn a_malformed_search_says_what_to_fix() {
        let err = filter(&search(&[("id", "42")])).unwrap_err();
        assert!(err.contains("not an event id"), "{err}");
        let err = filter(&search(&[("from", "yesterday-ish")])).unwrap_err();
        assert!(err.contains("is not a time"), "{err}");
        let err = filter(&search(&[("field", "customer.id"), ("value", "7")])).unwrap_err();
        assert!(err.contains("give `from`"), "{err}");
        let err = filter(&search(&[
            ("field", "a..b"),
            ("value", "7"),
            ("from", "1h"),
        ]))
        .unwrap_err();
        assert!(err.contains("not a payload field"), "{err}");
        let err = filter(&search(&[("from", "1h"), ("to", "2h")])).unwrap_err();
        assert!(err.contains("not before"), "{err}");
    }

    #[test]
    fn a_search_keeps_its_fields_on_the_next_page() {
        let asked = search(&[
            ("name", "orderPlaced"),
            ("field", "customer.id"),
            ("value", "7"),
            ("from", "1h"),
        ]);
        let checked = filter(&asked).unwrap();
        assert_eq!(checked.name.as_deref(), Some("orderPlaced"));
        assert_eq!(
            checked.field,
            Some((
                vec!["customer".to_string(), "id".to_string()],
                "7".to_string()
            ))
        );
        let next = next_page(&asked, 1234);
        assert_eq!(
            next,
            "events?name=orderPlaced&from=1h&field=customer.id&value=7&before=1234"
        );
        assert_eq!(
            filter(&serde_urlencoded_like(&next[7..])).unwrap().before,
            Some(1234)
        );
    }
}
