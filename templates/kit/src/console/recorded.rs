//! The failures the worker recorded in Postgres (`listener_failures`, see
//! `crate::worker::failures`) whose task is no longer in the queue: the
//! queue keeps at most 10,000 archived tasks a queue and drops the oldest.
//! On the failures page, grouped by listener and error; "Send back" queues
//! a group's tasks again, each under its own task id with its event read
//! from the outbox, after a page that says how many (an event past the
//! outbox's retention cannot be sent back, and is counted apart).

use std::sync::Arc;

use axum::Form;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use chrono::{DateTime, Utc};
use maud::{Markup, html};
use serde::Deserialize;
use uuid::Uuid;

use super::State as Console;
use super::guard::{self, CSRF_FIELD};
use super::page::{self, Depth, Section};
use crate::follow::rows;
use crate::queue::EnqueueOutcome;
use crate::worker::failures;
use crate::worker::task_names::listener_task_type;

/// One group of recorded failures no longer in the queue.
pub(crate) struct Group {
    event: String,
    listener: String,
    error: String,
    count: i64,
    latest: DateTime<Utc>,
}

/// The recorded failures whose task id is not in `in_queue` (the failed
/// tasks the queue still holds), by listener and error, newest first.
pub(crate) async fn groups(
    console: &Console,
    in_queue: &[String],
) -> Result<Vec<Group>, sqlx::Error> {
    let rows: Vec<(String, String, String, i64, DateTime<Utc>)> = sqlx::query_as(
        "SELECT event_name, listener, error, count(*), max(failed_at) FROM listener_failures \
         WHERE NOT (task_id = ANY($1)) GROUP BY 1, 2, 3 ORDER BY 5 DESC",
    )
    .bind(in_queue)
    .fetch_all(&console.context.pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(event, listener, error, count, latest)| Group {
            event,
            listener,
            error,
            count,
            latest,
        })
        .collect())
}

/// The section of the failures page.
pub(crate) fn section(console: &Console, groups: &[Group]) -> Markup {
    html! {
        @if !groups.is_empty() {
            h2 { "Recorded, no longer in the queue" }
            p {
                "The queue keeps at most 10,000 archived tasks a queue; the worker recorded these "
                "failures in Postgres (" code { "listener_failures" } ") before they fell off."
            }
            @for group in groups {
                section.group.recorded data-task-type=(listener_task_type(&group.event, &group.listener)) {
                    h2 { code { (listener_task_type(&group.event, &group.listener)) } " · " (group.count) " task(s)" }
                    p { "Error: " code.error { (group.error) } " · last " (page::time(group.latest)) }
                    @if !console.options.read_only {
                        p { a.button href=(confirm_link(group)) { "Send back " (group.count) } }
                    }
                }
            }
        }
    }
}

fn confirm_link(group: &Group) -> String {
    let query = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("event", &group.event)
        .append_pair("listener", &group.listener)
        .append_pair("error", &group.error)
        .finish();
    format!("failures/send-back?{query}")
}

/// A group, as its confirmation and its form name it.
#[derive(Debug, Deserialize)]
pub(crate) struct Chosen {
    #[serde(default)]
    csrf: Option<String>,
    event: String,
    listener: String,
    error: String,
}

/// One recorded failure of a group: its task and event.
struct Record {
    task_id: String,
    queue: String,
    event_id: Option<Uuid>,
}

/// The records of the group `chosen` whose task is not in the queue.
async fn records(console: &Console, chosen: &Chosen) -> anyhow::Result<Vec<Record>> {
    let in_queue = super::failed_tasks::failed_ids(console).await?;
    let rows: Vec<(String, String, Option<Uuid>)> = sqlx::query_as(
        "SELECT task_id, queue, event_id FROM listener_failures \
         WHERE event_name = $1 AND listener = $2 AND error = $3 AND NOT (task_id = ANY($4)) \
         ORDER BY failed_at",
    )
    .bind(&chosen.event)
    .bind(&chosen.listener)
    .bind(&chosen.error)
    .bind(&in_queue)
    .fetch_all(&console.context.pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(task_id, queue, event_id)| Record {
            task_id,
            queue,
            event_id,
        })
        .collect())
}

