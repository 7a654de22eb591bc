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

use std::process::ExitCode;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use clap::ArgGroup;
use serde::Serialize;
use uuid::Uuid;

use super::output::{self, Format};
use crate::follow::rows::{self, EventRow, Filter};
use crate::follow::{self, Context, tasks, time};
use crate::outbox::order::Place;
use crate::outbox::relay::{MAX_RETRY, TASK_TIMEOUT, event_task, event_task_type};
use crate::queue::{EnqueueOutcome, NewTask};
use crate::worker::ordering::recovery_task;
use crate::worker::task_names::listener_task_type;

/// Tasks queued per round trip.
const BATCH: usize = 500;

#[derive(Debug, clap::Args)]
#[command(group(ArgGroup::new("events").required(true).multiple(true).args(["ids", "name", "since"])))]
#[command(group(ArgGroup::new("by_time").multiple(true).args(["name", "lost"])))]
pub struct Args {
    /// The ids of the events to replay
    #[arg(conflicts_with_all = ["name", "since", "until"])]
    pub ids: Vec<Uuid>,
    /// Replay the published events with this name (with --since)
    #[arg(long, requires = "since")]
    pub name: Option<String>,
    /// With --name (or --lost): events created at or after this time (2h:
    /// two hours ago, or 2026-11-30T08:00:00Z)
    #[arg(long, value_parser = time::parse_time, requires = "by_time")]
    pub since: Option<DateTime<Utc>>,
    /// With --since: events created before this time
    #[arg(long, value_parser = time::parse_time, requires = "since")]
    pub until: Option<DateTime<Utc>>,
    /// Deliver to this listener only
    #[arg(long, conflicts_with = "lost")]
    pub listener: Option<String>,
    /// The recovery after Valkey lost data: queue each event under its own
    /// id, as the relay did, so that those Valkey still has are left as
    /// they are (with --since alone: every event name)
    #[arg(long)]
    pub lost: bool,
    /// Do not ask for confirmation
    #[arg(long, short)]
    pub yes: bool,
}

/// One event task Valkey still had (`--lost`; `--format json`:
/// `{"still_queued": [...]}`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct StillQueued {
    pub event_id: Uuid,
    pub queue: String,
}

/// One queued task (`--format json`: `{"replayed": [...]}`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Replayed {
    pub event_id: Uuid,
    pub queue: String,
    pub task_id: String,
    #[serde(rename = "type")]
    pub task_type: String,
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

/// A replay chosen by name and creation time, as `outbox replay --name`
/// and the console's failures page choose it.
#[derive(Debug, Clone)]
pub(crate) struct ByName {
    pub name: String,
    pub since: DateTime<Utc>,
    pub until: Option<DateTime<Utc>>,
    /// One listener only, or the whole fan-out.
    pub listener: Option<String>,
}

/// What a replay would queue: the events (oldest first) and the new tasks,
/// one per event and queue, and the queues they go to.
pub(crate) struct Planned {
    pub events: usize,
    pub queues: Vec<String>,
    pub tasks: Vec<(Uuid, NewTask)>,
}

/// Plans the replay of the published events `chosen` names.
pub(crate) async fn plan_by_name(context: &Context, chosen: &ByName) -> anyhow::Result<Planned> {
    let events = rows::list(&context.pool, &by_name_filter(chosen)).await?;
    let queues = queues(context, chosen.listener.as_deref())?;
    let tasks = plan(context, &events, &queues, chosen.listener.as_deref())?;
    Ok(Planned {
        events: events.len(),
        queues,
        tasks,
    })
}

/// The published events named `chosen.name` created in its window.
fn by_name_filter(chosen: &ByName) -> Filter {
    Filter {
        name: Some(chosen.name.clone()),
        published: Some(true),
        since: Some(chosen.since),
        until: chosen.until,
        limit: None,
        newest_first: false,
    }
}

/// Queues `planned`, in batches; what was queued. An error says how many
/// tasks were queued before it.
pub(crate) async fn enqueue(
    context: &Context,
    planned: &[(Uuid, NewTask)],
) -> anyhow::Result<Vec<Replayed>> {
    let client = context.queue().await?;
    let mut replayed = Vec::with_capacity(planned.len());
    for chunk in planned.chunks(BATCH) {
        let new_tasks: Vec<NewTask> = chunk.iter().map(|(_, task)| task.clone()).collect();
        let results = client
            .enqueue(&new_tasks)
            .await
            .with_context(|| format!("{} task(s) were queued before", replayed.len()))?;
        for ((event_id, task), result) in chunk.iter().zip(results) {
            match result {
                Ok(EnqueueOutcome::Enqueued) => replayed.push(Replayed {
                    event_id: *event_id,
                    queue: task.queue.clone(),
                    task_id: task.id.clone(),
                    task_type: task.task_type.clone(),
                }),
                Ok(EnqueueOutcome::Duplicate) => {
                    anyhow::bail!("task id {} is taken (should not happen)", task.id)
                }
                Err(err) => {
                    return Err(anyhow::Error::new(err).context(format!(
                        "cannot queue the replay of {event_id} ({} task(s) were queued before)",
                        replayed.len()
                    )));
                }
            }
        }
    }
    Ok(replayed)
}

