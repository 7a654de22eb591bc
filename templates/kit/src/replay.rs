//! Delivering published events again: which queues a replay goes to, the
//! new tasks it queues (one per event and queue), and queueing them in
//! batches. `outbox replay` (`crate::operations::replay`, which chooses the
//! events and asks for confirmation) and the console's failures page
//! (`crate::console`) replay through it.
//!
//! The queue still holds an event's tasks for `OUTBOX_TASK_RETENTION` and
//! would refuse their ids as duplicates, so a replay queues the same
//! envelope (same event id, which listeners deduplicate on) under a new
//! task id: an `event:` task, whose fan-out derives new listener task ids
//! from it, or one listener's task alone. The recovery after Valkey lost
//! data (`plan_lost`) queues each event task under the event's id instead,
//! as the relay queued it.

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::follow::rows::{self, EventRow, Filter};
use crate::follow::{Context, tasks};
use crate::outbox::order::Place;
use crate::outbox::relay::{event_task, event_task_type};
use crate::queue::{EnqueueOutcome, NewTask};
use crate::worker::ordering::recovery_task;
use crate::worker::retry_policy::RetryPolicy;
use crate::worker::task_names::listener_task_type;

/// Tasks queued per round trip.
const BATCH: usize = 500;

/// One event task Valkey still had (`--lost`; `--format json`:
/// `{"still_queued": [...]}`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct StillQueued {
    pub(crate) event_id: Uuid,
    pub(crate) queue: String,
}

/// One queued task (`--format json`: `{"replayed": [...]}`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Replayed {
    pub(crate) event_id: Uuid,
    pub(crate) queue: String,
    pub(crate) task_id: String,
    #[serde(rename = "type")]
    pub(crate) task_type: String,
}

/// A replay chosen by name and creation time, as `outbox replay --name`
/// and the console's failures page choose it.
#[derive(Debug, Clone)]
pub(crate) struct ByName {
    pub(crate) name: String,
    pub(crate) since: DateTime<Utc>,
    pub(crate) until: Option<DateTime<Utc>>,
    /// One listener only, or the whole fan-out.
    pub(crate) listener: Option<String>,
}

/// What a replay would queue: the events (oldest first) and the new tasks,
/// one per event and queue, and the queues they go to.
pub(crate) struct Planned {
    pub(crate) events: usize,
    pub(crate) queues: Vec<String>,
    pub(crate) tasks: Vec<(Uuid, NewTask)>,
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
pub(crate) fn by_name_filter(chosen: &ByName) -> Filter {
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
                Ok(EnqueueOutcome::Cancelled) => {
                    anyhow::bail!(
                        "task {} was left out as cancelled (should not happen)",
                        task.id
                    )
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
pub(crate) async fn enqueue_lost(
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
                EnqueueOutcome::Cancelled => {
                    anyhow::bail!(
                        "task {} was left out as cancelled (should not happen)",
                        task.id
                    )
                }
            }
        }
    }
    Ok((replayed, still_queued))
}

/// Where the replay goes: every `OUTBOX_QUEUES` queue, as the relay does;
/// one listener's task goes to the outbox queues this service's workers
/// consume (`WORKER_QUEUES`), as its fan-out would.
pub(crate) fn queues(context: &Context, listener: Option<&str>) -> anyhow::Result<Vec<String>> {
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
pub(crate) async fn plan_lost(
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
pub(crate) fn plan(
    context: &Context,
    events: &[EventRow],
    queues: &[String],
    listener: Option<&str>,
) -> anyhow::Result<Vec<(Uuid, NewTask)>> {
    let retention = context.config.outbox.task_retention;
    let mut planned = Vec::with_capacity(events.len() * queues.len());
    for event in events {
        // Event tasks keep the default policy; a listener's task has its
        // listener's.
        let mut policy = RetryPolicy::default();
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
                if let Some(own) = context.listeners.policy_of(&event.name, name) {
                    policy = own;
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
            .retention(retention);
            let task = policy.apply(task);
            planned.push((event.id, task));
        }
    }
    Ok(planned)
}
