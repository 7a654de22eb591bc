//! The later page: the events dispatched for later (`kit::dispatch_at`,
//! `kit::dispatch_in`) that wait in `outbox_later`: how many, the next
//! due, and the first [`SHOWN`] by due time, each with its key, when it
//! was dispatched and when it is due, and (unless the console is
//! read-only) a Cancel button, as `outbox cancel` (`POST
//! events/<id>/cancel`, behind the console's CSRF secret). A waiting event
//! is not in the queue yet (asynqmon shows it once it is due).

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use maud::html;

use super::State as Console;
use super::guard::CSRF_FIELD;
use super::page::{self, Depth, Section};
use crate::outbox::Store;

/// How many waiting events the page lists.
pub(crate) const SHOWN: u32 = 100;

/// What the page was sent back with after a Cancel.
#[derive(Debug, Default, serde::Deserialize)]
pub(crate) struct Cancelled {
    #[serde(default)]
    cancelled: Option<uuid::Uuid>,
}

/// `GET later`.
pub(crate) async fn page(
    State(console): State<Arc<Console>>,
    Query(done): Query<Cancelled>,
) -> Response {
    let pool = &console.context.pool;
    let read = async {
        let waiting = Store.waiting(pool).await?;
        let next = Store.next_waiting(pool, SHOWN).await?;
        Ok::<_, sqlx::Error>((waiting, next))
    };
    let (waiting, next) = match read.await {
        Ok(read) => read,
        Err(err) => {
            let err = anyhow::anyhow!("Postgres: {err}");
            return page::unavailable(Depth::Top, Section::Later, &err);
        }
    };
    let now = Utc::now();
    let body = html! {
        @if let Some(id) = done.cancelled {
            p.done role="status" { "Cancelled " code { (id) } ": none of its listeners will run." }
        }
        p.summary data-waiting=(waiting.events) {
            @match waiting.next_due {
                Some(due) => {
                    (waiting.events) " events wait to be delivered later; the next is due "
                    (page::time(due))
                    @if due > now { " (in " (page::between(now, due)) ")" } @else { " (due now: the worker moves it within a second)" }
                    "."
                },
                None => "No event waits to be delivered later.",
            }
        }
        @if !next.is_empty() {
            table.later {
                thead { tr { th { "due" } th { "in" } th { "event" } th { "id" } th { "order key" } th { "dispatched" } @if !console.options.read_only { th { "" } } } }
                tbody {
                    @for event in &next {
                        tr data-event=(event.event_id) {
                            td { (page::time(event.due_at)) }
                            td { @if event.due_at > now { (page::between(now, event.due_at)) } @else { "due" } }
                            td { code { (event.event_name) } }
                            td { code { (event.event_id) } }
                            td { @match &event.order_key { Some(key) => code { (key) }, None => "-" } }
                            td { (page::time(event.dispatched_at)) }
                            @if !console.options.read_only {
                                td {
                                    form.cancel method="post" action={ "events/" (event.event_id) "/cancel" } {
                                        input type="hidden" name=(CSRF_FIELD) value=(console.csrf);
                                        button type="submit" { "Cancel" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            @if waiting.events > i64::from(SHOWN) {
                p.pending { "The first " (SHOWN) " by due time, of " (waiting.events) "." }
            }
        }
    };
    page::layout(Depth::Top, Section::Later, "Later", body).into_response()
}
