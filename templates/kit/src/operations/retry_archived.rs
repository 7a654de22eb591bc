//! `outbox retry-archived`: puts archived listener tasks back to pending,
//! as asynq's "run" (asynqmon, the asynq CLI) does: same task id, message
//! and count of failed runs, so a task that fails again is archived again
//! at once (unless its listener's retries were raised since); its count of
//! snoozes starts again at 0, and it takes its listener's retries and
//! timeout now ([`failures::run_again`]).
//! Only `listener:` tasks of the service's queues are touched. Then the
//! failures recorded in `listener_failures` whose task the queue no longer
//! has (it keeps 10,000 archived tasks a queue, and Valkey may have lost
//! data) are queued again under their task id, with their event from the
//! outbox, as the console's "Send back" does; one whose event the outbox
//! no longer has is reported and kept. Cancelled tasks
//! (`listener_cancellations`, `outbox cancel`) are not failures: they are
//! sent back only with `--include-cancelled`, the same way.

use std::process::ExitCode;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::output::{self, Format};
use crate::follow::{Context, rows, time};
use crate::queue::{EnqueueOutcome, RunOutcome};
use crate::worker::failures;
use crate::worker::task_names::listener_task_type;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Only this listener's tasks: `audit`, or `orderPlaced:audit` for one
    /// event's
    #[arg(long)]
    pub(crate) listener: Option<String>,
    /// Only tasks archived at or after this time (2h: two hours ago, or
    /// 2026-11-30T08:00:00Z)
    #[arg(long, value_parser = time::parse_time)]
    pub(crate) since: Option<DateTime<Utc>>,
    /// Also send back the cancelled tasks (`outbox cancel`), which are
    /// otherwise left
    #[arg(long)]
    pub(crate) include_cancelled: bool,
}

