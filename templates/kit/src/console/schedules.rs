//! The schedules page: each schedule of every scheduler that leads (this
//! service's, and those of other services sharing the Valkey, Go asynq's
//! included, as asynqmon lists them) with its spec, the last tick due, the
//! last tick enqueued and the next; and which replica leads (`host`,
//! process id) until when, unless it renews its lease. It reads the state
//! the leader keeps for asynqmon (`crate::scheduler`'s history).

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use maud::html;

use super::State as Console;
use super::page::{self, Depth, Section};
use crate::queue::message::Timestamp;
use crate::scheduler::history::{self, SchedulerEntry};

/// One schedule's row.
struct Row {
    entry: SchedulerEntry,
    last_enqueued: Option<(String, DateTime<Utc>)>,
}

/// `host, process <pid>` of a scheduler id `host:pid:uuid`.
fn replica(scheduler_id: &str) -> String {
    let mut parts = scheduler_id.rsplitn(3, ':');
    let (_uuid, pid, host) = (parts.next(), parts.next(), parts.next());
    match (host, pid) {
        (Some(host), Some(pid)) => format!("{host}, process {pid}"),
        _ => scheduler_id.to_string(),
    }
}

/// `GET schedules`.
pub(crate) async fn page(State(console): State<Arc<Console>>) -> Response {
    let unavailable = |err: &dyn std::fmt::Display| {
        let err = anyhow::anyhow!("Valkey: {err}");
        page::unavailable(Depth::Top, Section::Schedules, &err)
    };
    let client = match console.context.queue().await {
        Ok(client) => client,
        Err(err) => return unavailable(&format!("{err:#}")),
    };
    let leading = match history::leading(client).await {
        Ok(leading) => leading,
        Err(err) => return unavailable(&err),
    };
    let mut leaders = Vec::new();
    for leader in leading {
        let mut rows = Vec::new();
        for entry in leader.entries {
            match history::last_enqueued(client, &entry.id).await {
                Ok(last_enqueued) => rows.push(Row {
                    entry,
                    last_enqueued,
                }),
                Err(err) => return unavailable(&err),
            }
        }
        rows.sort_by(|a, b| a.entry.task_type.cmp(&b.entry.task_type));
        leaders.push((leader.scheduler_id, leader.until, rows));
    }
    let time = |at: Option<DateTime<Utc>>| at.map_or_else(|| "-".to_string(), page::time);
    let body = html! {
        @if leaders.is_empty() {
            p {
                "No scheduler leads now: no replica runs a scheduler with schedules "
                "(SCHEDULER_ENABLED), or the leader stopped and the next has not yet taken its lease."
            }
        }
        @for (scheduler_id, until, rows) in &leaders {
            section.group {
                h2 { "Led by " (replica(scheduler_id)) }
                p.pending { "Its lease holds until " (page::time(*until)) " unless renewed." }
                table.schedules {
                    thead { tr { th { "schedule" } th { "spec" } th { "last tick due" } th { "last enqueued" } th { "next tick" } } }
                    tbody {
                        @for row in rows {
                            @let entry = &row.entry;
                            tr data-schedule=(entry.task_type) {
                                td { code { (entry.task_type) } }
                                td { code { (entry.spec) } }
                                td { (time(entry.prev_enqueue_time.and_then(Timestamp::to_datetime))) }
                                td {
                                    @match &row.last_enqueued {
                                        Some((task_id, at)) => { (page::time(*at)) br; code { (task_id) } },
                                        None => "-",
                                    }
                                }
                                td { (time(entry.next_enqueue_time.and_then(Timestamp::to_datetime))) }
                            }
                        }
                    }
                }
            }
        }
    };
    page::layout(Depth::Top, Section::Schedules, "Schedules", body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_is_its_host_and_process() {
        assert_eq!(
            replica("web-1.internal:4242:0b7a9c1e-0000-4000-8000-000000000000"),
            "web-1.internal, process 4242"
        );
        assert_eq!(replica("no-colons"), "no-colons");
    }
}
