//! Waiting events whose earlier ones do not come: an event of a key waits
//! in Valkey for the fan-out of the event before it. That one may never
//! come: its task was lost (Valkey lost its data), the outbox no longer
//! has it, or a process that is not a kit worker took its task (a Go
//! server on the queue fans it out to its own listeners and moves no
//! key). Every worker looks, with its loop of old heads, at the events that
//! have waited [`super::STALE_AFTER`] or more, and asks its outbox about
//! the earlier events of their keys (same epoch, not fanned out):
//!
//! - an event its own outbox did not produce (another service's, through
//!   the queue of this one) is not judged: it is reported, and waits for
//!   the service that published its key's events;
//! - none left in the outbox: the key moves on past them, and the waiting
//!   events that follow are fanned out;
//! - some left: each one published, not waiting itself, whose event task
//!   the queue no longer has is queued again under its id (as the relay
//!   queued it); one whose task the queue completed or archived without it
//!   being fanned out here is queued as a recovery (a new task id,
//!   [`RECOVERED_HEADER`]), which takes its turn in the key for the ordered
//!   listeners (the others ran it already). From the first of them if
//!   Valkey no longer knows the key (an ordered listener may then run an
//!   event again: `ctx.once` keeps its work once). Those not published yet
//!   are the relay's.
//!
//! One worker looks at a waiting event at a time (it takes it, `TAKE_WAIT`),
//! and again only after another while.
//!
//! The outbox is searched by its rows' metadata (no index): a step for the
//! rare case, at most [`STALE_BATCH`] waiting events a queue a round.

use std::time::Duration;

use uuid::Uuid;

use super::keys::{Namespace, waiting_event};
use super::scripts::TAKE_WAIT;
use super::waits::Waiting;
use super::{Ordering, millis, now_millis};
use crate::outbox::Envelope;
use crate::outbox::relay::event_task;
use crate::queue::{NewTask, QueueError};

/// The most waiting events looked at a queue a round.
const STALE_BATCH: isize = 100;

/// The header of an event task queued again by this look for an event the
/// queue completed without it being fanned out here: its fan-out takes
/// the event's turn, as the event's own task would, and is no replay.
pub(crate) const RECOVERED_HEADER: &str = "gpkit-recovered";

/// An earlier event of a waiting one's key, as the outbox has it.
struct Earlier {
    event_id: Uuid,
    event_name: String,
    payload: serde_json::Value,
    metadata: crate::outbox::Metadata,
    created_at: chrono::DateTime<chrono::Utc>,
    seq: i64,
    published: bool,
}

/// An [`Earlier`] as its query returns it.
type EarlierRow = (
    Uuid,
    String,
    serde_json::Value,
    sqlx::types::Json<crate::outbox::Metadata>,
    chrono::DateTime<chrono::Utc>,
    i64,
    bool,
);

impl Ordering {
    /// Looks at the events that have waited `older_than` or more (module
    /// docs); how many it looked at.
    pub(crate) async fn heal_stale_waits(&self, older_than: Duration) -> anyhow::Result<usize> {
        let mut looked = 0;
        for queue in self.queues.iter() {
            looked += self.heal_stale_waits_of(queue, older_than).await?;
        }
        Ok(looked)
    }

