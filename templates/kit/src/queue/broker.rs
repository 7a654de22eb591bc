//! The consumer's state changes of a task, each one Go asynq script (or
//! command) with Go asynq's arguments: dequeue under a lease, extend
//! leases, done / completed, retry, archive, requeue, the periodic
//! forward, lease recovery and completed-task cleanup, and the server state
//! asynqmon's Servers page reads. Two are the kit's own, for the limits on
//! listeners: a deferral (active to `:scheduled`, as Go's schedule leaves
//! a task, no retry counted) and the promotion of deferred tasks back to
//! pending before they are due.

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
/// How long a wake-up asked for while its task was still active waits for
/// the task's deferral ([`Client::promote`]); older ones are dropped.
const WOKEN_TTL: TimeDelta = TimeDelta::seconds(60);
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

    /// Not a failure: the task waits in `:scheduled` until `until`, its
    /// message (so its retry count and error) unchanged, its hash's state
    /// `scheduled` as Go's schedule leaves it; the score is `until` in
    /// whole seconds, rounded up, so that no forwarder moves it early. A
    /// task [`Self::promote`]d while it was still active goes straight back
    /// to the head of pending instead: `Ok(true)`. A task no longer active
    /// is Go's `NOT FOUND`.
    pub(super) async fn defer(
        &self,
        message: &TaskMessage,
        until: DateTime<Utc>,
    ) -> Result<bool, QueueError> {
        let queue = &message.queue;
        let woken: i64 = scripts::DEFER
            .key(keys::task(queue, &message.id))
            .key(keys::active(queue))
            .key(keys::lease(queue))
            .key(keys::scheduled(queue))
            .key(keys::pending(queue))
            .key(keys::woken(queue))
            .arg(&message.id)
            .arg(due_score(until))
            .arg(Utc::now().timestamp_nanos_opt().unwrap_or_default())
            .invoke_async(&mut self.conn())
            .await?;
        if woken == 1 {
            self.enqueued().signal();
        }
        Ok(woken == 1)
    }

    /// Wakes the deferred tasks `ids` of `queue` now (a limit's turn came):
    /// each still in `:scheduled` (and in no group) moves to the head of
    /// pending, where the next dequeue takes it; one still active (its
    /// handler's deferral on its way) is marked, so that its deferral sends
    /// it to pending instead (within [`WOKEN_TTL`]); one pending already,
    /// or scheduled in a group, is left to run as it is. Returns the ids of
    /// the tasks that no longer wait at all (gone, completed, retried,
    /// archived), so that a limit can pass their turn on.
    pub(crate) async fn promote(
        &self,
        queue: &str,
        ids: &[String],
    ) -> Result<Vec<String>, QueueError> {
        let tasks: Vec<(&str, Option<i64>)> = ids.iter().map(|id| (id.as_str(), None)).collect();
        let results = self.run_promote(queue, &tasks, true).await?;
        Ok(ids
            .iter()
            .zip(results)
            .filter(|(_, result)| *result == 0)
            .map(|(id, _)| id.clone())
            .collect())
    }

    /// The consumer's own wake-up of tasks it deferred, now due: each
    /// `(id, due)` still in `:scheduled` with a score of at most `due`
    /// (not deferred again since, to later) moves to the head of pending.
    pub(super) async fn wake_due(
        &self,
        queue: &str,
        tasks: &[(String, i64)],
    ) -> Result<(), QueueError> {
        let tasks: Vec<(&str, Option<i64>)> = tasks
            .iter()
            .map(|(id, due)| (id.as_str(), Some(*due)))
            .collect();
        self.run_promote(queue, &tasks, false).await?;
        Ok(())
    }

    /// [`scripts::PROMOTE`] on `tasks` (ids with an optional bound on
    /// their score), marking the active ones when `mark_active`; its
    /// result per task. Wakes this process's idle consumers when a task
    /// moved, and publishes the wake-up as an enqueue does.
    async fn run_promote(
        &self,
        queue: &str,
        tasks: &[(&str, Option<i64>)],
        mark_active: bool,
    ) -> Result<Vec<i64>, QueueError> {
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        let now = Utc::now();
        let mut invocation = scripts::PROMOTE.prepare_invoke();
        invocation
            .key(keys::scheduled(queue))
            .key(keys::pending(queue))
            .key(keys::woken(queue))
            .arg(now.timestamp())
            .arg(now.timestamp_nanos_opt().unwrap_or_default())
            .arg((now - WOKEN_TTL).timestamp())
            .arg(u8::from(mark_active));
        for (id, bound) in tasks {
            invocation.key(keys::task(queue, id)).arg(*id);
            match bound {
                Some(bound) => invocation.arg(*bound),
                None => invocation.arg(""),
            };
        }
        let mut conn = self.conn();
        let results: Vec<i64> = invocation.invoke_async(&mut conn).await?;
        if results.len() != tasks.len() {
            return Err(QueueError::UnexpectedReply(format!(
                "the promote script answered for {} tasks of {}",
                results.len(),
                tasks.len()
            )));
        }
        if results.contains(&1) {
            self.enqueued().signal();
            if self.enqueued().publish() {
                // Best effort, as an enqueue's: consumers poll anyway.
                let published = redis::cmd("PUBLISH")
                    .arg(super::wakeup::CHANNEL)
                    .arg(queue)
                    .query_async::<i64>(&mut conn)
                    .await;
                if let Err(err) = published {
                    tracing::debug!(error = %err, "could not publish the wake-up");
                }
            }
        }
        Ok(results)
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
    /// settled in between is left out, and so is one whose message does
    /// not decode (logged).
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
        let mut expired = Vec::new();
        for (id, bytes) in ids.iter().zip(encoded) {
            let Some(bytes) = bytes else { continue };
            match TaskMessage::decode(bytes.as_slice()) {
                Ok(message) => expired.push(message),
                Err(error) => {
                    tracing::error!(%queue, %id, %error, "a leased task's message does not decode; skipped");
                }
            }
        }
        Ok(expired)
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

/// The score of a task deferred to `until` in `:scheduled`: Unix seconds,
/// rounded up, so that no forwarder (which compares whole seconds) moves
/// it early.
pub(super) fn due_score(until: DateTime<Utc>) -> i64 {
    until.timestamp() + i64::from(until.timestamp_subsec_nanos() > 0)
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

    /// The servers whose state has not expired: asynqmon's Servers page
    /// (Go's `Inspector.Servers()`).
    pub(crate) async fn servers(&self) -> Result<Vec<ServerInfo>, QueueError> {
        let mut conn = self.conn();
        let names: Vec<String> = redis::cmd("ZRANGEBYSCORE")
            .arg(keys::ALL_SERVERS)
            .arg(Utc::now().timestamp())
            .arg("+inf")
            .query_async(&mut conn)
            .await?;
        if names.is_empty() {
            return Ok(Vec::new());
        }
        // One GET each: the keys are in different cluster slots.
        let mut pipe = redis::pipe();
        for name in &names {
            pipe.get(name);
        }
        let infos: Vec<Option<Vec<u8>>> = pipe.query_async(&mut conn).await?;
        Ok(infos
            .into_iter()
            .flatten()
            .filter_map(|info| ServerInfo::decode(info.as_slice()).ok())
            .collect())
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
