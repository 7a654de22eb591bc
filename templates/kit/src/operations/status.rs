//! `outbox status`: the relay's lag (unpublished events and the age of the
//! oldest), events published in the last minute and hour, rows due for
//! cleanup, the table's size, the events waiting to be delivered later
//! (how many, the next due), each queue's tasks by state, and what the
//! order of ordered listeners holds back (blocked keys, waiting runs). With
//! `--max-lag 30s` it exits 2 when the lag is larger, for cron jobs and
//! probes.

use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;

use super::LAG_EXCEEDED;
use super::output::{self, Format};
use crate::follow::rows::{self, TableStats};
use crate::follow::{Context, time};
use crate::outbox::Store;
use crate::outbox::later::Waiting;
use crate::queue::QueueCounts;
use crate::worker::ordering::Held;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Exit 2 when the oldest unpublished event is older than this, such
    /// as 30s or 5m
    #[arg(long, value_parser = time::parse_duration)]
    pub(crate) max_lag: Option<Duration>,
}

/// One queue's counts.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct QueueStatus {
    pub(crate) queue: String,
    #[serde(flatten)]
    pub(crate) counts: QueueCounts,
}

/// The whole report (`--format json`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Status {
    pub(crate) outbox: TableStats,
    /// `OUTBOX_RETENTION`, which `due_for_cleanup` counts against.
    pub(crate) retention_seconds: u64,
    /// Events dispatched for later that are not due yet (`outbox_later`).
    pub(crate) later: Waiting,
    pub(crate) queues: Vec<QueueStatus>,
    /// What ordered listeners hold back.
    pub(crate) ordering: Held,
    pub(crate) max_lag_seconds: Option<f64>,
    /// Whether the lag is above `--max-lag` (false without it).
    pub(crate) lag_exceeded: bool,
}

pub async fn run(context: &Context, args: &Args, format: Format) -> anyhow::Result<ExitCode> {
    let retention = context.config.outbox.retention;
    let outbox = rows::stats(&context.pool, retention).await?;
    let later = Store.waiting(&context.pool).await?;
    let client = context.queue().await?;
    let mut queues = Vec::new();
    for queue in context.all_queues() {
        let counts = client.queue_counts(&queue).await?;
        queues.push(QueueStatus { queue, counts });
    }
    let ordering = context.ordering().await?.held().await?;
    let lag = outbox.oldest_unpublished_age_seconds.unwrap_or(0.0);
    let lag_exceeded = args.max_lag.is_some_and(|max| lag > max.as_secs_f64());
    let status = Status {
        outbox,
        retention_seconds: retention.as_secs(),
        later,
        queues,
        ordering,
        max_lag_seconds: args.max_lag.map(|max| max.as_secs_f64()),
        lag_exceeded,
    };
    match format {
        Format::Json => output::print_json(&status)?,
        Format::Text => print_text(&status),
    }
    Ok(if lag_exceeded {
        ExitCode::from(LAG_EXCEEDED)
    } else {
        ExitCode::SUCCESS
    })
}

fn print_text(status: &Status) {
    let outbox = &status.outbox;
    let lag = outbox.oldest_unpublished_age_seconds.map_or_else(
        || "none".to_string(),
        |s| output::age(Duration::from_secs_f64(s)),
    );
    println!("outbox_events");
    println!("  unpublished            {}", outbox.unpublished);
    println!("  relay lag              {lag} (age of the oldest unpublished event)");
    println!("  published last minute  {}", outbox.published_last_minute);
    println!("  published last hour    {}", outbox.published_last_hour);
    println!(
        "  due for cleanup        {} (published over {} ago)",
        outbox.due_for_cleanup,
        output::age(Duration::from_secs(status.retention_seconds))
    );
    println!("  table size             {} bytes", outbox.table_bytes);
    println!();
    println!("outbox_later");
    println!(
        "  waiting                {} (dispatched for later, not due yet)",
        status.later.events
    );
    match status.later.next_due {
        Some(due) => println!("  next due               {}", due.to_rfc3339()),
        None => println!("  next due               none"),
    }
    println!();
    println!(
        "{:<20} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "queue", "pending", "active", "scheduled", "retry", "archived", "completed"
    );
    for queue in &status.queues {
        let c = &queue.counts;
        println!(
            "{:<20} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            queue.queue, c.pending, c.active, c.scheduled, c.retry, c.archived, c.completed
        );
    }
    let held = &status.ordering;
    println!();
    println!("ordered listeners");
    println!(
        "  blocked keys           {} (a run failed for good: `outbox retry-archived` or `outbox skip`)",
        held.blocked_keys
    );
    println!(
        "  waiting runs           {} (behind an earlier run of their key)",
        held.waiting_runs
    );
    println!(
        "  waiting events         {} (behind the fan-out of an earlier event of their key)",
        held.waiting_events
    );
    if let Some(max) = status.max_lag_seconds {
        let verdict = if status.lag_exceeded {
            "exceeded"
        } else {
            "ok"
        };
        println!();
        println!(
            "max lag {}: {verdict}",
            output::age(Duration::from_secs_f64(max))
        );
    }
}
