//! Reading the queue as asynqmon does, for the `outbox` command and the
//! worker's metrics: one task's state, a queue's counts per state and its
//! totals (Go's `Inspector.GetQueueInfo`), the archived tasks; asynq's
//! "run", which puts a waiting task back to pending; and pausing a queue
//! and resuming it, as Go's `Inspector.PauseQueue` and `UnpauseQueue` do.

use chrono::{DateTime, Utc};
use prost::Message as _;
use serde::Serialize;

use super::message::TaskMessage;
use super::{Client, QueueError, keys, scripts};

/// One task as it is in Valkey now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct TaskInfo {
    /// The queue the task is in.
    pub(crate) queue: String,
    /// The task id.
    pub(crate) id: String,
    /// `event:<name>`, `listener:<event>:<listener>` ...
    #[serde(rename = "type")]
    pub(crate) task_type: String,
    /// `pending`, `active`, `scheduled`, `retry`, `archived`, `completed`.
    pub(crate) state: String,
    /// Failed runs so far.
    pub(crate) retried: i32,
    /// Retries allowed after the first failed run.
    pub(crate) max_retry: i32,
    /// The error of the last failed run, if any.
    pub(crate) last_error: Option<String>,
    /// When the last run failed, if one did.
    pub(crate) last_failed_at: Option<DateTime<Utc>>,
    /// When a task in `scheduled` or `retry` runs next; when an archived
    /// task was archived.
    pub(crate) next_process_at: Option<DateTime<Utc>>,
    /// When the task was archived, if it is.
    pub(crate) archived_at: Option<DateTime<Utc>>,
    /// When the task completed, if it did.
    pub(crate) completed_at: Option<DateTime<Utc>>,
}

/// How many tasks of a queue are in each state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct QueueCounts {
    /// Waiting to run.
    pub(crate) pending: u64,
    /// Running now.
    pub(crate) active: u64,
    /// Waiting for their time to come.
    pub(crate) scheduled: u64,
    /// Failed, waiting for a retry.
    pub(crate) retry: u64,
    /// Failed for good, kept for inspection.
    pub(crate) archived: u64,
    /// Done, kept for their retention.
    pub(crate) completed: u64,
}

/// A queue's state as Go asynq's `QueueInfo` gives it (and its `x/metrics`
/// collector exports it), without groups, which this kit does not use.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct QueueStats {
    /// The queue's name.
    pub(crate) queue: String,
    /// Its tasks in each state.
    pub(crate) counts: QueueCounts,
    /// Tasks processed (succeeded or failed) since the queue existed.
    pub(crate) processed_total: u64,
    /// Tasks that failed since the queue existed.
    pub(crate) failed_total: u64,
    /// Whether the queue is paused.
    pub(crate) paused: bool,
    /// How long the oldest pending task has waited, in seconds (0 with
    /// none pending).
    pub(crate) latency_seconds: f64,
}

impl QueueStats {
    /// Tasks in the queue, in every state (Go's `QueueInfo.Size`).
    pub(crate) fn size(&self) -> u64 {
        let c = &self.counts;
        c.pending + c.active + c.scheduled + c.retry + c.archived + c.completed
    }
}

/// What asynq's "run" did to a task ([`Client::run_task`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunOutcome {
    /// Moved to pending.
    Queued,
    /// No such task (deleted meanwhile).
    Missing,
    /// Running, or already pending: left as it is.
    AlreadyQueued,
}

/// What [`Client::delete_waiting`] did to a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DeleteOutcome {
    /// Deleted from the state it waited in (`pending`, `scheduled`,
    /// `retry`).
    Deleted(String),
    /// No such task.
    Missing,
    /// Running: left to its worker.
    Active,
    /// In another state (`archived`, `completed`, `aggregating`): left as
    /// it is.
    Left(String),
}

/// The task hash's `msg` and `state`, and the task's scores in `:retry`,
/// `:scheduled` and `:archived`.
type TaskReply = (
    (Option<Vec<u8>>, Option<String>),
    Option<f64>,
    Option<f64>,
    Option<f64>,
);

/// Unix seconds to a time; zero (asynq's "not set") to `None`.
fn time(seconds: i64) -> Option<DateTime<Utc>> {
    (seconds > 0)
        .then(|| DateTime::from_timestamp(seconds, 0))
        .flatten()
}

