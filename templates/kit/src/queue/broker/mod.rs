//! The consumer's state changes of a task, each one Go asynq script (or
//! command) with Go asynq's arguments: dequeue under a lease, extend
//! leases, done / completed, retry, archive, requeue. Beside them:
//! - [`periodic`]: the forward, lease recovery and completed-task cleanup;
//! - [`deferral`]: the kit's own two, for the limits on listeners: a
//!   deferral (active to `:scheduled`, as Go's schedule leaves a task, no
//!   retry counted) and the promotion of deferred tasks back to pending
//!   before they are due;
//! - [`server_state`]: the server state asynqmon's Servers page reads.

mod deferral;
mod periodic;
mod server_state;

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use prost::Message as _;

use super::message::TaskMessage;
use super::{Client, QueueError, keys, scripts};
pub(super) use deferral::due_score;
pub(crate) use deferral::snoozes_of;

/// How long daily and total counters live (Go: `statsTTL`).
const STATS_TTL: TimeDelta = TimeDelta::days(90);
/// Archived tasks older than this are deleted (Go: `archivedExpirationInDays`).
const ARCHIVE_EXPIRY: TimeDelta = TimeDelta::days(90);
/// At most this many archived tasks are kept per queue (Go: `maxArchiveSize`).
const MAX_ARCHIVE_SIZE: i64 = 10_000;
/// How many archived tasks one trim script deletes at most.
const TRIM_BATCH: usize = 100;
/// How many ids of the oldest pending tasks a dequeue asks for, to expect
/// them at the next one: more than most dequeues take, so that ids another
/// consumer took meanwhile can be skipped, but few, since each call sends
/// them all.
const TAIL_IDS: usize = 16;
/// How many times in a row a dequeue may find the tasks it expected taken
/// by other consumers before it gives up for this round (it never sleeps
/// on a miss: each try learns the ids of the oldest tasks now).
const DEQUEUE_ATTEMPTS: usize = 100;

/// Ids or messages as Valkey holds them, bytes that need not be UTF-8.
type RawList = Vec<Vec<u8>>;

/// A task taken by a dequeue.
pub(super) enum Dequeued {
    /// Its message, ready to run.
    Task(TaskMessage),
    /// A task whose stored message is not a valid `TaskMessage` (nor may
    /// its id be UTF-8): moved to active as any other, to be archived.
    Undecodable {
        queue: String,
        id: Vec<u8>,
        encoded: Vec<u8>,
        error: prost::DecodeError,
    },
}

impl Client {
    /// Takes up to `max` pending tasks of the first queue in `queues` that
    /// has any, moving them to active under a lease that expires at
    /// `lease_until`. Empty when every queue is empty or paused.
    pub(super) async fn dequeue(
        &self,
        queues: &[String],
        lease_until: DateTime<Utc>,
        max: usize,
    ) -> Result<Vec<Dequeued>, QueueError> {
        for queue in queues {
            let taken = self.dequeue_from(queue, lease_until, max).await?;
            if !taken.is_empty() {
                return Ok(taken);
            }
        }
        Ok(Vec::new())
    }

    /// [`scripts::DEQUEUE`] on `queue`: the script is given the ids of the
    /// oldest pending tasks as the last dequeue left them (raw bytes, as
    /// Valkey holds them), and moves those still oldest. Another consumer
    /// taking tasks at the same moment makes some of them, or all, miss:
    /// then the next try, at once, expects the ids the script reported.
    /// Empty only when nothing is pending (or the queue is paused), or
    /// after [`DEQUEUE_ATTEMPTS`] misses in a row.
    async fn dequeue_from(
        &self,
        queue: &str,
        lease_until: DateTime<Utc>,
        max: usize,
    ) -> Result<Vec<Dequeued>, QueueError> {
        let mut conn = self.conn();
        let mut expected = self
            .oldest_pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(queue)
            .cloned()
            .unwrap_or_default();
        for _ in 0..DEQUEUE_ATTEMPTS {
            expected.truncate(max);
            let mut invocation = scripts::DEQUEUE.prepare_invoke();
            invocation
                .key(keys::pending(queue))
                .key(keys::paused(queue))
                .key(keys::active(queue))
                .key(keys::lease(queue))
                .arg(lease_until.timestamp())
                .arg(TAIL_IDS);
            for id in &expected {
                invocation.key(keys::task_of(queue, id)).arg(id.as_slice());
            }
            let (ids, messages, mut oldest): (RawList, RawList, RawList) =
                invocation.invoke_async(&mut conn).await?;
            // LRANGE lists them newest first; the oldest is expected first.
            oldest.reverse();
            if !ids.is_empty() {
                self.remember_oldest(queue, oldest);
                return Ok(ids
                    .into_iter()
                    .zip(messages)
                    .map(
                        |(id, encoded)| match TaskMessage::decode(encoded.as_slice()) {
                            Ok(message) => Dequeued::Task(message),
                            Err(error) => Dequeued::Undecodable {
                                queue: queue.to_string(),
                                id,
                                encoded,
                                error,
                            },
                        },
                    )
                    .collect());
            }
            if oldest.is_empty() {
                self.remember_oldest(queue, oldest);
                return Ok(Vec::new());
            }
            self.remember_oldest(queue, oldest.clone());
            expected = oldest;
        }
        tracing::debug!(%queue, "every dequeue missed; other consumers are taking the tasks");
        Ok(Vec::new())
    }

