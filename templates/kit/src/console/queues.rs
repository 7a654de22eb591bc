//! The queues page: each queue of the service with its tasks by state,
//! its totals and its latency (the oldest pending task's wait), as Go
//! asynq's `Inspector.GetQueueInfo` gives them.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::html;

use super::State as Console;
use super::page::{self, Depth, Section};

/// `GET queues`.
pub(crate) async fn page(State(console): State<Arc<Console>>) -> Response {
    let context = &console.context;
    let client = match context.queue().await {
        Ok(client) => client,
        Err(err) => {
            let err = anyhow::anyhow!("Valkey: {err:#}");
            return page::error(
                Depth::Top,
                Section::Queues,
                StatusCode::SERVICE_UNAVAILABLE,
                &err,
            );
        }
    };
    let mut queues = Vec::new();
    for queue in context.all_queues() {
        match client.queue_stats(&queue).await {
            Ok(stats) => queues.push(stats),
            Err(err) => {
                let err = anyhow::anyhow!("Valkey: {err}");
                return page::error(
                    Depth::Top,
                    Section::Queues,
                    StatusCode::SERVICE_UNAVAILABLE,
                    &err,
                );
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
                    }
                }
            }
        }
        p { "Archived tasks past asynq's 10,000 a queue are dropped, oldest first; the Failures page shows what is left." }
    };
    page::layout(Depth::Top, Section::Queues, "Queues", body).into_response()
}