impl Client {
    /// Whether the queue has the task `id` (in any state).
    pub(crate) async fn task_exists(&self, queue: &str, id: &str) -> Result<bool, QueueError> {
        Ok(redis::cmd("EXISTS")
            .arg(keys::task(queue, id))
            .query_async(&mut self.conn())
            .await?)
    }

    /// The task `id` of `queue`, or `None` when the queue does not hold it.
    pub(crate) async fn task_info(
        &self,
        queue: &str,
        id: &str,
    ) -> Result<Option<TaskInfo>, QueueError> {
        let ((encoded, state), retry_at, scheduled_at, archived_at): TaskReply = redis::pipe()
            .cmd("HMGET")
            .arg(keys::task(queue, id))
            .arg("msg")
            .arg("state")
            .zscore(keys::retry(queue), id)
            .zscore(keys::scheduled(queue), id)
            .zscore(keys::archived(queue), id)
            .query_async(&mut self.conn())
            .await?;
        let (Some(encoded), Some(state)) = (encoded, state) else {
            return Ok(None);
        };
        let message = decode(queue, &encoded)?;
        let seconds = |score: Option<f64>| score.and_then(|s| time(s as i64));
        Ok(Some(TaskInfo {
            queue: queue.to_string(),
            id: id.to_string(),
            task_type: message.r#type,
            state,
            retried: message.retried,
            max_retry: message.retry,
            last_error: Some(message.error_msg).filter(|e| !e.is_empty()),
            last_failed_at: time(message.last_failed_at),
            next_process_at: seconds(retry_at.or(scheduled_at)),
            archived_at: seconds(archived_at),
            completed_at: time(message.completed_at),
        }))
    }

    /// The number of tasks of `queue` in each state, in one round trip.
    pub(crate) async fn queue_counts(&self, queue: &str) -> Result<QueueCounts, QueueError> {
        let (pending, active, scheduled, retry, archived, completed) = redis::pipe()
            .llen(keys::pending(queue))
            .llen(keys::active(queue))
            .zcard(keys::scheduled(queue))
            .zcard(keys::retry(queue))
            .zcard(keys::archived(queue))
            .zcard(keys::completed(queue))
            .query_async(&mut self.conn())
            .await?;
        Ok(QueueCounts {
            pending,
            active,
            scheduled,
            retry,
            archived,
            completed,
        })
    }

    /// The state of `queue` (Go's `Inspector.GetQueueInfo`), in up to three
    /// round trips: the counts, the totals with the oldest pending task,
    /// then (when there is one) when it was queued.
    pub(crate) async fn queue_stats(&self, queue: &str) -> Result<QueueStats, QueueError> {
        let counts = self.queue_counts(queue).await?;
        let (processed_total, failed_total, paused, oldest): (
            Option<u64>,
            Option<u64>,
            bool,
            Vec<Vec<u8>>,
        ) = redis::pipe()
            .get(keys::processed_total(queue))
            .get(keys::failed_total(queue))
            .exists(keys::paused(queue))
            .lrange(keys::pending(queue), -1, -1)
            .query_async(&mut self.conn())
            .await?;
        let mut latency_seconds = 0.0;
        if let Some(id) = oldest.first() {
            let since: Option<i64> = redis::cmd("HGET")
                .arg(keys::task_of(queue, id))
                .arg("pending_since")
                .query_async(&mut self.conn())
                .await?;
            if let Some(since) = since.filter(|ns| *ns > 0) {
                let now = Utc::now().timestamp_nanos_opt().unwrap_or_default();
                latency_seconds = (now - since).max(0) as f64 / 1e9;
            }
        }
        Ok(QueueStats {
            queue: queue.to_string(),
            counts,
            processed_total: processed_total.unwrap_or(0),
            failed_total: failed_total.unwrap_or(0),
            paused,
            latency_seconds,
        })
    }

    /// The archived tasks of `queue` archived at or after `since` (all when
    /// `None`), oldest first, with when each was archived.
    pub(crate) async fn archived_tasks(
        &self,
        queue: &str,
        since: Option<DateTime<Utc>>,
    ) -> Result<Vec<(TaskMessage, DateTime<Utc>)>, QueueError> {
        self.tasks_in(queue, &keys::archived(queue), since).await
    }

