//! Cancelling an event's listener tasks from its page (the Cancel button,
//! `POST events/<id>/cancel`, what `outbox cancel` does: see
//! `crate::operations::cancel`), and the cancelled tasks recorded in
//! Postgres (`listener_cancellations`), shown on the event's page and the
//! failures page, marked cancelled. "Send back" never sends them back;
//! they go back only when asked: the failures page's own form for them,
//! with its box ticked (`POST failures/send-back-cancelled`), or `outbox
//! retry-archived --include-cancelled`.

use std::sync::Arc;

use axum::Form;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use chrono::{DateTime, Utc};
use maud::{Markup, html};
use serde::Deserialize;
use uuid::Uuid;

use super::State as Console;
use super::guard::{self, CSRF_FIELD};
use super::page::{self, Depth, Section};
use crate::operations::cancel;
use crate::worker::task_names::listener_task_type;

/// One cancelled task recorded.
pub(crate) struct Recorded {
    pub(crate) task_id: String,
    pub(crate) event_id: Option<Uuid>,
    pub(crate) event_name: String,
    pub(crate) listener: String,
    pub(crate) state: String,
    pub(crate) cancelled_at: DateTime<Utc>,
}

type Row = (String, Option<Uuid>, String, String, String, DateTime<Utc>);

fn recorded(rows: Vec<Row>) -> Vec<Recorded> {
    rows.into_iter()
        .map(
            |(task_id, event_id, event_name, listener, state, cancelled_at)| Recorded {
                task_id,
                event_id,
                event_name,
                listener,
                state,
                cancelled_at,
            },
        )
        .collect()
}

/// The cancelled tasks recorded, newest first, at most `limit`.
pub(crate) async fn latest(console: &Console, limit: i64) -> Result<Vec<Recorded>, sqlx::Error> {
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT task_id, event_id, event_name, listener, state, cancelled_at \
         FROM listener_cancellations ORDER BY cancelled_at DESC LIMIT $1",
    )
    .bind(limit)
    .fetch_all(&console.context.pool)
    .await?;
    Ok(recorded(rows))
}

/// The cancelled tasks of the event `id`.
pub(crate) async fn of_event(console: &Console, id: Uuid) -> Result<Vec<Recorded>, sqlx::Error> {
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT task_id, event_id, event_name, listener, state, cancelled_at \
         FROM listener_cancellations WHERE event_id = $1 ORDER BY listener",
    )
    .bind(id)
    .fetch_all(&console.context.pool)
    .await?;
    Ok(recorded(rows))
}

/// The field the send-back of cancelled tasks must carry ticked.
const INCLUDE_CANCELLED: &str = "include_cancelled";

/// The failures page's section: the cancelled tasks, apart from the
/// failures, which Send back leaves; their own send-back asks for a box
/// to be ticked.
pub(crate) fn section(console: &Console, cancelled: &[Recorded]) -> Markup {
    html! {
        @if !cancelled.is_empty() {
            h2 { "Cancelled" }
            p {
                "Listener tasks cancelled (" code { "outbox cancel" } ", an event's Cancel) are not "
                "failures: Send back leaves them. " code { "outbox retry-archived --include-cancelled" }
                " sends them back, and so does this form, with its box ticked."
            }
            @if !console.options.read_only {
                form.send-back-cancelled method="post" action="failures/send-back-cancelled" {
                    input type="hidden" name=(CSRF_FIELD) value=(console.csrf);
                    label {
                        input type="checkbox" name=(INCLUDE_CANCELLED) value="yes";
                        " Send the cancelled tasks back to their queue (they run again)"
                    }
                    " "
                    button type="submit" { "Send back cancelled" }
                }
            }
            table.cancelled {
                thead { tr { th { "state" } th { "cancelled" } th { "listener" } th { "event" } th { "task" } } }
                tbody {
                    @for task in cancelled {
                        tr data-task=(task.task_id) {
                            td { span class="state state-cancelled" { "cancelled" } " (was " (task.state) ")" }
                            td { (page::time(task.cancelled_at)) }
                            td { code { (listener_task_type(&task.event_name, &task.listener)) } }
                            td {
                                @match task.event_id {
                                    Some(id) => a href={ "events/" (id) } { code { (id) } },
                                    None => "-",
                                }
                            }
                            td { code { (task.task_id) } }
                        }
                    }
                }
            }
        }
    }
}