    /// Keeps `oldest`, the ids of `queue`'s oldest pending tasks, for the
    /// next dequeue to expect.
    fn remember_oldest(&self, queue: &str, oldest: RawList) {
        let mut cache = self
            .oldest_pending
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match cache.get_mut(queue) {
            Some(known) => *known = oldest,
            None => {
                cache.insert(queue.to_string(), oldest);
            }
        }
    }

    /// Pushes the leases of running tasks to `lease_until`, in one round
    /// trip. `ZADD XX` leaves alone ids no longer leased (recovered).
    pub(super) async fn extend_leases(
        &self,
        leases: &[(String, Vec<String>)],
        lease_until: DateTime<Utc>,
    ) -> Result<(), QueueError> {
        let score = lease_until.timestamp();
        let mut conn = self.conn();
        // In a cluster each queue is its own slot: one pipeline per queue.
        let groups: Vec<&[(String, Vec<String>)]> = if conn.is_cluster() {
            leases.chunks(1).collect()
        } else {
            vec![leases]
        };
        for group in groups {
            let mut pipe = redis::pipe();
            for (queue, ids) in group {
                let members: Vec<(i64, &str)> = ids.iter().map(|id| (score, id.as_str())).collect();
                pipe.cmd("ZADD")
                    .arg(keys::lease(queue))
                    .arg("XX")
                    .arg(members)
                    .ignore();
            }
            pipe.query_async::<()>(&mut conn).await?;
        }
        Ok(())
    }

    /// Success: deletes each task, or keeps it in `:completed` for its
    /// retention so that its id keeps deduplicating, in one script call
    /// for tasks of one queue. Returns, per task, whether it was still
    /// active (one that was not is left as it is).
    pub(super) async fn complete(
        &self,
        queue: &str,
        messages: &[&TaskMessage],
    ) -> Result<Vec<bool>, QueueError> {
        let now = Utc::now();
        let mut invocation = scripts::COMPLETE.prepare_invoke();
        invocation
            .key(keys::active(queue))
            .key(keys::lease(queue))
            .key(keys::completed(queue))
            .key(keys::processed_on(queue, now))
            .key(keys::processed_total(queue))
            .arg((now + STATS_TTL).timestamp())
            .arg(i64::MAX);
        for message in messages {
            let task = keys::task(queue, &message.id);
            let unique = if message.unique_key.is_empty() {
                task.clone()
            } else {
                message.unique_key.clone()
            };
            invocation.key(task).key(unique).arg(&message.id);
            if message.retention <= 0 {
                invocation.arg(0).arg("");
            } else {
                let completed = TaskMessage {
                    completed_at: now.timestamp(),
                    ..(*message).clone()
                };
                invocation
                    .arg(now.timestamp() + message.retention)
                    .arg(completed.encode_to_vec());
            }
            invocation.arg(u8::from(!message.unique_key.is_empty()));
        }
        let moved: Vec<i64> = invocation.invoke_async(&mut self.conn()).await?;
        if moved.len() != messages.len() {
            return Err(QueueError::UnexpectedReply(format!(
                "the complete script answered for {} tasks of {}",
                moved.len(),
                messages.len()
            )));
        }
        Ok(moved.into_iter().map(|moved| moved == 1).collect())
    }

