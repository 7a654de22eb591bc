//! The consumer's state changes of a task, each one Go asynq script (or
//! command) with Go asynq's arguments: dequeue under a lease, extend
//! leases, done / completed, retry, archive, requeue, the periodic
//! forward, lease recovery and completed-task cleanup, and the server state
//! asynqmon's Servers page reads.

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use prost::Message as _;

use super::connection::Connection;
use super::message::{ServerInfo, TaskMessage, WorkerInfo};
use super::{Client, QueueError, keys, scripts};

/// How long daily and total counters live (Go: `statsTTL`).
const STATS_TTL: TimeDelta = TimeDelta::days(90);
/// Archived tasks older than this are deleted (Go: `archivedExpirationInDays`).
const ARCHIVE_EXPIRY: TimeDelta = TimeDelta::days(90);
/// At most this many archived tasks are kept per queue (Go: `maxArchiveSize`).
const MAX_ARCHIVE_SIZE: i64 = 10_000;
/// How many archived tasks one trim script deletes at most.
const TRIM_BATCH: usize = 100;
/// How many expired completed tasks one cleanup script deletes.
const CLEANUP_BATCH: isize = 100;
/// How many due tasks one forward script moves (as Go asynq).
const FORWARD_BATCH: isize = 100;
/// How many times a dequeue may find another task than it expected (taken
/// by another consumer meanwhile) before it counts the queue as empty.
const DEQUEUE_ATTEMPTS: usize = 5;

impl Client {
    /// Takes the next pending task of the first queue in `queues` that has
    /// one, moving it to active under a lease that expires at `lease_until`.
    pub(super) async fn dequeue(
        &self,
        queues: &[String],
        lease_until: DateTime<Utc>,
    ) -> Result<Option<TaskMessage>, QueueError> {
        for queue in queues {
            if let Some(message) = self.dequeue_from(queue, lease_until).await? {
                return Ok(Some(message));
            }
        }
        Ok(None)
    }

