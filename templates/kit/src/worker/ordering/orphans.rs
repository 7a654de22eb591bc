//! Chains of listeners no worker orders: a listener renamed, deleted, or no
//! longer `.ordered()` leaves its chains in Valkey. Each worker compares
//! the listeners with chains with those it orders, at start-up and with its
//! look after the chains: the others are reported, and once a worker has
//! seen them so for [`GRACE`] (a rolling deploy's old workers may still
//! order them meanwhile; a worker that orders one clears the mark), their
//! chains are released: every run goes to the queue, where a worker that
//! has the listener runs it at once (one without it fails it, and records
//! the failure once its retries are spent).

use std::time::Duration;

use super::keys::Namespace;
use super::ordered::Ordered;
use super::scripts::RELEASE;
use super::{Ordering, millis, now_millis};
use crate::queue::QueueError;

/// How long a listener's chains are kept after a worker first saw that no
/// worker orders it.
pub(crate) const GRACE: Duration = Duration::from_secs(3600);

/// The chains of one key released at most a call.
const KEYS_A_ROUND: usize = 100;

impl Ordering {
    /// The listeners with chains in each queue that `ordered` does not
    /// order, with how many keys each holds.
    pub(crate) async fn orphans(
        &self,
        ordered: &Ordered,
    ) -> Result<Vec<(String, String, i64)>, QueueError> {
        let mut conn = self.queue.connection();
        let mut orphans = Vec::new();
        for queue in self.queues.iter() {
            let keys = Namespace::of_queue(queue);
            let listeners: Vec<String> = redis::cmd("SMEMBERS")
                .arg(keys.listeners())
                .query_async(&mut conn)
                .await?;
            for listener in listeners {
                if ordered.names.contains(&listener) {
                    continue;
                }
                let count: i64 = redis::cmd("SCARD")
                    .arg(keys.keys_of(&listener))
                    .query_async(&mut conn)
                    .await?;
                orphans.push((queue.clone(), listener, count));
            }
        }
        Ok(orphans)
    }

    /// Clears the marks of the listeners `ordered` orders: a worker that
    /// orders them runs (at start-up, before it consumes, and at each look).
    pub(crate) async fn claim_listeners(&self, ordered: &Ordered) -> Result<(), QueueError> {
        if ordered.names.is_empty() {
            return Ok(());
        }
        let mut conn = self.queue.connection();
        for queue in self.queues.iter() {
            let () = redis::cmd("HDEL")
                .arg(Namespace::of_queue(queue).orphans())
                .arg(ordered.names.iter().collect::<Vec<_>>())
                .query_async(&mut conn)
                .await?;
        }
        Ok(())
    }

    /// Marks the listeners no worker orders (see [`Ordering::orphans`]),
    /// clears the marks of those `ordered` orders, and releases the chains
    /// of those marked `grace` ago or more; how many runs it released.
    pub(crate) async fn release_orphans(
        &self,
        ordered: &Ordered,
        grace: Duration,
    ) -> Result<u64, QueueError> {
        let mut conn = self.queue.connection();
        let now = now_millis();
        self.claim_listeners(ordered).await?;
        let mut released = 0;
        for (queue, listener, keys_held) in self.orphans(ordered).await? {
            let keys = Namespace::of_queue(&queue);
            let (_, since): (bool, i64) = redis::pipe()
                .cmd("HSETNX")
                .arg(keys.orphans())
                .arg(&listener)
                .arg(now)
                .cmd("HGET")
                .arg(keys.orphans())
                .arg(&listener)
                .query_async(&mut conn)
                .await?;
            if now - since < millis(grace) {
                tracing::warn!(
                    queue,
                    listener,
                    keys = keys_held,
                    release_in_seconds = (millis(grace) - (now - since)) / 1000,
                    "a listener that no worker here orders has chains of ordered runs: they are \
                     released (their runs queued at once) after a grace period, unless a worker \
                     that orders it runs"
                );
                continue;
            }
            released += self.release(&keys, &listener).await?;
            let () = redis::cmd("HDEL")
                .arg(keys.orphans())
                .arg(&listener)
                .query_async(&mut conn)
                .await?;
        }
        Ok(released)
    }

    /// Releases every chain of `listener` in `keys`' queue ([`RELEASE`]);
    /// how many runs.
    async fn release(&self, keys: &Namespace, listener: &str) -> Result<u64, QueueError> {
        let mut conn = self.queue.connection();
        let mut released = 0u64;
        // Bounded: a chain an old worker keeps changing is left for the
        // next round.
        for _ in 0..100 {
            let held: Vec<String> = redis::cmd("SRANDMEMBER")
                .arg(keys.keys_of(listener))
                .arg(KEYS_A_ROUND)
                .query_async(&mut conn)
                .await?;
            if held.is_empty() {
                break;
            }
            for key in held {
                let chain = keys.chain(listener, &key);
                let ids: Vec<String> = redis::cmd("LRANGE")
                    .arg(&chain)
                    .arg(0)
                    .arg(-1)
                    .query_async(&mut conn)
                    .await?;
                let mut script = RELEASE.prepare_invoke();
                self.delivery(keys, &mut script);
                script
                    .key(&chain)
                    .key(keys.runs())
                    .key(keys.heads())
                    .key(keys.listeners())
                    .key(keys.keys_of(listener))
                    .arg(listener)
                    .arg(&key);
                for id in &ids {
                    script.key(keys.task(id)).arg(id);
                }
                let runs: u64 = script.invoke_async(&mut conn).await?;
                released += runs;
            }
        }
        if released > 0 {
            self.queue.enqueued_by_script();
        }
        tracing::warn!(
            queue = keys.queue,
            listener,
            runs = released,
            "released the chains of a listener no worker orders: its runs are in the queue"
        );
        Ok(released)
    }
}