    /// Failure with retries left: the task waits in `:retry` until
    /// `retry_at`, with `retried` counted up and the error recorded. With a
    /// `lease_cutoff` (recovery), only if its lease still ends by then.
    pub(super) async fn retry(
        &self,
        message: &TaskMessage,
        retry_at: DateTime<Utc>,
        error: &str,
        lease_cutoff: Option<DateTime<Utc>>,
    ) -> Result<(), QueueError> {
        let queue = &message.queue;
        let now = Utc::now();
        let mut failed = message.clone();
        failed.retried = failed.retried.saturating_add(1);
        failed.error_msg = error.to_string();
        failed.last_failed_at = now.timestamp();
        scripts::RETRY
            .key(keys::task(queue, &message.id))
            .key(keys::active(queue))
            .key(keys::lease(queue))
            .key(keys::retry(queue))
            .key(keys::processed_on(queue, now))
            .key(keys::failed_on(queue, now))
            .key(keys::processed_total(queue))
            .key(keys::failed_total(queue))
            .arg(&message.id)
            .arg(failed.encode_to_vec())
            .arg(retry_at.timestamp())
            .arg((now + STATS_TTL).timestamp())
            .arg(1)
            .arg(i64::MAX)
            .arg(lease_cutoff.map_or(i64::MAX, |cutoff| cutoff.timestamp()))
            .invoke_async::<()>(&mut self.conn())
            .await?;
        Ok(())
    }

    /// Failure without retries left: the task moves to `:archived`, where
    /// asynqmon can show it and run it again. With a `lease_cutoff`
    /// (recovery), only if its lease still ends by then.
    pub(super) async fn archive(
        &self,
        message: &TaskMessage,
        error: &str,
        lease_cutoff: Option<DateTime<Utc>>,
    ) -> Result<(), QueueError> {
        let mut archived = message.clone();
        archived.error_msg = error.to_string();
        archived.last_failed_at = Utc::now().timestamp();
        let id = message.id.as_bytes();
        self.archive_encoded(&message.queue, id, &archived.encode_to_vec(), lease_cutoff)
            .await
    }

    /// Archives a dequeued task whose message does not decode, keeping its
    /// bytes as they are (there is no message to record the error in).
    pub(super) async fn archive_undecodable(
        &self,
        queue: &str,
        id: &[u8],
        encoded: &[u8],
    ) -> Result<(), QueueError> {
        self.archive_encoded(queue, id, encoded, None).await
    }

    /// [`scripts::ARCHIVE`] of the task `id` with `encoded` as its message,
    /// then the trim when the archive is full or holds expired tasks.
    async fn archive_encoded(
        &self,
        queue: &str,
        id: &[u8],
        encoded: &[u8],
        lease_cutoff: Option<DateTime<Utc>>,
    ) -> Result<(), QueueError> {
        let now = Utc::now();
        let (archived_count, oldest): (i64, Option<f64>) = scripts::ARCHIVE
            .key(keys::task_of(queue, id))
            .key(keys::active(queue))
            .key(keys::lease(queue))
            .key(keys::archived(queue))
            .key(keys::processed_on(queue, now))
            .key(keys::failed_on(queue, now))
            .key(keys::processed_total(queue))
            .key(keys::failed_total(queue))
            .arg(id)
            .arg(encoded)
            .arg(now.timestamp())
            .arg((now + STATS_TTL).timestamp())
            .arg(i64::MAX)
            .arg(lease_cutoff.map_or(i64::MAX, |cutoff| cutoff.timestamp()))
            .invoke_async(&mut self.conn())
            .await?;
        let cutoff = (now - ARCHIVE_EXPIRY).timestamp();
        if archived_count >= MAX_ARCHIVE_SIZE || oldest.is_some_and(|score| score <= cutoff as f64)
        {
            let due = self.archived_to_trim(queue, cutoff).await?;
            self.trim_archived(queue, cutoff, due).await?;
        }
        Ok(())
    }

    /// The ids of the archived tasks of `queue` older than `cutoff` or
    /// beyond [`MAX_ARCHIVE_SIZE`] (the oldest ones), as read now.
    async fn archived_to_trim(
        &self,
        queue: &str,
        cutoff: i64,
    ) -> Result<BTreeSet<String>, QueueError> {
        let archived = keys::archived(queue);
        let (old, extra): (Vec<String>, Vec<String>) = redis::pipe()
            .cmd("ZRANGEBYSCORE")
            .arg(&archived)
            .arg("-inf")
            .arg(cutoff)
            .cmd("ZRANGE")
            .arg(&archived)
            .arg(0)
            .arg(-MAX_ARCHIVE_SIZE)
            .query_async(&mut self.conn())
            .await?;
        Ok(old.into_iter().chain(extra).collect())
    }

