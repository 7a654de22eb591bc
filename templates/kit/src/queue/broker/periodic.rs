//! The periodic state changes of a queue, as Go asynq's forwarder,
//! recoverer and janitor make them: due retries and scheduled tasks
//! forwarded to pending, the tasks whose lease ran out read for recovery,
//! completed tasks past their retention deleted.

use chrono::{DateTime, Utc};
use prost::Message as _;

use crate::queue::connection::Connection;
use crate::queue::message::TaskMessage;
use crate::queue::{Client, QueueError, keys, scripts};

/// How many expired completed tasks one cleanup script deletes.
const CLEANUP_BATCH: isize = 100;
/// How many due tasks one forward script moves (as Go asynq).
const FORWARD_BATCH: isize = 100;

impl Client {
    /// Moves the due tasks of `:scheduled` and `:retry` to pending: reads
    /// up to [`FORWARD_BATCH`] due ids and their groups, then
    /// [`scripts::FORWARD`] moves those still due, until none is left.
    pub(in crate::queue) async fn forward_due(&self, queue: &str) -> Result<(), QueueError> {
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
    pub(in crate::queue) async fn lease_expired(
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
    pub(in crate::queue) async fn delete_expired_completed(
        &self,
        queue: &str,
    ) -> Result<(), QueueError> {
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
