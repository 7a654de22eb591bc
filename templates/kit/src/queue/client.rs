//! The connection to Valkey and the producer side: [`Client::enqueue`]
//! writes a batch of [`NewTask`]s in one pipelined round trip.
//!
//! A [`Client`] wraps one multiplexed, self-reconnecting [`Connection`]
//! (see [`super::connection`]); clones share it, so the relay, the consumer
//! and every handler use one socket, never one per task.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use prost::Message as _;

use super::connection::{Connection, Target};
use super::message::TaskMessage;
use super::wakeup::{self, Enqueued};
use super::{QueueError, keys, scripts};
pub(crate) use crate::config::DEFAULT_QUEUE;
use crate::config::ValkeyConfig;

/// Go asynq's default number of retries.
pub(crate) const DEFAULT_MAX_RETRY: u32 = 25;
/// Go asynq's default timeout of one run.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// A handle on Valkey for enqueuing tasks and running a
/// [`Consumer`](super::Consumer). Cheap to clone; clones share the
/// connection.
#[derive(Clone)]
pub(crate) struct Client {
    conn: Connection,
    /// Wakes idle consumers after each enqueue (see [`wakeup`]).
    enqueued: Enqueued,
    /// The ids of each queue's oldest pending tasks at the last dequeue,
    /// oldest first, which the next dequeue expects (see
    /// [`scripts::DEQUEUE`]).
    pub(super) oldest_pending: Arc<Mutex<HashMap<String, Vec<Vec<u8>>>>>,
}

/// A task to enqueue. The id is the deduplication key: while a task with
/// the same id exists in the queue (pending, running, waiting for a retry,
/// archived, or completed within its retention), enqueuing it again reports
/// [`EnqueueOutcome::Duplicate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NewTask {
    /// `event:<name>`, `listener:<event>:<listener>`, `job:<name>` ...
    pub(crate) task_type: String,
    /// The task id, the deduplication key.
    pub(crate) id: String,
    /// The task's payload, as the handler receives it.
    pub(crate) payload: Vec<u8>,
    /// Key-value metadata for the handler (asynq's task headers), such as
    /// a tenant or trace context. Empty by default.
    pub(crate) headers: BTreeMap<String, String>,
    /// The queue the task goes to.
    pub(crate) queue: String,
    /// Retries after the first run fails; the task is archived after that.
    pub(crate) max_retry: u32,
    /// How long one run may take. Stored in whole seconds (rounded up),
    /// never zero, since a Go worker rejects tasks without a timeout.
    pub(crate) timeout: Duration,
    /// How long the task stays in `:completed` after success, deduplicating
    /// its id. Zero deletes it at once. Whole seconds.
    pub(crate) retention: Duration,
    /// Whether the enqueue leaves the task out when its id was cancelled
    /// before the fan-out made it ([`EnqueueOutcome::Cancelled`]).
    pub(crate) unless_cancelled: bool,
}

/// What happened to one task of a batch that reached Valkey.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EnqueueOutcome {
    /// The task was added to its queue's pending list.
    Enqueued,
    /// A task with this id is already in the queue; nothing was written.
    /// For the outbox relay and the fan-out this counts as delivered.
    Duplicate,
    /// The task's id was cancelled before it was made (`outbox cancel`;
    /// [`NewTask::unless_cancelled_before`]); nothing was written.
    Cancelled,
}

impl NewTask {
    /// A task for the default queue, with Go asynq's defaults: 25 retries,
    /// a 30-minute timeout and no retention.
    pub(crate) fn new(
        task_type: impl Into<String>,
        id: impl Into<String>,
        payload: Vec<u8>,
    ) -> Self {
        Self {
            task_type: task_type.into(),
            id: id.into(),
            payload,
            headers: BTreeMap::new(),
            queue: DEFAULT_QUEUE.to_string(),
            max_retry: DEFAULT_MAX_RETRY,
            timeout: DEFAULT_TIMEOUT,
            retention: Duration::ZERO,
            unless_cancelled: false,
        }
    }

    /// Sets the queue.
    pub(crate) fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = queue.into();
        self
    }

    /// Sets the headers.
    pub(crate) fn headers(mut self, headers: BTreeMap<String, String>) -> Self {
        self.headers = headers;
        self
    }

    /// Sets the retries after the first failed run.
    pub(crate) fn max_retry(mut self, max_retry: u32) -> Self {
        self.max_retry = max_retry;
        self
    }

    /// Sets how long one run may take.
    pub(crate) fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets how long the task stays in `:completed` after success.
    pub(crate) fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// Leaves the task out when its id was cancelled before it was made
    /// (the fan-out's listener tasks).
    pub(crate) fn unless_cancelled_before(mut self) -> Self {
        self.unless_cancelled = true;
        self
    }

    /// The message as Go asynq's `Client.Enqueue` would store it.
    pub(crate) fn to_message(&self) -> Result<TaskMessage, QueueError> {
        for (what, value) in [
            ("type", &self.task_type),
            ("id", &self.id),
            ("queue", &self.queue),
        ] {
            if value.trim().is_empty() {
                return Err(QueueError::InvalidTask(format!("the task {what} is empty")));
            }
        }
        Ok(TaskMessage {
            r#type: self.task_type.clone(),
            payload: self.payload.clone(),
            headers: self.headers.clone(),
            id: self.id.clone(),
            queue: self.queue.clone(),
            retry: i32::try_from(self.max_retry).unwrap_or(i32::MAX),
            timeout: whole_seconds(self.timeout).max(1),
            retention: whole_seconds(self.retention),
            ..TaskMessage::default()
        })
    }
}