    /// The tasks of `queue` waiting for a retry, soonest first, with when
    /// each runs next.
    pub(crate) async fn retry_tasks(
        &self,
        queue: &str,
    ) -> Result<Vec<(TaskMessage, DateTime<Utc>)>, QueueError> {
        self.tasks_in(queue, &keys::retry(queue), None).await
    }

    /// The tasks of the sorted set `set` of `queue` scored at or after
    /// `since`, in score order, with their scores as times.
    async fn tasks_in(
        &self,
        queue: &str,
        set: &str,
        since: Option<DateTime<Utc>>,
    ) -> Result<Vec<(TaskMessage, DateTime<Utc>)>, QueueError> {
        let min = since.map_or_else(|| "-inf".to_string(), |t| t.timestamp().to_string());
        let mut conn = self.conn();
        let ids: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(set)
            .arg(min)
            .arg("+inf")
            .arg("BYSCORE")
            .arg("WITHSCORES")
            .query_async(&mut conn)
            .await?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for (id, _) in &ids {
            pipe.hget(keys::task(queue, id), "msg");
        }
        let messages: Vec<Option<Vec<u8>>> = pipe.query_async(&mut conn).await?;
        let mut tasks = Vec::with_capacity(ids.len());
        for ((_, score), encoded) in ids.into_iter().zip(messages) {
            // Deleted between the two round trips: nothing to run.
            let Some(encoded) = encoded else { continue };
            let scored_at = time(score as i64).unwrap_or_default();
            tasks.push((decode(queue, &encoded)?, scored_at));
        }
        Ok(tasks)
    }

    /// asynq's "run" (`scripts::RUN_TASK`): moves the waiting task `id` of
    /// `queue` to pending, with its message (and retry count) unchanged, as
    /// asynqmon does (the tests' asynqmon; the kit sends a listener task
    /// back with `worker::failures::run_again`).
    #[cfg(test)]
    pub(crate) async fn run_task(&self, queue: &str, id: &str) -> Result<RunOutcome, QueueError> {
        self.run_task_rewritten(queue, id, |_| {}).await
    }

    /// asynq's "run" (`scripts::RUN_TASK`) of the waiting task `id` of
    /// `queue`, its message changed by `rewrite` in the same step as the
    /// move to pending (replaced only if the stored one is still the one
    /// read, and only when `rewrite` changed it). Reads the task's state,
    /// group and message first, for the key of the set it waits in; the
    /// script checks they did not change meanwhile, else it tries again.
    pub(crate) async fn run_task_rewritten(
        &self,
        queue: &str,
        id: &str,
        rewrite: impl Fn(&mut TaskMessage),
    ) -> Result<RunOutcome, QueueError> {
        let mut conn = self.conn();
        let task = keys::task(queue, id);
        for _ in 0..RUN_ATTEMPTS {
            let (state, group, read): (Option<String>, Option<String>, Option<Vec<u8>>) =
                redis::cmd("HMGET")
                    .arg(&task)
                    .arg("state")
                    .arg("group")
                    .arg("msg")
                    .query_async(&mut conn)
                    .await?;
            let state = state.unwrap_or_default();
            let group = group.unwrap_or_default();
            // Unchanged (or not a message at all): moved as it is, and
            // the script is given neither.
            let (rewritten, read) = read
                .and_then(|read| {
                    let stored = TaskMessage::decode(read.as_slice()).ok()?;
                    let mut message = stored.clone();
                    rewrite(&mut message);
                    (message != stored).then(|| (message.encode_to_vec(), read))
                })
                .unwrap_or_default();
            let waiting_in = if state == "aggregating" {
                keys::group(queue, &group)
            } else {
                format!("{}{state}", keys::queue_prefix(queue))
            };
            let outcome: i64 = scripts::RUN_TASK
                .key(&task)
                .key(keys::pending(queue))
                .key(keys::all_groups(queue))
                .key(waiting_in)
                .arg(id)
                .arg(&state)
                .arg(&group)
                .arg(&rewritten)
                .arg(&read)
                .invoke_async(&mut conn)
                .await?;
            match outcome {
                1 => return Ok(RunOutcome::Queued),
                0 => return Ok(RunOutcome::Missing),
                -1 | -2 => return Ok(RunOutcome::AlreadyQueued),
                -3 => continue,
                other => {
                    return Err(QueueError::UnexpectedReply(format!(
                        "the run script returned {other}"
                    )));
                }
            }
        }
        Err(QueueError::UnexpectedReply(format!(
            "task {id} kept changing state; try again"
        )))
    }