/// `GET failures/send-back?event=&listener=&error=`: how many tasks a
/// group's send-back would queue, and the button that does it.
pub(crate) async fn confirm(
    State(console): State<Arc<Console>>,
    Query(chosen): Query<Chosen>,
) -> Response {
    let records = match records(&console, &chosen).await {
        Ok(records) => records,
        Err(err) => return page::unavailable(Depth::Nested, Section::Failures, &err),
    };
    let task_type = listener_task_type(&chosen.event, &chosen.listener);
    let body = html! {
        p {
            "Send back " strong data-count=(records.len()) { (records.len()) } " recorded task(s) of "
            code { (task_type) } " that failed with " code.error { (chosen.error) } " to their queue?"
        }
        @if console.options.read_only {
            p { "This console is read-only." }
        } @else {
            form method="post" action="send-back" {
                input type="hidden" name=(CSRF_FIELD) value=(console.csrf);
                input type="hidden" name="event" value=(chosen.event);
                input type="hidden" name="listener" value=(chosen.listener);
                input type="hidden" name="error" value=(chosen.error);
                button type="submit" { "Send back " (records.len()) " task(s)" }
                " "
                a href="../failures" { "Cancel" }
            }
        }
    };
    page::layout(
        Depth::Nested,
        Section::Failures,
        "Send back recorded failures",
        body,
    )
    .into_response()
}

/// `POST failures/send-back`: queues the group's tasks again, each under
/// its own id with its event from the outbox, forgets their records, logs
/// what it did, and goes back to the failures page.
pub(crate) async fn send_back(
    State(console): State<Arc<Console>>,
    Form(chosen): Form<Chosen>,
) -> Response {
    if !guard::csrf_ok(&console, chosen.csrf.as_deref()) {
        return guard::csrf_refused();
    }
    if console
        .context
        .listeners
        .of(&chosen.event)
        .iter()
        .all(|l| l.name() != chosen.listener)
    {
        let message = format!(
            "`{}` is not a listener of `{}` in this service: its tasks would run nowhere.",
            chosen.listener, chosen.event
        );
        return (
            StatusCode::BAD_REQUEST,
            page::plain("Bad request", &message),
        )
            .into_response();
    }
    match send(&console, &chosen).await {
        Ok((sent, past_retention)) => {
            tracing::info!(
                action = "send back",
                event = chosen.event,
                listener = chosen.listener,
                error = chosen.error,
                sent,
                past_retention,
                "console: send back recorded failures"
            );
            Redirect::to(&format!(
                "../failures?sent={sent}&past_retention={past_retention}"
            ))
            .into_response()
        }
        Err(err) => page::unavailable(Depth::Nested, Section::Failures, &err),
    }
}

/// Queues the group's tasks again; how many were sent, and how many
/// events were past the outbox's retention.
async fn send(console: &Console, chosen: &Chosen) -> anyhow::Result<(usize, usize)> {
    let context = &console.context;
    let records = records(console, chosen).await?;
    let ids: Vec<Uuid> = records.iter().filter_map(|r| r.event_id).collect();
    let events = rows::by_ids(&context.pool, &ids).await?;
    let retention = context.config.outbox.task_retention;
    let task_type = listener_task_type(&chosen.event, &chosen.listener);
    let mut tasks = Vec::new();
    let mut past_retention = 0;
    for record in &records {
        let Some(event) = events.iter().find(|e| Some(e.id) == record.event_id) else {
            past_retention += 1;
            continue;
        };
        tasks.push(failures::sent_back_task(
            &event.envelope(),
            task_type.clone(),
            record.task_id.clone(),
            &record.queue,
            retention,
            context.listeners.policy_of(&chosen.event, &chosen.listener),
        ));
    }
    let client = context.queue().await?;
    let started = chrono::Utc::now();
    let mut sent = Vec::new();
    for (task, outcome) in tasks.iter().zip(client.enqueue(&tasks).await?) {
        // A duplicate is in the queue again already (sent back meanwhile).
        if outcome? == EnqueueOutcome::Enqueued {
            sent.push(task.id.clone());
        }
    }
    // A task that failed again since has a record of its new failure.
    failures::forget_before(&context.pool, &sent, started).await?;
    Ok((sent.len(), past_retention))
}