/// Seconds, rounded up.
fn whole_seconds(duration: Duration) -> i64 {
    let seconds = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    i64::try_from(seconds).unwrap_or(i64::MAX)
}

impl Client {
    /// Connects to `addr` (`host:port`) and PINGs, so that a wrong address
    /// or password fails at start-up rather than at the first enqueue (the
    /// kit's tests; the kit connects with [`Client::from_config`]).
    #[cfg(test)]
    pub(crate) async fn connect(
        addr: &str,
        password: Option<&secrecy::SecretString>,
        db: u32,
    ) -> Result<Self, QueueError> {
        Self::from_config(&ValkeyConfig {
            addr: Some(addr.to_string()),
            password: password.cloned(),
            db: Some(db),
            ..ValkeyConfig::default()
        })
        .await
    }

    /// Connects with the project's `VALKEY_*` settings (an address, a URL
    /// or a Sentinel group) and PINGs.
    pub(crate) async fn from_config(config: &ValkeyConfig) -> Result<Self, QueueError> {
        let conn = Target::from_config(config)?.connect().await?;
        Ok(Self {
            conn,
            enqueued: Enqueued::default(),
            oldest_pending: Arc::default(),
        })
    }

    /// The shared connection, for commands of other modules (the
    /// scheduler's lease and state).
    pub(crate) fn connection(&self) -> Connection {
        self.conn.clone()
    }

    /// The signal every enqueue through this client (and its clones) gives.
    pub(crate) fn enqueued(&self) -> &Enqueued {
        &self.enqueued
    }

    /// A dedicated connection subscribed to `channel`.
    pub(crate) async fn subscribe(&self, channel: &str) -> Result<redis::aio::PubSub, QueueError> {
        self.conn.target().subscribe(channel).await
    }