    /// Go asynq's delete (`scripts::DELETE_WAITING`) of the task `id` of
    /// `queue`, for a task waiting in pending, `:scheduled` or `:retry`;
    /// one in any other state is left. Reads the task's state first, for
    /// the key of the list or set it waits in; the script checks it did
    /// not change meanwhile, else it tries again.
    pub(crate) async fn delete_waiting(
        &self,
        queue: &str,
        id: &str,
    ) -> Result<DeleteOutcome, QueueError> {
        let mut conn = self.conn();
        let task = keys::task(queue, id);
        for _ in 0..RUN_ATTEMPTS {
            let (state, unique_key): (Option<String>, Option<String>) = redis::cmd("HMGET")
                .arg(&task)
                .arg("state")
                .arg("unique_key")
                .query_async(&mut conn)
                .await?;
            let Some(state) = state else {
                return Ok(DeleteOutcome::Missing);
            };
            let waits_in = match state.as_str() {
                "pending" => keys::pending(queue),
                "scheduled" => keys::scheduled(queue),
                "retry" => keys::retry(queue),
                "active" => return Ok(DeleteOutcome::Active),
                _ => return Ok(DeleteOutcome::Left(state)),
            };
            let unique_key = unique_key.unwrap_or_default();
            let outcome: i64 = scripts::DELETE_WAITING
                .key(&task)
                .key(waits_in)
                .key(if unique_key.is_empty() {
                    &task
                } else {
                    &unique_key
                })
                .arg(id)
                .arg(&state)
                .arg(&unique_key)
                .invoke_async(&mut conn)
                .await?;
            match outcome {
                1 => return Ok(DeleteOutcome::Deleted(state)),
                0 => return Ok(DeleteOutcome::Missing),
                -1 => return Ok(DeleteOutcome::Active),
                -3 => continue,
                other => {
                    return Err(QueueError::UnexpectedReply(format!(
                        "the delete script returned {other}"
                    )));
                }
            }
        }
        Err(QueueError::UnexpectedReply(format!(
            "task {id} kept changing state; try again"
        )))
    }

    /// Asks the worker that runs the task `id` to stop it: its id on
    /// `asynq:cancel`, as asynqmon's Cancel and Go's
    /// `Inspector.CancelProcessing` publish it. How many subscribers (the
    /// workers listening) received it.
    pub(crate) async fn publish_cancel(&self, id: &str) -> Result<i64, QueueError> {
        Ok(redis::cmd("PUBLISH")
            .arg(keys::CANCEL_CHANNEL)
            .arg(id)
            .query_async(&mut self.conn())
            .await?)
    }
}

impl Client {
    /// Pauses `queue` (Go's `Inspector.PauseQueue`: the key `paused`, set
    /// to the time, which every consumer's dequeue checks): its pending
    /// tasks wait until it is resumed. False when it was paused already.
    pub(crate) async fn pause(&self, queue: &str) -> Result<bool, QueueError> {
        let set: bool = redis::cmd("SET")
            .arg(keys::paused(queue))
            .arg(Utc::now().timestamp())
            .arg("NX")
            .query_async(&mut self.conn())
            .await?;
        Ok(set)
    }

    /// Resumes a paused `queue` (Go's `Inspector.UnpauseQueue`). False
    /// when it was not paused.
    pub(crate) async fn resume(&self, queue: &str) -> Result<bool, QueueError> {
        let removed: u64 = redis::cmd("DEL")
            .arg(keys::paused(queue))
            .query_async(&mut self.conn())
            .await?;
        Ok(removed > 0)
    }
}

/// How many times [`Client::run_task`] reads a task whose state keeps
/// changing before it gives up.
const RUN_ATTEMPTS: usize = 3;

fn decode(queue: &str, encoded: &[u8]) -> Result<TaskMessage, QueueError> {
    TaskMessage::decode(encoded).map_err(|source| QueueError::Decode {
        queue: queue.to_string(),
        source,
    })
}
