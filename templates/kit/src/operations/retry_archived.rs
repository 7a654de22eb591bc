//! `outbox retry-archived`: puts archived listener tasks back to pending,
//! as asynq's "run" (asynqmon, the asynq CLI) does: same task id, message
//! and retry count, so a task that fails again is archived again at once.
//! Only `listener:` tasks of the service's queues are touched.

use std::process::ExitCode;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::output::{self, Format};
use crate::follow::{Context, time};
use crate::queue::RunOutcome;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only this listener's tasks: `audit`, or `orderPlaced:audit` for one
    /// event's
    #[arg(long)]
    pub listener: Option<String>,
    /// Only tasks archived at or after this time (2h: two hours ago, or
    /// 2026-11-30T08:00:00Z)
    #[arg(long, value_parser = time::parse_time)]
    pub since: Option<DateTime<Utc>>,
}

/// One task put back (`--format json`: `{"retried": [...]}`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Retried {
    pub queue: String,
    pub id: String,
    #[serde(rename = "type")]
    pub task_type: String,
    pub archived_at: DateTime<Utc>,
    pub last_error: String,
}

#[derive(Debug, Clone, Serialize)]
struct Report {
    retried: Vec<Retried>,
}

/// Whether `task_type` (`listener:<event>:<listener>`) is one of `filter`'s.
fn matches(task_type: &str, filter: Option<&str>) -> bool {
    let Some(rest) = task_type.strip_prefix("listener:") else {
        return false;
    };
    match filter {
        None => true,
        Some(filter) if filter.contains(':') => rest == filter,
        Some(filter) => rest
            .rsplit_once(':')
            .is_some_and(|(_, name)| name == filter),
    }
}

pub async fn run(context: &Context, args: &Args, format: Format) -> anyhow::Result<ExitCode> {
    let client = context.queue().await?;
    let mut retried = Vec::new();
    for queue in context.all_queues() {
        for (message, archived_at) in client.archived_tasks(&queue, args.since).await? {
            if !matches(&message.r#type, args.listener.as_deref()) {
                continue;
            }
            if client.run_task(&queue, &message.id).await? == RunOutcome::Queued {
                retried.push(Retried {
                    queue: queue.clone(),
                    id: message.id,
                    task_type: message.r#type,
                    archived_at,
                    last_error: message.error_msg,
                });
            }
        }
    }
    // Back in the queue: their failures are no longer kept.
    let ids: Vec<String> = retried.iter().map(|task| task.id.clone()).collect();
    crate::worker::failures::forget(&context.pool, &ids).await?;
    match format {
        Format::Json => output::print_json(&Report { retried })?,
        Format::Text => {
            for task in &retried {
                println!(
                    "pending again: {} task {} (queue {}, archived {}: {})",
                    task.task_type,
                    task.id,
                    task.queue,
                    output::time(task.archived_at),
                    task.last_error
                );
            }
            println!(
                "{} archived listener task(s) put back to pending",
                retried.len()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listeners_are_matched_by_name_or_event_and_name() {
        let task = "listener:orderPlaced:audit";
        assert!(matches(task, None));
        assert!(matches(task, Some("audit")));
        assert!(matches(task, Some("orderPlaced:audit")));
        assert!(!matches(task, Some("email")));
        assert!(!matches(task, Some("orderShipped:audit")));
        assert!(!matches("event:orderPlaced", None));
    }
}