    /// The channel a script that enqueues publishes its queue on (the
    /// wake-up of consumers in other processes), or `""` when they are
    /// not woken so.
    pub(crate) fn wake_channel(&self) -> &'static str {
        if self.enqueued.publish() {
            wakeup::CHANNEL
        } else {
            ""
        }
    }

    /// Another module's script enqueued tasks (the chains of ordered
    /// listeners put their next runs in the queue themselves): wakes this
    /// process's idle consumers, as [`Client::enqueue`] does.
    pub(crate) fn enqueued_by_script(&self) {
        self.enqueued.signal();
    }

    /// Enqueues a batch of tasks in one pipelined round trip, each with Go
    /// asynq's enqueue script, and registers their queues in `asynq:queues`.
    ///
    /// The outer error means the round trip failed and nothing is known.
    /// Otherwise there is one result per task, in order: an invalid task or
    /// a command the server refused is an `Err` for that task alone.
    pub(crate) async fn enqueue(
        &self,
        tasks: &[NewTask],
    ) -> Result<Vec<Result<EnqueueOutcome, QueueError>>, QueueError> {
        let messages: Vec<Result<TaskMessage, QueueError>> =
            tasks.iter().map(NewTask::to_message).collect();
        let valid: Vec<(&TaskMessage, bool)> = messages
            .iter()
            .zip(tasks)
            .filter_map(|(m, task)| Some((m.as_ref().ok()?, task.unless_cancelled)))
            .collect();
        let replies = if valid.is_empty() {
            Vec::new()
        } else {
            let replies = self.run_enqueue_scripts(&valid).await?;
            self.enqueued.signal();
            replies
        };

        let mut replies = replies.into_iter();
        Ok(messages
            .into_iter()
            .map(|message| {
                message?;
                match replies.next() {
                    Some(Ok(1)) => Ok(EnqueueOutcome::Enqueued),
                    Some(Ok(0)) => Ok(EnqueueOutcome::Duplicate),
                    Some(Ok(-1)) => Ok(EnqueueOutcome::Cancelled),
                    Some(Ok(other)) => Err(QueueError::UnexpectedReply(format!(
                        "the enqueue script returned {other}"
                    ))),
                    Some(Err(err)) => Err(QueueError::Redis(err)),
                    None => Err(QueueError::UnexpectedReply(
                        "fewer replies than tasks".into(),
                    )),
                }
            })
            .collect())
    }

    /// One pipeline: the enqueue script for each message, in order, each
    /// with whether it is left out when cancelled before it was made.
    async fn run_enqueue_scripts(
        &self,
        batch: &[(&TaskMessage, bool)],
    ) -> redis::RedisResult<Vec<redis::RedisResult<i64>>> {
        let now_ns = Utc::now().timestamp_nanos_opt().unwrap_or_default();
        let messages: Vec<&TaskMessage> = batch.iter().map(|(message, _)| *message).collect();
        let mut queues: Vec<&str> = messages.iter().map(|m| m.queue.as_str()).collect();
        queues.sort_unstable();
        queues.dedup();
        let invocations: Vec<_> = batch
            .iter()
            .map(|(message, unless_cancelled)| {
                let mut invocation = scripts::ENQUEUE.prepare_invoke();
                invocation
                    .key(keys::task(&message.queue, &message.id))
                    .key(keys::pending(&message.queue));
                if *unless_cancelled {
                    invocation.key(keys::cancelled_before(&message.queue));
                }
                invocation
                    .arg(message.encode_to_vec())
                    .arg(&message.id)
                    .arg(now_ns);
                invocation
            })
            .collect();

        // SCRIPT LOAD first, in the same pipeline, so that the EVALSHAs
        // after it never meet NOSCRIPT (a restarted or flushed server):
        // always exactly one round trip.
        let mut conn = self.conn.clone();
        if conn.is_cluster() {
            let replies = Self::run_per_queue(&mut conn, &messages, &queues, &invocations).await?;
            if self.enqueued.publish() {
                // Best effort, like the wake-up itself: consumers poll anyway.
                let published = redis::cmd("PUBLISH")
                    .arg(wakeup::CHANNEL)
                    .arg(queues.join(","))
                    .query_async::<i64>(&mut conn)
                    .await;
                if let Err(err) = published {
                    tracing::debug!(error = %err, "could not publish the enqueue wake-up");
                }
            }
            return Ok(replies);
        }
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        pipe.load_script(&scripts::ENQUEUE).ignore();
        pipe.sadd(keys::ALL_QUEUES, &queues).ignore();
        for invocation in &invocations {
            pipe.invoke_script(invocation);
        }
        if self.enqueued.publish() {
            pipe.publish(wakeup::CHANNEL, queues.join(",")).ignore();
        }
        pipe.query_async(&mut conn).await
    }

    /// In a cluster, a pipeline stays within one slot: `asynq:queues` on its
    /// own, then one pipeline per queue (its keys share the `{queue}` tag).
    /// The replies come back in the order of `messages`.
    async fn run_per_queue(
        conn: &mut Connection,
        messages: &[&TaskMessage],
        queues: &[&str],
        invocations: &[redis::ScriptInvocation<'_>],
    ) -> redis::RedisResult<Vec<redis::RedisResult<i64>>> {
        redis::cmd("SADD")
            .arg(keys::ALL_QUEUES)
            .arg(queues)
            .query_async::<()>(conn)
            .await?;
        let mut replies: Vec<Option<redis::RedisResult<i64>>> =
            messages.iter().map(|_| None).collect();
        for queue in queues {
            let indexes: Vec<usize> = (0..messages.len())
                .filter(|i| messages[*i].queue == *queue)
                .collect();
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            pipe.load_script(&scripts::ENQUEUE).ignore();
            for i in &indexes {
                pipe.invoke_script(&invocations[*i]);
            }
            let results: Vec<redis::RedisResult<i64>> = pipe.query_async(conn).await?;
            for (i, result) in indexes.into_iter().zip(results) {
                replies[i] = Some(result);
            }
        }
        Ok(replies.into_iter().flatten().collect())
    }

    /// The shared connection, for the consumer's commands.
    pub(super) fn conn(&self) -> Connection {
        self.conn.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_task_has_go_asynq_defaults_and_a_timeout() {
        let message = NewTask::new("event:orderPlaced", "id-1", b"{}".to_vec())
            .timeout(Duration::from_millis(1500))
            .to_message()
            .unwrap();
        assert_eq!(message.queue, "default");
        assert_eq!(message.retry, 25);
        assert_eq!(message.timeout, 2, "rounded up to whole seconds");
        assert_eq!(message.retention, 0);

        let zero = NewTask::new("t", "id", vec![]).timeout(Duration::ZERO);
        assert_eq!(zero.to_message().unwrap().timeout, 1, "never zero");
    }

    #[test]
    fn blank_ids_are_refused() {
        let err = NewTask::new("t", " ", vec![]).to_message().unwrap_err();
        assert!(err.to_string().contains("id is empty"), "{err}");
    }
}