/// Queues `planned`, each event task under its event's id (`--lost`), in
/// batches: what was queued, and what Valkey still had. An error says how
/// many tasks were queued before it.
async fn enqueue_lost(
    context: &Context,
    planned: &[(Uuid, NewTask)],
) -> anyhow::Result<(Vec<Replayed>, Vec<StillQueued>)> {
    let client = context.queue().await?;
    let (mut replayed, mut still_queued) = (Vec::new(), Vec::new());
    for chunk in planned.chunks(BATCH) {
        let new_tasks: Vec<NewTask> = chunk.iter().map(|(_, task)| task.clone()).collect();
        let results = client
            .enqueue(&new_tasks)
            .await
            .with_context(|| format!("{} task(s) were queued before", replayed.len()))?;
        for ((event_id, task), result) in chunk.iter().zip(results) {
            match result.with_context(|| {
                format!(
                    "cannot queue {event_id} again ({} task(s) were queued before)",
                    replayed.len()
                )
            })? {
                EnqueueOutcome::Enqueued => replayed.push(Replayed {
                    event_id: *event_id,
                    queue: task.queue.clone(),
                    task_id: task.id.clone(),
                    task_type: task.task_type.clone(),
                }),
                EnqueueOutcome::Duplicate => still_queued.push(StillQueued {
                    event_id: *event_id,
                    queue: task.queue.clone(),
                }),
            }
        }
    }
    Ok((replayed, still_queued))
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

/// Where the replay goes: every `OUTBOX_QUEUES` queue, as the relay does;
/// one listener's task goes to the outbox queues this service's workers
/// consume (`WORKER_QUEUES`), as its fan-out would.
fn queues(context: &Context, listener: Option<&str>) -> anyhow::Result<Vec<String>> {
    let outbox = context.outbox_queues().to_vec();
    if listener.is_none() {
        return Ok(outbox);
    }
    let consumed: Vec<&str> = context.config.worker.queues.names().collect();
    let queues: Vec<String> = outbox
        .into_iter()
        .filter(|q| consumed.contains(&q.as_str()))
        .collect();
    if queues.is_empty() {
        anyhow::bail!(
            "no queue of OUTBOX_QUEUES ({}) is in WORKER_QUEUES ({}), so no worker of this \
             service would run the listener; nothing was replayed",
            context.config.outbox.queues,
            context.config.worker.queues
        );
    }
    Ok(queues)
}

/// One task per event and queue (`--lost`): under its event's id, as the
/// relay queued it; for an event of an ordered key whose number the queue's
/// chains no longer keep (Valkey lost them) while the queue has its task
/// still (the chains alone were lost, so its runs' tasks may be there
/// too), a recovery instead, which takes the event's turn for the ordered
/// listeners under new run ids (the others run from its own task).
async fn plan_lost(
    context: &Context,
    events: &[EventRow],
    queues: &[String],
) -> anyhow::Result<Vec<(Uuid, NewTask)>> {
    let retention = context.config.outbox.task_retention;
    let ordering = context.ordering().await?;
    let client = context.queue().await?;
    let mut planned = Vec::with_capacity(events.len() * queues.len());
    for event in events {
        let envelope = event.envelope();
        let place = Place::of(&event.metadata);
        for queue in queues {
            let lost_its_turn = match &place {
                Some(place) => {
                    !ordering.knows(queue, &place.key, place.epoch).await?
                        && client.task_exists(queue, &event.id.to_string()).await?
                }
                None => false,
            };
            let task = if lost_its_turn {
                recovery_task(&envelope, queue, retention)
            } else {
                event_task(&envelope, event.id.to_string(), queue, retention)
            };
            planned.push((event.id, task));
        }
    }
    Ok(planned)
}

/// One new task per event and queue, each with a new id.
fn plan(
    context: &Context,
    events: &[EventRow],
    queues: &[String],
    listener: Option<&str>,
) -> anyhow::Result<Vec<(Uuid, NewTask)>> {
    let retention = context.config.outbox.task_retention;
    let mut planned = Vec::with_capacity(events.len() * queues.len());
    for event in events {
        let task_type = match listener {
            None => event_task_type(&event.name),
            Some(name) => {
                let listeners = context.listeners.of(&event.name);
                if !listeners.iter().any(|l| l.name() == name) {
                    let known: Vec<&str> = listeners.iter().map(|l| l.name()).collect();
                    anyhow::bail!(
                        "event `{}` ({}) has no listener `{name}` in this service (its \
                         listeners: {}); nothing was replayed",
                        event.name,
                        event.id,
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    );
                }
                listener_task_type(&event.name, name)
            }
        };
        let payload = serde_json::to_vec(&event.envelope())?;
        for queue in queues {
            let task = NewTask::new(
                task_type.clone(),
                tasks::new_task_id().to_string(),
                payload.clone(),
            )
            .queue(queue)
            .max_retry(MAX_RETRY)
            .timeout(TASK_TIMEOUT)
            .retention(retention);
            planned.push((event.id, task));
        }
    }
    Ok(planned)
}