    /// [`scripts::DEQUEUE`] on `queue`: the script is given the hash of the
    /// task it expects to be the oldest pending one (as the last dequeue
    /// left it); when another task is, it says which, and the next attempt
    /// expects that one. Another consumer taking tasks at the same moment
    /// makes an attempt miss; after [`DEQUEUE_ATTEMPTS`] misses the queue
    /// counts as empty until the next dequeue.
    async fn dequeue_from(
        &self,
        queue: &str,
        lease_until: DateTime<Utc>,
    ) -> Result<Option<TaskMessage>, QueueError> {
        let mut conn = self.conn();
        let mut expected = self
            .oldest_pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(queue)
            .cloned()
            .unwrap_or_default();
        for _ in 0..DEQUEUE_ATTEMPTS {
            let reply: Vec<redis::Value> = scripts::DEQUEUE
                .key(keys::pending(queue))
                .key(keys::paused(queue))
                .key(keys::active(queue))
                .key(keys::lease(queue))
                .key(keys::task(queue, &expected))
                .arg(lease_until.timestamp())
                .arg(&expected)
                .invoke_async(&mut conn)
                .await?;
            let id = |value: &redis::Value| match value {
                redis::Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => String::new(),
            };
            let (next, message) = match reply.as_slice() {
                [redis::Value::Int(0)] => return Ok(None),
                [redis::Value::Int(1), oldest] => (id(oldest), None),
                [
                    redis::Value::Int(2),
                    redis::Value::BulkString(encoded),
                    next,
                ] => (id(next), Some(encoded.clone())),
                other => {
                    return Err(QueueError::UnexpectedReply(format!(
                        "the dequeue script returned {other:?}"
                    )));
                }
            };
            self.oldest_pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(queue.to_string(), next.clone());
            if let Some(encoded) = message {
                let message = TaskMessage::decode(encoded.as_slice()).map_err(|source| {
                    QueueError::Decode {
                        queue: queue.to_string(),
                        source,
                    }
                })?;
                return Ok(Some(message));
            }
            expected = next;
        }
        Ok(None)
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

    /// Success: deletes the task, or keeps it in `:completed` for its
    /// retention so that its id keeps deduplicating.
    pub(super) async fn complete(&self, message: &TaskMessage) -> Result<(), QueueError> {
        let queue = &message.queue;
        let now = Utc::now();
        let stats_expiry = (now + STATS_TTL).timestamp();
        if message.retention <= 0 {
            let script = if message.unique_key.is_empty() {
                &scripts::DONE
            } else {
                &scripts::DONE_UNIQUE
            };
            let mut invocation = script.prepare_invoke();
            invocation
                .key(keys::active(queue))
                .key(keys::lease(queue))
                .key(keys::task(queue, &message.id))
                .key(keys::processed_on(queue, now))
                .key(keys::processed_total(queue));
            if !message.unique_key.is_empty() {
                invocation.key(&message.unique_key);
            }
            invocation
                .arg(&message.id)
                .arg(stats_expiry)
                .arg(i64::MAX)
                .invoke_async::<()>(&mut self.conn())
                .await?;
        } else {
            let mut completed = message.clone();
            completed.completed_at = now.timestamp();
            let script = if message.unique_key.is_empty() {
                &scripts::MARK_AS_COMPLETE
            } else {
                &scripts::MARK_AS_COMPLETE_UNIQUE
            };
            let mut invocation = script.prepare_invoke();
            invocation
                .key(keys::active(queue))
                .key(keys::lease(queue))
                .key(keys::completed(queue))
                .key(keys::task(queue, &message.id))
                .key(keys::processed_on(queue, now))
                .key(keys::processed_total(queue));
            if !message.unique_key.is_empty() {
                invocation.key(&message.unique_key);
            }
            invocation
                .arg(&message.id)
                .arg(stats_expiry)
                .arg(now.timestamp() + message.retention)
                .arg(completed.encode_to_vec())
                .arg(i64::MAX)
                .invoke_async::<()>(&mut self.conn())
                .await?;
        }
        Ok(())
    }

    /// Failure with retries left: the task waits in `:retry` until
    /// `retry_at`, with `retried` counted up and the error recorded.
    pub(super) async fn retry(
        &self,
        message: &TaskMessage,
        retry_at: DateTime<Utc>,
        error: &str,
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
            .invoke_async::<()>(&mut self.conn())
            .await?;
        Ok(())
    }

    /// Failure without retries left: the task moves to `:archived`, where
    /// asynqmon can show it and run it again.
    pub(super) async fn archive(
        &self,
        message: &TaskMessage,
        error: &str,
    ) -> Result<(), QueueError> {
        let queue = &message.queue;
        let now = Utc::now();
        let mut archived = message.clone();
        archived.error_msg = error.to_string();
        archived.last_failed_at = now.timestamp();
        let (archived_count, oldest): (i64, Option<f64>) = scripts::ARCHIVE
            .key(keys::task(queue, &message.id))
            .key(keys::active(queue))
            .key(keys::lease(queue))
            .key(keys::archived(queue))
            .key(keys::processed_on(queue, now))
            .key(keys::failed_on(queue, now))
            .key(keys::processed_total(queue))
            .key(keys::failed_total(queue))
            .arg(&message.id)
            .arg(archived.encode_to_vec())
            .arg(now.timestamp())
            .arg((now + STATS_TTL).timestamp())
            .arg(i64::MAX)
            .invoke_async(&mut self.conn())
            .await?;
        let cutoff = (now - ARCHIVE_EXPIRY).timestamp();
        if archived_count >= MAX_ARCHIVE_SIZE || oldest.is_some_and(|score| score <= cutoff as f64)
        {
            self.trim_archived(queue, cutoff).await?;
        }
        Ok(())
    }

    /// Deletes the archived tasks of `queue` older than `cutoff` or beyond
    /// [`MAX_ARCHIVE_SIZE`], as Go asynq's archive script does: reads their
    /// ids, then [`scripts::TRIM_ARCHIVED`] deletes those still due.
    async fn trim_archived(&self, queue: &str, cutoff: i64) -> Result<(), QueueError> {
        let mut conn = self.conn();
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
            .query_async(&mut conn)
            .await?;
        let ids: BTreeSet<String> = old.into_iter().chain(extra).collect();
        for chunk in ids.into_iter().collect::<Vec<_>>().chunks(TRIM_BATCH) {
            let mut invocation = scripts::TRIM_ARCHIVED.key(&archived);
            invocation.arg(cutoff).arg(MAX_ARCHIVE_SIZE);
            for id in chunk {
                invocation.key(keys::task(queue, id)).arg(id);
            }
            invocation.invoke_async::<i64>(&mut conn).await?;
        }
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

    /// Moves the due tasks of `:scheduled` and `:retry` to pending: reads
    /// up to [`FORWARD_BATCH`] due ids and their groups, then
    /// [`scripts::FORWARD`] moves those still due, until none is left.
    pub(super) async fn forward_due(&self, queue: &str) -> Result<(), QueueError> {
        let mut conn = self.conn();
        for source in [keys::scheduled(queue), keys::retry(queue)] {
            loop {
                let now = Utc::now();
                let ids = due(&mut conn, &source, now.timestamp(), FORWARD_BATCH).await?;
                if ids.is_empty() {
                    break;
                }
                let mut groups = redis::pipe();
                for id in &ids {
                    groups.hget(keys::task(queue, id), "group");
                }
                let groups: Vec<Option<String>> = groups.query_async(&mut conn).await?;
                let mut invocation = scripts::FORWARD.key(&source);
                invocation
                    .key(keys::pending(queue))
                    .arg(now.timestamp())
                    .arg(now.timestamp_nanos_opt().unwrap_or_default());
                for (id, group) in ids.iter().zip(groups) {
                    let group = group.unwrap_or_default();
                    let task = keys::task(queue, id);
                    let group_key = if group.is_empty() {
                        task.clone()
                    } else {
                        keys::group(queue, &group)
                    };
                    invocation.key(task).key(group_key).arg(id).arg(group);
                }
                let moved: i64 = invocation.invoke_async(&mut conn).await?;
                if moved == 0 || ids.len() < FORWARD_BATCH as usize {
                    break;
                }
            }
        }
        Ok(())
    }

    /// The active tasks whose lease ran out before `cutoff`: their worker
    /// died or lost Valkey. Reads the ids, then their messages; a task
    /// settled in between is left out.
    pub(super) async fn lease_expired(
        &self,
        queue: &str,
        cutoff: DateTime<Utc>,
    ) -> Result<Vec<TaskMessage>, QueueError> {
        let mut conn = self.conn();
        let ids = due(&mut conn, &keys::lease(queue), cutoff.timestamp(), -1).await?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut messages = redis::pipe();
        for id in &ids {
            messages.hget(keys::task(queue, id), "msg");
        }
        let encoded: Vec<Option<Vec<u8>>> = messages.query_async(&mut conn).await?;
        encoded
            .iter()
            .flatten()
            .map(|bytes| {
                TaskMessage::decode(bytes.as_slice()).map_err(|source| QueueError::Decode {
                    queue: queue.to_string(),
                    source,
                })
            })
            .collect()
    }

    /// Deletes the completed tasks whose retention has passed: reads up to
    /// [`CLEANUP_BATCH`] expired ids at a time, then
    /// [`scripts::DELETE_EXPIRED`] deletes those still expired.
    pub(super) async fn delete_expired_completed(&self, queue: &str) -> Result<(), QueueError> {
        let mut conn = self.conn();
        let completed = keys::completed(queue);
        loop {
            let now = Utc::now().timestamp();
            let ids = due(&mut conn, &completed, now, CLEANUP_BATCH).await?;
            if ids.is_empty() {
                return Ok(());
            }
            let mut invocation = scripts::DELETE_EXPIRED.key(&completed);
            invocation.arg(now);
            for id in &ids {
                invocation.key(keys::task(queue, id)).arg(id);
            }
            let deleted: i64 = invocation.invoke_async(&mut conn).await?;
            if deleted == 0 || ids.len() < CLEANUP_BATCH as usize {
                return Ok(());
            }
        }
    }
}

/// Up to `limit` (-1: all) members of the sorted set `key` scored `max` or
/// less, lowest first: the ids of the tasks due by then.
async fn due(
    conn: &mut Connection,
    key: &str,
    max: i64,
    limit: isize,
) -> Result<Vec<String>, QueueError> {
    Ok(redis::cmd("ZRANGEBYSCORE")
        .arg(key)
        .arg("-inf")
        .arg(max)
        .arg("LIMIT")
        .arg(0)
        .arg(limit)
        .query_async(conn)
        .await?)
}

impl Client {
    /// Writes this worker's `ServerInfo` and the `WorkerInfo` of each
    /// running task, expiring after `ttl` unless written again (Go asynq's
    /// `WriteServerState`).
    pub(super) async fn write_server_state(
        &self,
        server: &ServerInfo,
        workers: &[WorkerInfo],
        ttl: Duration,
    ) -> Result<(), QueueError> {
        let pid = u32::try_from(server.pid).unwrap_or(0);
        let server_key = keys::server_info(&server.host, pid, &server.server_id);
        let workers_key = keys::workers(&server.host, pid, &server.server_id);
        let expiry = (Utc::now() + TimeDelta::from_std(ttl).unwrap_or(TimeDelta::MAX)).timestamp();
        let mut invocation = scripts::WRITE_SERVER_STATE.prepare_invoke();
        invocation
            .key(&server_key)
            .key(&workers_key)
            .arg(ttl.as_secs().max(1))
            .arg(server.encode_to_vec());
        for worker in workers {
            invocation.arg(&worker.task_id).arg(worker.encode_to_vec());
        }
        // Two commands, not one pipeline: the keys are in different cluster
        // slots.
        let mut conn = self.conn();
        redis::cmd("ZADD")
            .arg(keys::ALL_SERVERS)
            .arg(expiry)
            .arg(&server_key)
            .query_async::<()>(&mut conn)
            .await?;
        redis::cmd("ZADD")
            .arg(keys::ALL_WORKERS)
            .arg(expiry)
            .arg(&workers_key)
            .query_async::<()>(&mut conn)
            .await?;
        invocation.invoke_async::<()>(&mut conn).await?;
        Ok(())
    }

    /// Removes this worker's server state (at shutdown).
    pub(super) async fn clear_server_state(&self, server: &ServerInfo) -> Result<(), QueueError> {
        let pid = u32::try_from(server.pid).unwrap_or(0);
        let server_key = keys::server_info(&server.host, pid, &server.server_id);
        let workers_key = keys::workers(&server.host, pid, &server.server_id);
        let mut conn = self.conn();
        for (all, key) in [
            (keys::ALL_SERVERS, &server_key),
            (keys::ALL_WORKERS, &workers_key),
        ] {
            redis::cmd("ZREM")
                .arg(all)
                .arg(key)
                .query_async::<()>(&mut conn)
                .await?;
        }
        scripts::CLEAR_SERVER_STATE
            .key(&server_key)
            .key(&workers_key)
            .invoke_async::<()>(&mut conn)
            .await?;
        Ok(())
    }
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
