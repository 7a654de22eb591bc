//! Waiting events whose earlier ones do not come: an event of a key waits
//! in Valkey for the fan-out of the event before it. That one may never
//! come if its task was lost (Valkey lost its data: its queue and, with it,
//! what the chains knew), or if the outbox no longer has it. Every worker
//! looks, with its loop of old heads, at the events that have waited
//! [`super::STALE_AFTER`] or more, and asks the outbox about the earlier
//! events of their keys (same epoch, not fanned out):
//!
//! - none left in the outbox: the key moves on past them, and the waiting
//!   events that follow are fanned out;
//! - some left: those already published are published again (the relay
//!   queues their event tasks; a task the queue has is a duplicate), from
//!   the first of them if Valkey no longer knows the key (a listener may
//!   then run an event again: `ctx.once` keeps its work once). Those not
//!   published yet are the relay's.
//!
//! The outbox is searched by its rows' metadata (no index): a step for the
//! rare case, at most [`STALE_BATCH`] waiting events a round.

use std::time::Duration;

use super::{Ordering, millis, now_millis};
use crate::outbox::Store;
use crate::queue::QueueError;

/// The most waiting events looked at a round.
const STALE_BATCH: isize = 100;

impl Ordering {
    /// Looks at the events that have waited `older_than` or more (module
    /// docs); how many it looked at.
    pub(crate) async fn heal_stale_waits(&self, older_than: Duration) -> anyhow::Result<usize> {
        let mut conn = self.queue.connection();
        let now = now_millis();
        let stale: Vec<String> = redis::cmd("ZRANGEBYSCORE")
            .arg(self.keys.waiting())
            .arg("-inf")
            .arg(now - millis(older_than))
            .arg("LIMIT")
            .arg(0)
            .arg(STALE_BATCH)
            .query_async(&mut conn)
            .await
            .map_err(QueueError::from)?;
        for name in &stale {
            let Some((key, epoch, seq)) = self.keys.waiting_event(name) else {
                continue;
            };
            // Looked at again after another while, not at every round.
            let () = redis::cmd("ZADD")
                .arg(self.keys.waiting())
                .arg("XX")
                .arg(now)
                .arg(name)
                .query_async(&mut conn)
                .await
                .map_err(QueueError::from)?;
            let fanned: Option<i64> = redis::cmd("GET")
                .arg(self.keys.fanned(&key, epoch))
                .query_async(&mut conn)
                .await
                .map_err(QueueError::from)?;
            let earlier: Vec<(i64, i64, bool)> = sqlx::query_as(
                "SELECT id, (metadata ->> 'order_seq')::bigint AS seq, published_at IS NOT NULL \
                 FROM outbox_events WHERE metadata ->> 'order_key' = $1 \
                   AND coalesce(metadata ->> 'order_epoch', '0') = $2 \
                   AND (metadata ->> 'order_seq')::bigint > $3 \
                   AND (metadata ->> 'order_seq')::bigint < $4 \
                 ORDER BY seq",
            )
            .bind(&key)
            .bind(epoch.to_string())
            .bind(fanned.unwrap_or(0))
            .bind(seq)
            .fetch_all(&self.pool)
            .await?;
            let move_past = match (earlier.first(), fanned) {
                (None, _) => seq - 1,
                (Some(&(_, first, _)), None) => first - 1,
                (Some(_), Some(_)) => 0,
            };
            if move_past > 0 {
                self.move_past(&key, epoch, move_past)
                    .await
                    .map_err(|err| anyhow::anyhow!("{err}"))?;
            }
            let published: Vec<i64> = earlier
                .iter()
                .filter(|(_, _, published)| *published)
                .map(|(id, _, _)| *id)
                .collect();
            if !published.is_empty() {
                Store
                    .unmark(&mut *self.pool.acquire().await?, &published)
                    .await?;
            }
            if move_past > 0 || !published.is_empty() {
                tracing::info!(
                    key,
                    seq,
                    moved_past = move_past,
                    published_again = published.len(),
                    "an event of an ordered key waited long for earlier ones that did not come"
                );
            } else {
                // Its earlier events are the relay's still (a backlog).
                tracing::debug!(
                    key,
                    seq,
                    earlier = earlier.len(),
                    "an event of an ordered key waits for earlier ones not published yet"
                );
            }
        }
        Ok(stale.len())
    }
}