    async fn heal_stale_waits_of(
        &self,
        queue: &str,
        older_than: Duration,
    ) -> anyhow::Result<usize> {
        let keys = Namespace::of_queue(queue);
        let mut conn = self.queue.connection();
        let now = now_millis();
        let stale: Vec<String> = redis::cmd("ZRANGEBYSCORE")
            .arg(keys.waiting())
            .arg("-inf")
            .arg(now - millis(older_than))
            .arg("LIMIT")
            .arg(0)
            .arg(STALE_BATCH)
            .query_async(&mut conn)
            .await
            .map_err(QueueError::from)?;
        for member in &stale {
            let Some((key, epoch, seq)) = waiting_event(member) else {
                continue;
            };
            // Looked at again after another while, not at every round, and
            // by one worker at a time.
            let taken: i64 = TAKE_WAIT
                .key(keys.waiting())
                .arg(member)
                .arg(now - millis(older_than))
                .arg(now)
                .invoke_async(&mut conn)
                .await
                .map_err(QueueError::from)?;
            if taken == 0 {
                continue;
            }
            let (entry, fanned): (Option<Vec<u8>>, Option<i64>) = redis::pipe()
                .cmd("HGET")
                .arg(keys.waits(&key))
                .arg(format!("{epoch}:{seq}"))
                .get(keys.fanned(&key, epoch))
                .query_async(&mut conn)
                .await
                .map_err(QueueError::from)?;
            let event_id = entry
                .as_deref()
                .and_then(Waiting::decode)
                .and_then(|waiting| waiting.event_id.parse::<Uuid>().ok());
            let own: bool = match event_id {
                Some(id) => {
                    sqlx::query_scalar(
                        "SELECT EXISTS (SELECT 1 FROM outbox_events WHERE event_id = $1)",
                    )
                    .bind(id)
                    .fetch_one(&self.pool)
                    .await?
                }
                None => false,
            };
            if !own {
                tracing::warn!(
                    queue,
                    key,
                    seq,
                    event_id = ?event_id,
                    "an event of an ordered key has waited long for earlier ones, and this service's \
                     outbox did not produce it: if the service that published its key's events lost \
                     some, replay them there (`outbox replay --lost`)"
                );
                continue;
            }
            let earlier: Vec<EarlierRow> = sqlx::query_as(
                "SELECT event_id, event_name, payload, metadata, created_at, \
                   (metadata ->> 'order_seq')::bigint AS seq, published_at IS NOT NULL AS published \
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
            let earlier: Vec<Earlier> = earlier
                .into_iter()
                .map(
                    |(event_id, event_name, payload, metadata, created_at, seq, published)| {
                        Earlier {
                            event_id,
                            event_name,
                            payload,
                            metadata: metadata.0,
                            created_at,
                            seq,
                            published,
                        }
                    },
                )
                .collect();
            let move_past = match (earlier.first(), fanned) {
                (None, _) => seq - 1,
                (Some(first), None) => first.seq - 1,
                (Some(_), Some(_)) => 0,
            };
            if move_past > 0 {
                self.move_past(queue, &key, epoch, move_past)
                    .await
                    .map_err(|err| anyhow::anyhow!("{err}"))?;
            }
            // Those that wait already are fanned out in their turn.
            let mut waits = redis::cmd("HMGET");
            waits.arg(keys.waits(&key));
            for event in &earlier {
                waits.arg(format!("{epoch}:{}", event.seq));
            }
            let waiting: Vec<Option<Vec<u8>>> = if earlier.is_empty() {
                Vec::new()
            } else {
                waits
                    .query_async(&mut conn)
                    .await
                    .map_err(QueueError::from)?
            };
            let published: Vec<&Earlier> = earlier
                .iter()
                .zip(&waiting)
                .filter(|(event, waits)| event.published && waits.is_none())
                .map(|(event, _)| event)
                .collect();
            let mut states = redis::pipe();
            for event in &published {
                states.hget(keys.task(&event.event_id.to_string()), "state");
            }
            let states: Vec<Option<String>> = if published.is_empty() {
                Vec::new()
            } else {
                states
                    .query_async(&mut conn)
                    .await
                    .map_err(QueueError::from)?
            };
            let mut again = Vec::new();
            for (event, state) in published.iter().zip(states) {
                let envelope = Envelope {
                    id: event.event_id,
                    name: event.event_name.clone(),
                    payload: event.payload.clone(),
                    metadata: event.metadata.clone(),
                    occurred_at: event.created_at,
                };
                match state.as_deref() {
                    // Lost: queued again as the relay queued it.
                    None => again.push(event_task(
                        &envelope,
                        envelope.id.to_string(),
                        queue,
                        self.retention,
                    )),
                    // Run without being fanned out here: taken again.
                    Some("completed" | "archived") => {
                        again.push(recovery_task(&envelope, queue, self.retention));
                    }
                    // Still on its way.
                    Some(_) => {}
                }
            }
            if !again.is_empty() {
                for result in self.queue.enqueue(&again).await? {
                    result?;
                }
            }
            if move_past > 0 || !again.is_empty() {
                tracing::info!(
                    queue,
                    key,
                    seq,
                    moved_past = move_past,
                    queued_again = again.len(),
                    "an event of an ordered key waited long for earlier ones that did not come"
                );
            } else {
                // Its earlier events are the relay's or the queue's still.
                tracing::debug!(
                    queue,
                    key,
                    seq,
                    earlier = earlier.len(),
                    "an event of an ordered key waits for earlier ones on their way"
                );
            }
        }
        Ok(stale.len())
    }
}

/// The event task of `envelope` in `queue` as a recovery: a new task id,
/// marked [`RECOVERED_HEADER`], so that its fan-out takes the event's turn
/// in its key (a replay's would join the key's end), and runs its
/// listeners again though the queue completed the event's own task.
pub(crate) fn recovery_task(envelope: &Envelope, queue: &str, retention: Duration) -> NewTask {
    let mut task = event_task(envelope, Uuid::now_v7().to_string(), queue, retention);
    task.headers.insert(RECOVERED_HEADER.into(), "1".into());
    task
}