    /// Deletes those of the archived tasks `ids` (read by
    /// [`Self::archived_to_trim`]) that are still older than `cutoff` or
    /// beyond [`MAX_ARCHIVE_SIZE`], as Go asynq's archive script does:
    /// [`scripts::TRIM_ARCHIVED`] checks each again, so that a task deleted
    /// meanwhile (by asynqmon, or another worker's trim) does not make it
    /// delete more than Go would. Returns how many it deleted.
    async fn trim_archived(
        &self,
        queue: &str,
        cutoff: i64,
        ids: BTreeSet<String>,
    ) -> Result<i64, QueueError> {
        let mut conn = self.conn();
        let archived = keys::archived(queue);
        let mut deleted = 0;
        for chunk in ids.into_iter().collect::<Vec<_>>().chunks(TRIM_BATCH) {
            let mut invocation = scripts::TRIM_ARCHIVED.key(&archived);
            invocation.arg(cutoff).arg(MAX_ARCHIVE_SIZE);
            for id in chunk {
                invocation.key(keys::task(queue, id)).arg(id);
            }
            deleted += invocation.invoke_async::<i64>(&mut conn).await?;
        }
        Ok(deleted)
    }

    /// A run cancelled on a kit worker: the task is deleted, neither
    /// retried nor archived (`scripts::DELETE_ACTIVE`).
    pub(super) async fn delete_active(&self, message: &TaskMessage) -> Result<(), QueueError> {
        let queue = &message.queue;
        scripts::DELETE_ACTIVE
            .key(keys::active(queue))
            .key(keys::lease(queue))
            .key(keys::task(queue, &message.id))
            .arg(&message.id)
            .invoke_async::<()>(&mut self.conn())
            .await?;
        Ok(())
    }

    /// Puts an interrupted task back at the head of pending, unchanged (no
    /// retry counted), so that it runs again as soon as a worker is free.
    pub(super) async fn requeue(&self, message: &TaskMessage) -> Result<(), QueueError> {
        let queue = &message.queue;
        scripts::REQUEUE
            .key(keys::active(queue))
            .key(keys::lease(queue))
            .key(keys::pending(queue))
            .key(keys::task(queue, &message.id))
            .arg(&message.id)
            .invoke_async::<()>(&mut self.conn())
            .await?;
        Ok(())
    }
}

/// Whether `err` is the `LEASED` error of a recovery's retry or archive:
/// another worker has taken the task since its lease was read as expired.
pub(super) fn is_leased(err: &QueueError) -> bool {
    matches!(err, QueueError::Redis(err) if err.code() == Some("LEASED"))
}

/// Whether `err` is the `NOT FOUND` error of Go asynq's scripts: the task
/// is no longer active (already moved on, or deleted meanwhile).
pub(super) fn is_not_found(err: &QueueError) -> bool {
    matches!(err, QueueError::Redis(err) if err.code() == Some("NOT") && err.detail() == Some("FOUND"))
}