/// One task put back (`--format json`: `{"retried": [...]}`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Retried {
    pub(crate) queue: String,
    pub(crate) id: String,
    #[serde(rename = "type")]
    pub(crate) task_type: String,
    pub(crate) archived_at: DateTime<Utc>,
    pub(crate) last_error: String,
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
    let started = chrono::Utc::now();
    let mut retried = Vec::new();
    for queue in context.all_queues() {
        for (message, archived_at) in client.archived_tasks(&queue, args.since).await? {
            if !matches(&message.r#type, args.listener.as_deref()) {
                continue;
            }
            let outcome =
                failures::run_again(client, &context.listeners, &queue, &message.id).await?;
            if outcome == RunOutcome::Queued {
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
    let (again, mut past_retention) = recorded_again(context, args, &retried).await?;
    retried.extend(again);
    if args.include_cancelled {
        let (cancelled, past) =
            cancelled_again(context, args.listener.as_deref(), args.since).await?;
        past_retention += past;
        retried.extend(cancelled);
    }
    // Back in the queue: their failures are no longer kept.
    let ids: Vec<String> = retried.iter().map(|task| task.id.clone()).collect();
    // A task that failed again since has a record of its new failure.
    crate::worker::failures::forget_before(&context.pool, &ids, started).await?;
    if past_retention > 0 && format == Format::Text {
        eprintln!(
            "{past_retention} recorded failure(s) whose task the queue no longer has were kept: \
             their events are past the outbox's retention"
        );
    }
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

/// A failure recorded: task id, queue, event id, event name, listener,
/// error, when.
type Record = (
    String,
    String,
    Option<uuid::Uuid>,
    String,
    String,
    String,
    DateTime<Utc>,
);

/// Queues again the failures recorded whose task the queue no longer has
/// (module docs), of `args`' listener and time, but those in `retried`;
/// what it queued, and how many events the outbox no longer has.
async fn recorded_again(
    context: &Context,
    args: &Args,
    retried: &[Retried],
) -> anyhow::Result<(Vec<Retried>, usize)> {
    let records: Vec<Record> = sqlx::query_as(
            "SELECT task_id, queue, event_id, event_name, listener, error, failed_at \
             FROM listener_failures WHERE failed_at >= coalesce($1, '-infinity') ORDER BY failed_at",
        )
        .bind(args.since)
        .fetch_all(&context.pool)
        .await?;
    let client = context.queue().await?;
    let mut missing = Vec::new();
    for record in records {
        let task_type = listener_task_type(&record.3, &record.4);
        if retried.iter().any(|task| task.id == record.0)
            || !matches(&task_type, args.listener.as_deref())
            || client.task_exists(&record.1, &record.0).await?
        {
            continue;
        }
        missing.push((record, task_type));
    }
    let ids: Vec<uuid::Uuid> = missing.iter().filter_map(|(record, _)| record.2).collect();
    let events = rows::by_ids(&context.pool, &ids).await?;
    let retention = context.config.outbox.task_retention;
    let (mut tasks, mut sent, mut past_retention) = (Vec::new(), Vec::new(), 0);
    for ((task_id, queue, event_id, event_name, listener, error, failed_at), task_type) in missing {
        let Some(event) = events.iter().find(|event| Some(event.id) == event_id) else {
            past_retention += 1;
            continue;
        };
        tasks.push(failures::sent_back_task(
            &event.envelope(),
            task_type.clone(),
            task_id.clone(),
            &queue,
            retention,
            context.listeners.policy_of(&event_name, &listener),
        ));
        sent.push(Retried {
            queue,
            id: task_id,
            task_type,
            archived_at: failed_at,
            last_error: error,
        });
    }
    if tasks.is_empty() {
        return Ok((Vec::new(), past_retention));
    }
    let mut queued = Vec::new();
    for (task, outcome) in sent.into_iter().zip(client.enqueue(&tasks).await?) {
        if outcome? == EnqueueOutcome::Enqueued {
            queued.push(task);
        }
    }
    Ok((queued, past_retention))
}

/// A cancellation recorded: task id, queue, event id, event name,
/// listener, when.
type Cancellation = (
    String,
    String,
    Option<uuid::Uuid>,
    String,
    String,
    DateTime<Utc>,
);

/// Queues again the cancelled tasks recorded (`listener_cancellations`)
/// of the listener `only` names (all when `None`) cancelled at or after `since`, whose task the queue does not have, each
/// under its task id with its event from the outbox, and forgets their
/// records; what it queued, and how many events the outbox no longer has.
pub(crate) async fn cancelled_again(
    context: &Context,
    only: Option<&str>,
    since: Option<DateTime<Utc>>,
) -> anyhow::Result<(Vec<Retried>, usize)> {
    let records: Vec<Cancellation> = sqlx::query_as(
        "SELECT task_id, queue, event_id, event_name, listener, cancelled_at \
             FROM listener_cancellations WHERE cancelled_at >= coalesce($1, '-infinity') \
             ORDER BY cancelled_at",
    )
    .bind(since)
    .fetch_all(&context.pool)
    .await?;
    let client = context.queue().await?;
    let ids: Vec<uuid::Uuid> = records.iter().filter_map(|record| record.2).collect();
    let events = rows::by_ids(&context.pool, &ids).await?;
    let retention = context.config.outbox.task_retention;
    let (mut tasks, mut sent, mut past_retention) = (Vec::new(), Vec::new(), 0);
    for (task_id, queue, event_id, event_name, listener, cancelled_at) in records {
        let task_type = listener_task_type(&event_name, &listener);
        if !matches(&task_type, only) || client.task_exists(&queue, &task_id).await? {
            continue;
        }
        let Some(event) = events.iter().find(|event| Some(event.id) == event_id) else {
            past_retention += 1;
            continue;
        };
        tasks.push(failures::sent_back_task(
            &event.envelope(),
            task_type.clone(),
            task_id.clone(),
            &queue,
            retention,
            context.listeners.policy_of(&event_name, &listener),
        ));
        sent.push(Retried {
            queue,
            id: task_id,
            task_type,
            archived_at: cancelled_at,
            last_error: "cancelled".to_string(),
        });
    }
    if tasks.is_empty() {
        return Ok((Vec::new(), past_retention));
    }
    let mut queued = Vec::new();
    for (task, outcome) in sent.into_iter().zip(client.enqueue(&tasks).await?) {
        if outcome? == EnqueueOutcome::Enqueued {
            queued.push(task);
        }
    }
    let ids: Vec<String> = queued.iter().map(|task| task.id.clone()).collect();
    crate::worker::cancellations::forget(&context.pool, &ids).await?;
    Ok((queued, past_retention))
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
