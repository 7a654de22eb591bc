//! The queues page: each queue of the service with its tasks by state,
//! its totals and its latency (the oldest pending task's wait), as Go
//! asynq's `Inspector.GetQueueInfo` gives them; and pausing a queue (its
//! pending tasks wait, for every worker, Go's too) or resuming it.

use std::sync::Arc;

use axum::Form;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::State as Console;
use super::guard::{self, CSRF_FIELD};
use super::page::{self, Depth, Section};

/// `GET queues`.
pub(crate) async fn page(State(console): State<Arc<Console>>) -> Response {
    let context = &console.context;
    let client = match context.queue().await {
        Ok(client) => client,
        Err(err) => {
            let err = anyhow::anyhow!("Valkey: {err:#}");
            return page::unavailable(Depth::Top, Section::Queues, &err);
        }
    };
    let mut queues = Vec::new();
    for queue in context.all_queues() {
        match client.queue_stats(&queue).await {
            Ok(stats) => queues.push(stats),
            Err(err) => {
                let err = anyhow::anyhow!("Valkey: {err}");
                return page::unavailable(Depth::Top, Section::Queues, &err);
            }
        }
    }
    let body = html! {
        table.queues {
            thead {
                tr {
                    th { "queue" } th { "state" } th { "pending" } th { "active" } th { "scheduled" }
                    th { "retry" } th { "archived" } th { "completed" } th { "latency" }
                    th { "processed" } th { "failed" }
                    @if !console.options.read_only { th { "" } }
                }
            }
            tbody {
                @for stats in &queues {
                    @let c = &stats.counts;
                    tr {
                        td { (stats.queue) }
                        td { @if stats.paused { "paused" } @else { "running" } }
                        td { (c.pending) } td { (c.active) } td { (c.scheduled) }
                        td { (c.retry) } td { (c.archived) } td { (c.completed) }
                        td { (format!("{:.1} s", stats.latency_seconds)) }
                        td { (stats.processed_total) } td { (stats.failed_total) }
                        @if !console.options.read_only {
                            td { (pause_button(&console, &stats.queue, stats.paused)) }
                        }
                    }
                }
            }
        }
        p { "Archived tasks past asynq's 10,000 a queue are dropped, oldest first; the Failures page shows what is left." }
    };
    page::layout(Depth::Top, Section::Queues, "Queues", body).into_response()
}

/// The button that pauses a running queue or resumes a paused one.
fn pause_button(console: &Console, queue: &str, paused: bool) -> Markup {
    html! {
        form method="post" action="queues/pause" {
            input type="hidden" name=(CSRF_FIELD) value=(console.csrf);
            input type="hidden" name="queue" value=(queue);
            input type="hidden" name="paused" value=(!paused);
            button type="submit" { @if paused { "Resume" } @else { "Pause" } }
        }
    }
}

/// A pause's form: the queue, and whether it is to be paused.
#[derive(Debug, Deserialize)]
pub(crate) struct Pause {
    #[serde(default)]
    csrf: Option<String>,
    queue: String,
    paused: bool,
}

/// `POST queues/pause`: pauses or resumes the queue, logs it, and goes
/// back to the queues page.
pub(crate) async fn pause(
    State(console): State<Arc<Console>>,
    Form(form): Form<Pause>,
) -> Response {
    if !guard::csrf_ok(&console, form.csrf.as_deref()) {
        return guard::csrf_refused();
    }
    let context = &console.context;
    if !context.all_queues().contains(&form.queue) {
        return (
            StatusCode::BAD_REQUEST,
            page::plain("Bad request", "Not one of the service's queues."),
        )
            .into_response();
    }
    let changed = match context.queue().await {
        Ok(client) if form.paused => client.pause(&form.queue).await,
        Ok(client) => client.resume(&form.queue).await,
        Err(err) => {
            let err = anyhow::anyhow!("Valkey: {err:#}");
            return page::unavailable(Depth::Nested, Section::Queues, &err);
        }
    };
    match changed {
        Ok(changed) => {
            let action = if form.paused { "pause" } else { "resume" };
            tracing::info!(action, queue = %form.queue, changed, "console: {action} a queue");
            Redirect::to("../queues").into_response()
        }
        Err(err) => {
            let err = anyhow::anyhow!("Valkey: {err}");
            page::unavailable(Depth::Nested, Section::Queues, &err)
        }
    }
}