/// The event page's part: its cancelled tasks, and the Cancel button.
pub(crate) fn on_event_page(console: &Console, id: Uuid, cancelled: &[Recorded]) -> Markup {
    html! {
        @for task in cancelled {
            p.cancelled data-listener=(task.listener) {
                span class="state state-cancelled" { "cancelled" } " "
                (task.listener) ": task " code { (task.task_id) } " (was " (task.state) ") "
                (page::time(task.cancelled_at))
            }
        }
        @if !console.options.read_only {
            form.cancel method="post" action={ (id) "/cancel" } {
                input type="hidden" name=(CSRF_FIELD) value=(console.csrf);
                button type="submit" { "Cancel its listener tasks" }
                " (those that wait are deleted, those that run asked to stop; as "
                code { "outbox cancel" } ")"
            }
        }
    }
}

/// What the page was sent back with after a Cancel.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Done {
    #[serde(default)]
    cancelled: Option<usize>,
    #[serde(default)]
    stopping: Option<usize>,
}

/// The line that says what a Cancel did.
pub(crate) fn done(done: &Done) -> Markup {
    html! {
        @if let (Some(cancelled), Some(stopping)) = (done.cancelled, done.stopping) {
            p.done role="status" {
                (cancelled) " listener task(s) cancelled, " (stopping) " running task(s) asked to stop."
            }
        }
    }
}

/// The Cancel form.
#[derive(Debug, Deserialize)]
pub(crate) struct Chosen {
    #[serde(default)]
    csrf: Option<String>,
    #[serde(default)]
    listener: Option<String>,
}

/// `POST events/<id>/cancel`: cancels the event's listener tasks (of one
/// listener when the form names it), logs what it did, and goes back to
/// the event's page.
pub(crate) async fn cancel(
    State(console): State<Arc<Console>>,
    Path(id): Path<String>,
    Form(chosen): Form<Chosen>,
) -> Response {
    if !guard::csrf_ok(&console, chosen.csrf.as_deref()) {
        return guard::csrf_refused();
    }
    let Ok(id) = Uuid::parse_str(&id) else {
        return (
            StatusCode::BAD_REQUEST,
            page::plain("Bad request", &format!("`{id}` is not an event id")),
        )
            .into_response();
    };
    let listener = chosen.listener.as_deref().filter(|l| !l.is_empty());
    match cancel::cancel(&console.context, id, listener).await {
        Ok(done) => {
            tracing::info!(
                action = "cancel",
                event = %id,
                listener,
                cancelled = done.deleted.len(),
                asked_to_stop = done.asked_to_stop.len(),
                left = done.left.len(),
                not_found = done.not_found.len(),
                "console: cancel an event's listener tasks"
            );
            // An event not due yet is gone whole: back to the Later page.
            let waited =
                !done.deleted.is_empty() && done.deleted.iter().all(|t| t.state == "later");
            let to = if waited {
                format!("../../later?cancelled={id}")
            } else {
                format!(
                    "../{id}?cancelled={}&stopping={}",
                    done.deleted.len(),
                    done.asked_to_stop.len()
                )
            };
            Redirect::to(&to).into_response()
        }
        Err(err)
            if err.downcast_ref::<sqlx::Error>().is_none()
                && err.to_string().contains("nothing was cancelled") =>
        {
            (
                StatusCode::BAD_REQUEST,
                page::plain("Nothing was cancelled", &format!("{err:#}")),
            )
                .into_response()
        }
        Err(err) => page::unavailable(Depth::Nested, Section::Events, &err),
    }
}

/// The send-back form of cancelled tasks.
#[derive(Debug, Deserialize)]
pub(crate) struct SendBack {
    #[serde(default)]
    csrf: Option<String>,
    #[serde(default)]
    include_cancelled: Option<String>,
}

/// `POST failures/send-back-cancelled`: with its box ticked, queues the
/// cancelled tasks recorded again, each under its own id with its event
/// from the outbox (`outbox retry-archived --include-cancelled`), forgets
/// their records, logs what it did, and goes back to the failures page.
pub(crate) async fn send_back(
    State(console): State<Arc<Console>>,
    Form(form): Form<SendBack>,
) -> Response {
    if !guard::csrf_ok(&console, form.csrf.as_deref()) {
        return guard::csrf_refused();
    }
    if form.include_cancelled.as_deref() != Some("yes") {
        return (
            StatusCode::BAD_REQUEST,
            page::plain(
                "Nothing was sent back",
                "Cancelled tasks are sent back only when the form's box is ticked.",
            ),
        )
            .into_response();
    }
    match crate::operations::retry_archived::cancelled_again(&console.context, None, None).await {
        Ok((sent, past_retention)) => {
            tracing::info!(
                action = "send back cancelled",
                sent = sent.len(),
                past_retention,
                "console: send back cancelled listener tasks"
            );
            Redirect::to(&format!(
                "../failures?sent={}&past_retention={past_retention}",
                sent.len()
            ))
            .into_response()
        }
        Err(err) => page::unavailable(Depth::Nested, Section::Failures, &err),
    }
}
