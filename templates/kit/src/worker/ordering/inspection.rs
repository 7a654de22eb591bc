//! What the chains hold, read without changing them: the chain a run is
//! in and where it stands, what ordering holds back ([`Held`], for `outbox
//! status` and the metrics), the runs of an event still in their chains
//! ([`Standing`], for `outbox show` and the console), and whether Valkey
//! still keeps a key's last fanned-out number.

use uuid::Uuid;

use crate::outbox::Metadata;
use crate::outbox::order::ORDER_KEY;
use crate::queue::QueueError;

use super::keys::Namespace;
use super::{Held, Ordering, RunOf, Standing, StoredRun};

impl Ordering {
    /// Whether `queue` keeps the last fanned-out number of `key` in
    /// `epoch`: `false` after Valkey lost it (the recovery's replay then
    /// makes the key's events take their turns again, `outbox replay
    /// --lost`).
    pub(crate) async fn knows(
        &self,
        queue: &str,
        key: &str,
        epoch: i64,
    ) -> Result<bool, QueueError> {
        Ok(redis::cmd("EXISTS")
            .arg(Namespace::of_queue(queue).fanned(key, epoch))
            .query_async(&mut self.queue.connection())
            .await?)
    }

    /// The chain of the run of `task_id`, if it is in one.
    pub(crate) async fn run_of(&self, task_id: &str) -> Result<Option<RunOf>, QueueError> {
        for queue in self.queues.iter() {
            let keys = Namespace::of_queue(queue);
            let run: Option<Vec<u8>> = redis::cmd("HGET")
                .arg(keys.runs())
                .arg(task_id)
                .query_async(&mut self.queue.connection())
                .await?;
            if let Some(run) = run.as_deref().and_then(StoredRun::decode) {
                return Ok(Some(RunOf {
                    queue: queue.clone(),
                    listener: run.listener,
                    key: run.key,
                }));
            }
        }
        Ok(None)
    }

    /// Where the run of `task_id` in `queue`, of `listener`'s chain for
    /// `key`, stands, without taking a turn: 0 for the head, `None` for a
    /// run in no chain.
    pub(crate) async fn position(
        &self,
        queue: &str,
        listener: &str,
        key: &str,
        task_id: &str,
    ) -> Result<Option<i64>, QueueError> {
        Ok(redis::cmd("LPOS")
            .arg(Namespace::of_queue(queue).chain(listener, key))
            .arg(task_id)
            .query_async(&mut self.queue.connection())
            .await?)
    }

    /// What ordering holds back now: counts from Valkey, and the heads
    /// that failed for good from `listener_failures`.
    pub(crate) async fn held(&self) -> anyhow::Result<Held> {
        let mut held = Held::default();
        for queue in self.queues.iter() {
            let keys = Namespace::of_queue(queue);
            let failed: Vec<String> = sqlx::query_scalar(
                "SELECT task_id FROM listener_failures WHERE queue = $1 AND holds_key",
            )
            .bind(queue)
            .fetch_all(&self.pool)
            .await?;
            let mut pipe = redis::pipe();
            pipe.zcard(keys.heads())
                .hlen(keys.runs())
                .zcard(keys.waiting());
            let (heads, runs, waiting_events, failed_heads): (i64, i64, i64, Vec<Option<f64>>) =
                if failed.is_empty() {
                    let (heads, runs, waiting): (i64, i64, i64) = pipe
                        .query_async(&mut self.queue.connection())
                        .await
                        .map_err(QueueError::from)?;
                    (heads, runs, waiting, Vec::new())
                } else {
                    pipe.cmd("ZMSCORE").arg(keys.heads()).arg(&failed);
                    pipe.query_async(&mut self.queue.connection())
                        .await
                        .map_err(QueueError::from)?
                };
            let blocked = failed_heads.iter().flatten().count();
            held.blocked_keys += i64::try_from(blocked).unwrap_or(i64::MAX);
            held.waiting_runs += (runs - heads).max(0);
            held.waiting_events += waiting_events;
        }
        Ok(held)
    }

    /// The runs of the event `event_id`, of key `key`, still in their
    /// chains.
    pub(crate) async fn standing(
        &self,
        event_id: Uuid,
        key: &str,
    ) -> Result<Vec<Standing>, QueueError> {
        let mut conn = self.queue.connection();
        let mut standing = Vec::new();
        for queue in self.queues.iter() {
            let keys = Namespace::of_queue(queue);
            let listeners: Vec<String> = redis::cmd("SMEMBERS")
                .arg(keys.listeners())
                .query_async(&mut conn)
                .await?;
            for listener in listeners {
                let chain: Vec<String> = redis::cmd("LRANGE")
                    .arg(keys.chain(&listener, key))
                    .arg(0)
                    .arg(-1)
                    .query_async(&mut conn)
                    .await?;
                if chain.is_empty() {
                    continue;
                }
                let runs: Vec<Option<Vec<u8>>> = redis::cmd("HMGET")
                    .arg(keys.runs())
                    .arg(&chain)
                    .query_async(&mut conn)
                    .await?;
                for (after, (task_id, run)) in chain.iter().zip(runs).enumerate() {
                    let Some(run) = run.as_deref().and_then(StoredRun::decode) else {
                        continue;
                    };
                    if run.event_id != Some(event_id) {
                        continue;
                    }
                    standing.push(Standing {
                        task_id: task_id.clone(),
                        listener: run.listener,
                        key: run.key,
                        after: i64::try_from(after).unwrap_or(i64::MAX),
                        waits_for: (after > 0).then(|| chain[0].clone()),
                    });
                }
            }
        }
        standing.sort_by(|a, b| a.listener.cmp(&b.listener));
        Ok(standing)
    }

    /// The runs of the event `event_id`, with `metadata`, still in their
    /// chains: none for an event without a key.
    pub(crate) async fn standing_of(
        &self,
        event_id: Uuid,
        metadata: &Metadata,
    ) -> Result<Vec<Standing>, QueueError> {
        match metadata.get(ORDER_KEY) {
            Some(key) => self.standing(event_id, key).await,
            None => Ok(Vec::new()),
        }
    }
}
