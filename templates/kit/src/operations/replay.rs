//! `outbox replay`: delivers published events again.
//!
//! The queue still holds an event's tasks for `OUTBOX_TASK_RETENTION` and
//! would refuse their ids as duplicates, so a replay queues the same
//! envelope (same event id, which listeners deduplicate on) under a new
//! task id: an `event:` task, whose fan-out derives new listener task ids
//! from it, or with `--listener` that one listener's task alone. Events are
//! chosen by id, or by name and creation time; unpublished events are left
//! to the relay. It asks for confirmation on a terminal, `--yes` otherwise.
//!
//! `--lost` is the recovery after Valkey lost data: each event task is
//! queued under the event's id, as the relay queued it, so an event Valkey
//! still has (queued, running, retried, or completed within
//! `OUTBOX_TASK_RETENTION`) is reported as still there and not queued
//! twice, and an event of an ordered key takes its own turn in the key
//! (a replay with a new id joins the end of its key's order instead). With
//! `--since` alone it takes every event name.
//!
//! This module chooses the events and asks; `crate::replay` plans their
//! tasks and queues them, as it does for the console.

use std::process::ExitCode;

use chrono::{DateTime, Utc};
use clap::ArgGroup;
use serde::Serialize;
use uuid::Uuid;

use super::output::{self, Format};
use crate::follow::rows::{self, EventRow, Filter};
use crate::follow::{self, Context, time};
use crate::replay::{
    ByName, Replayed, StillQueued, by_name_filter, enqueue, enqueue_lost, plan, plan_lost, queues,
};

#[derive(Debug, clap::Args)]
#[command(group(ArgGroup::new("events").required(true).multiple(true).args(["ids", "name", "since"])))]
#[command(group(ArgGroup::new("by_time").multiple(true).args(["name", "lost"])))]
pub(crate) struct Args {
    /// The ids of the events to replay
    #[arg(conflicts_with_all = ["name", "since", "until"])]
    pub(crate) ids: Vec<Uuid>,
    /// Replay the published events with this name (with --since)
    #[arg(long, requires = "since")]
    pub(crate) name: Option<String>,
    /// With --name (or --lost): events created at or after this time (2h:
    /// two hours ago, or 2026-11-30T08:00:00Z)
    #[arg(long, value_parser = time::parse_time, requires = "by_time")]
    pub(crate) since: Option<DateTime<Utc>>,
    /// With --since: events created before this time
    #[arg(long, value_parser = time::parse_time, requires = "since")]
    pub(crate) until: Option<DateTime<Utc>>,
    /// Deliver to this listener only
    #[arg(long, conflicts_with = "lost")]
    pub(crate) listener: Option<String>,
    /// The recovery after Valkey lost data: queue each event under its own
    /// id, as the relay did, so that those Valkey still has are left as
    /// they are (with --since alone: every event name)
    #[arg(long)]
    pub(crate) lost: bool,
    /// Do not ask for confirmation
    #[arg(long, short)]
    pub(crate) yes: bool,
}

#[derive(Debug, Clone, Serialize)]
struct Report {
    replayed: Vec<Replayed>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    still_queued: Vec<StillQueued>,
}

pub async fn run(context: &Context, args: &Args, format: Format) -> anyhow::Result<ExitCode> {
    let events = choose(context, args).await?;
    if events.is_empty() {
        match format {
            Format::Json => output::print_json(&Report {
                replayed: vec![],
                still_queued: vec![],
            })?,
            Format::Text => println!("no published event matches; nothing replayed"),
        }
        return Ok(ExitCode::SUCCESS);
    }
    let queues = queues(context, args.listener.as_deref())?;
    let planned = if args.lost {
        plan_lost(context, &events, &queues).await?
    } else {
        plan(context, &events, &queues, args.listener.as_deref())?
    };

    let target = args
        .listener
        .as_ref()
        .map_or_else(String::new, |l| format!(" to listener `{l}` only"));
    let question = format!(
        "replay {} event(s){target}{} through queue(s) {}",
        events.len(),
        if args.lost {
            " that Valkey lost (those it still has are left)"
        } else {
            ""
        },
        queues.join(",")
    );
    if !output::confirm(&question, args.yes)? {
        eprintln!("nothing replayed");
        return Ok(ExitCode::FAILURE);
    }

    let (replayed, still_queued) = if args.lost {
        enqueue_lost(context, &planned).await?
    } else {
        (enqueue(context, &planned).await?, Vec::new())
    };
    match format {
        Format::Json => output::print_json(&Report {
            replayed,
            still_queued,
        })?,
        Format::Text => {
            for task in &replayed {
                println!(
                    "replayed {} as {} task {} (queue {})",
                    task.event_id, task.task_type, task.task_id, task.queue
                );
            }
            for task in &still_queued {
                println!(
                    "left {}: Valkey still has its task (queue {})",
                    task.event_id, task.queue
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The events to replay, oldest first. Unknown or unpublished ids are an
/// error, before anything is queued.
async fn choose(context: &Context, args: &Args) -> anyhow::Result<Vec<EventRow>> {
    if let (None, Some(since)) = (&args.name, args.since) {
        let filter = Filter {
            name: None,
            published: Some(true),
            since: Some(since),
            until: args.until,
            limit: None,
            newest_first: false,
        };
        return Ok(rows::list(&context.pool, &filter).await?);
    }
    if let (Some(name), Some(since)) = (&args.name, args.since) {
        let chosen = ByName {
            name: name.clone(),
            since,
            until: args.until,
            listener: args.listener.clone(),
        };
        return Ok(rows::list(&context.pool, &by_name_filter(&chosen)).await?);
    }
    let mut ids = args.ids.clone();
    ids.sort_unstable();
    ids.dedup();
    let mut events = rows::by_ids(&context.pool, &ids).await?;
    let unknown: Vec<Uuid> = ids
        .iter()
        .filter(|id| !events.iter().any(|e| e.id == **id))
        .copied()
        .collect();
    if !unknown.is_empty() {
        return Err(follow::unknown(&unknown).context("nothing was replayed"));
    }
    let unpublished: Vec<String> = events
        .iter()
        .filter(|e| e.published_at.is_none())
        .map(|e| e.id.to_string())
        .collect();
    if !unpublished.is_empty() {
        anyhow::bail!(
            "event {} is not published yet: the relay will deliver it; nothing was replayed",
            unpublished.join(", ")
        );
    }
    events.sort_by_key(|e| e.created_at);
    Ok(events)
}
