//! From an event to its tasks in the queue. The relay queues the event as
//! `event:<name>` with the event id as task id, in each queue of
//! `OUTBOX_QUEUES`; the fan-out queues `listener:<name>:<listener>` in the
//! same queue with the id `listener_task_id(event id, listener)`. So both
//! are found by key, without scanning. Tasks of a replay have new ids and
//! are not followed here (`outbox replay` prints them).

use serde::Serialize;
use uuid::Uuid;

use super::Context;
use super::rows::EventRow;
use crate::outbox::relay::event_task_type;
use crate::queue::{Client, QueueError, TaskInfo};
use crate::worker::task_names::{listener_task_id, listener_task_type};

/// What `show` reports for a task that is not in the queue: not queued yet
/// (the relay or the fan-out has not run), or gone (deleted after its
/// retention, or by hand).
pub(crate) const MISSING: &str = "missing";

/// One listener's task for an event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct ListenerTask {
    pub(crate) listener: String,
    /// The listener's retry policy as `WORKER_RETRIES` writes it
    /// (`retries:25,timeout:30m,backoff:asynq`): what its next task gets.
    pub(crate) policy: String,
    #[serde(flatten)]
    pub(crate) task: TaskInfo,
}

/// An event's task in each outbox queue and each listener's task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct EventTasks {
    pub(crate) event_tasks: Vec<TaskInfo>,
    pub(crate) listener_tasks: Vec<ListenerTask>,
}

/// Looks up the tasks of `event` in every queue of `OUTBOX_QUEUES`.
pub(crate) async fn of_event(context: &Context, event: &EventRow) -> anyhow::Result<EventTasks> {
    let client = context.queue().await?;
    let id = event.id.to_string();
    let mut tasks = EventTasks {
        event_tasks: Vec::new(),
        listener_tasks: Vec::new(),
    };
    for queue in context.outbox_queues() {
        let task_type = event_task_type(&event.name);
        tasks
            .event_tasks
            .push(lookup(client, queue, &id, &task_type).await?);
        for listener in context.listeners.of(&event.name) {
            let task_id = listener_task_id(event.id, listener.name()).to_string();
            let task_type = listener_task_type(&event.name, listener.name());
            tasks.listener_tasks.push(ListenerTask {
                listener: listener.name().to_string(),
                policy: listener.policy().to_string(),
                task: lookup(client, queue, &task_id, &task_type).await?,
            });
        }
    }
    Ok(tasks)
}

/// The task, or a [`MISSING`] one with what it would be.
async fn lookup(
    client: &Client,
    queue: &str,
    id: &str,
    task_type: &str,
) -> Result<TaskInfo, QueueError> {
    Ok(client
        .task_info(queue, id)
        .await?
        .unwrap_or_else(|| TaskInfo {
            queue: queue.to_string(),
            id: id.to_string(),
            task_type: task_type.to_string(),
            state: MISSING.to_string(),
            retried: 0,
            max_retry: 0,
            last_error: None,
            last_failed_at: None,
            next_process_at: None,
            archived_at: None,
            completed_at: None,
        }))
}

/// A new id for a replayed task: time-ordered, never used before.
pub(crate) fn new_task_id() -> Uuid {
    Uuid::now_v7()
}