/// Go asynq's `DefaultRetryDelayFunc` (Sidekiq's formula): after the n-th
/// failure (n counted from 0), wait n⁴ + 15 + rand(0..30)·(n+1) seconds:
/// about 15–45 s first, 1 min, 2 min, ..., 4.5 days at n = 25.
pub(crate) fn default_retry_delay(retried: u32) -> Duration {
    let n = u64::from(retried);
    let jitter = fastrand::u64(0..30) * (n + 1);
    Duration::from_secs(
        n.saturating_pow(4)
            .saturating_add(15)
            .saturating_add(jitter),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client of Valkey at `VALKEY_ADDR` (as the kit's integration tests),
    /// a plain connection, and a queue of the test's own, whose keys are
    /// deleted at the end.
    async fn test_queue() -> (Client, redis::aio::MultiplexedConnection, String) {
        let addr = std::env::var("VALKEY_ADDR").unwrap_or_else(|_| "127.0.0.1:6379".into());
        let client = Client::connect(&addr, None, 0)
            .await
            .expect("these tests need Valkey or Redis at VALKEY_ADDR (default 127.0.0.1:6379)");
        let redis = redis::Client::open(format!("redis://{addr}/"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        (
            client,
            redis,
            format!("test_{}", uuid::Uuid::now_v7().simple()),
        )
    }

    async fn delete_queue(redis: &mut redis::aio::MultiplexedConnection, queue: &str) {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}*", keys::queue_prefix(queue)))
            .query_async(redis)
            .await
            .unwrap();
        if !keys.is_empty() {
            redis::cmd("DEL")
                .arg(keys)
                .query_async::<()>(redis)
                .await
                .unwrap();
        }
    }

    #[tokio::test]
    async fn the_trim_keeps_as_many_archived_tasks_as_go_when_one_is_deleted_meanwhile() {
        // Arrange: 10,001 archived tasks (Go keeps the newest 9,999); the
        // trim reads the two oldest as due, ...
        let (client, mut redis, queue) = test_queue().await;
        let archived = keys::archived(&queue);
        let now = Utc::now().timestamp();
        let mut fill = redis::pipe();
        for n in 0..10_001_i64 {
            fill.zadd(&archived, format!("t{n:05}"), now - 10_001 + n)
                .ignore();
        }
        fill.query_async::<()>(&mut redis).await.unwrap();
        let cutoff = (Utc::now() - ARCHIVE_EXPIRY).timestamp();
        let due = client.archived_to_trim(&queue, cutoff).await.unwrap();
        assert_eq!(due.len(), 2);
        // ... and asynqmon deletes another one before the trim's script runs.
        redis::cmd("ZREM")
            .arg(&archived)
            .arg("t10000")
            .query_async::<()>(&mut redis)
            .await
            .unwrap();

        // Act
        let deleted = client.trim_archived(&queue, cutoff, due).await.unwrap();

        // Assert
        let left: i64 = redis::cmd("ZCARD")
            .arg(&archived)
            .query_async(&mut redis)
            .await
            .unwrap();
        delete_queue(&mut redis, &queue).await;
        assert_eq!((deleted, left), (1, 9_999));
    }

    #[tokio::test]
    async fn recovery_leaves_a_task_that_another_worker_took_since_its_lease_was_read() {
        // Arrange: a task whose worker died (its lease ran out two minutes
        // ago); the recoverer reads it as expired, ...
        let (client, mut redis, queue) = test_queue().await;
        let message = TaskMessage {
            r#type: "job:raced".into(),
            id: "raced".into(),
            queue: queue.clone(),
            retry: 25,
            timeout: 60,
            ..TaskMessage::default()
        };
        redis::pipe()
            .hset(keys::task(&queue, "raced"), "msg", message.encode_to_vec())
            .hset(keys::task(&queue, "raced"), "state", "active")
            .lpush(keys::active(&queue), "raced")
            .zadd(keys::lease(&queue), "raced", Utc::now().timestamp() - 120)
            .query_async::<()>(&mut redis)
            .await
            .unwrap();
        let cutoff = Utc::now() - TimeDelta::seconds(30);
        let expired = client.lease_expired(&queue, cutoff).await.unwrap();
        assert_eq!(expired.len(), 1);
        // ... but another worker recovers it and takes it again first (its
        // lease, 30 s from now).
        let new_lease = Utc::now().timestamp() + 30;
        redis::cmd("ZADD")
            .arg(keys::lease(&queue))
            .arg(new_lease)
            .arg("raced")
            .query_async::<()>(&mut redis)
            .await
            .unwrap();

        // Act: the first recoverer's move.
        let moved = client
            .retry(
                &expired[0],
                Utc::now(),
                "asynq: task lease expired",
                Some(cutoff),
            )
            .await;

        // Assert: refused; the task is still the new worker's.
        let state: String = redis::cmd("HGET")
            .arg(keys::task(&queue, "raced"))
            .arg("state")
            .query_async(&mut redis)
            .await
            .unwrap();
        let lease: Option<i64> = redis::cmd("ZSCORE")
            .arg(keys::lease(&queue))
            .arg("raced")
            .query_async(&mut redis)
            .await
            .unwrap();
        delete_queue(&mut redis, &queue).await;
        assert!(moved.as_ref().is_err_and(is_leased), "{moved:?}");
        assert_eq!((state.as_str(), lease), ("active", Some(new_lease)));
    }

    #[test]
    fn the_default_retry_delay_is_go_asynqs() {
        for _ in 0..100 {
            let first = default_retry_delay(0).as_secs();
            assert!((15..45).contains(&first), "{first}");
            let third = default_retry_delay(2).as_secs();
            assert!((16 + 15..16 + 15 + 29 * 3 + 1).contains(&third), "{third}");
        }
    }
}
