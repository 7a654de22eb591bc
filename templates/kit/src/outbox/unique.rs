//! At most one event per key in a window (`kit::dispatch_unique`): the
//! statement that takes the key in `outbox_unique` and stores the event
//! only if it got it, and [`Unique`], what it reports.
//!
//! The key is taken in the caller's transaction (the migration's
//! `outbox_unique_take`): a concurrent dispatch of the same key waits for
//! the transaction that is taking it, then finds the key held (that
//! transaction committed) or free (it rolled back). A dispatch that finds
//! the key held writes nothing, so it holds no lock until its own
//! transaction ends. A key whose window is over is taken over by the next
//! dispatch; the worker's cleanup deletes expired keys.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
use sqlx::types::Json;
use uuid::Uuid;

use super::order::{ORDER_KEY, write_place};
use super::{Envelope, Store};

/// What [`dispatch_unique`](crate::dispatch_unique) did.
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub enum Unique {
    /// The key was free: the event was stored (it commits with the
    /// transaction), and holds the key for the window. Its envelope, as
    /// [`dispatch`](crate::dispatch()) returns it.
    Stored(Envelope),
    /// An earlier event holds the key: nothing was stored.
    Duplicate {
        /// The id of the event that holds the key.
        existing: Uuid,
        /// When its window ends, a time still to come when it is
        /// reported: a dispatch from then on is stored.
        until: DateTime<Utc>,
    },
}

impl Unique {
    /// Whether the event was stored.
    pub fn is_stored(&self) -> bool {
        matches!(self, Self::Stored(_))
    }
}

/// The part of the statement that takes the key: binds `$1` the event id,
/// `$6` the unique key, `$7` the window in seconds. The row's `stored`
/// says whether this event got the key; else `event_id` and `until` name
/// the event that holds it and when its window ends (a time to come).
/// `outbox_unique_take` (the migration's) inserts the key with `ON
/// CONFLICT DO NOTHING`, reads the holder, and takes over a key whose
/// window is over with an `UPDATE ... WHERE until <= clock_timestamp()`:
/// a dispatch that finds the key held writes nothing and holds no lock.
const TAKE_KEY: &str = "\
WITH taken AS ( \
  SELECT t.taken AS stored, t.holder AS event_id, t.held_until AS until \
  FROM outbox_unique_take($6, $1, $7::float8) t)";

/// The statement that takes the key and, if it got it, stores an event
/// without an order key. Binds: event id, name, payload, metadata, time,
/// unique key, window. Returns whether it was stored, the key's holder
/// and its end, and (none here) the order number and epoch.
pub(super) fn insert_unique() -> String {
    format!(
        "{TAKE_KEY}, \
         stored AS ( \
           INSERT INTO outbox_events (event_id, event_name, payload, metadata, created_at) \
           SELECT $1, $2, $3, $4, $5 FROM taken WHERE taken.stored RETURNING id) \
         SELECT taken.stored, taken.event_id, taken.until, NULL::bigint, NULL::bigint \
         FROM taken"
    )
}

/// [`insert_unique`] for an event with an order key (`$8`), which takes
/// its key's next number only if it is stored (`super::order`).
pub(super) fn insert_unique_keyed() -> String {
    format!(
        "{TAKE_KEY}, \
         next AS ( \
           INSERT INTO outbox_keys AS k (key, seq) SELECT $8, 1 FROM taken WHERE taken.stored \
           ON CONFLICT (key) DO UPDATE SET seq = k.seq + 1, updated_at = now() \
           RETURNING seq, epoch), \
         stored AS ( \
           INSERT INTO outbox_events (event_id, event_name, payload, metadata, created_at) \
           SELECT $1, $2, $3, $4 || jsonb_build_object('order_seq', next.seq::text, \
             'order_epoch', next.epoch::text), $5 FROM next \
           RETURNING (metadata ->> 'order_seq')::bigint AS seq, \
             (metadata ->> 'order_epoch')::bigint AS epoch) \
         SELECT taken.stored, taken.event_id, taken.until, stored.seq, stored.epoch \
         FROM taken LEFT JOIN stored ON true"
    )
}

/// The row the statements return.
pub(super) type UniqueRow = (bool, Uuid, DateTime<Utc>, Option<i64>, Option<i64>);

/// What a returned row means for `envelope` (the stored event's place
/// written into it).
pub(super) fn outcome(envelope: &mut Envelope, row: UniqueRow) -> Unique {
    let (stored, existing, until, seq, epoch) = row;
    if !stored {
        return Unique::Duplicate { existing, until };
    }
    // The commit of the transaction this runs in wakes the relays.
    crate::commit_hooks::events_stored();
    if let (Some(seq), Some(epoch)) = (seq, epoch) {
        write_place(&mut envelope.metadata, seq, epoch);
    }
    Unique::Stored(envelope.clone())
}

impl Store {
    /// Takes `key` for `window` and stores `envelope` if it got it, in one
    /// statement on `executor` (on a transaction, both commit or roll back
    /// with it).
    pub(crate) async fn insert_unique<'e>(
        &self,
        executor: impl PgExecutor<'e>,
        envelope: &mut Envelope,
        key: &str,
        window: Duration,
    ) -> Result<Unique, sqlx::Error> {
        let order_key = envelope.metadata.get(ORDER_KEY).cloned();
        let statement = match order_key {
            Some(_) => insert_unique_keyed(),
            None => insert_unique(),
        };
        let mut query = sqlx::query_as(&statement)
            .bind(envelope.id)
            .bind(&envelope.name)
            .bind(Json(&envelope.payload))
            .bind(Json(&envelope.metadata))
            .bind(envelope.occurred_at)
            .bind(key)
            .bind(window.as_secs_f64());
        if let Some(order_key) = order_key {
            query = query.bind(order_key);
        }
        let row: UniqueRow = query.fetch_one(executor).await?;
        Ok(outcome(envelope, row))
    }

    /// Deletes up to `limit` keys whose window is over; how many it
    /// deleted.
    #[cfg(feature = "worker")]
    pub(crate) async fn delete_expired_keys<'e>(
        &self,
        executor: impl PgExecutor<'e>,
        limit: u32,
    ) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(
            "DELETE FROM outbox_unique WHERE key IN ( \
               SELECT key FROM outbox_unique WHERE until <= now() \
               LIMIT $1 FOR UPDATE SKIP LOCKED)",
        )
        .bind(i64::from(limit))
        .execute(executor)
        .await?;
        Ok(done.rows_affected())
    }
}
