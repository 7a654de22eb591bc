//! Events delivered later (`kit::dispatch_at`, `kit::dispatch_in`): the
//! SQL on `outbox_later`, where a delayed event waits until it is due, out
//! of the relay's claim, and (feature `worker`) the loop that moves due
//! events into `outbox_events`, to be published like any other.
//!
//! A delayed event takes its place in its key's order (`Event::order_key`)
//! when it is moved, not when it is dispatched: the move takes the key's
//! next numbers under the lock of its `outbox_keys` row, as a dispatch
//! does, so it comes after every event of its key that committed before
//! the move, and delayed events of one key follow their due times (then
//! their dispatch order). In `outbox_events` the event's time
//! (`created_at`, the envelope's `occurred_at`) is its due time, so the
//! relay's lag counts from when it was due.

use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
use sqlx::types::Json;

use super::{Envelope, Store};

/// The statement that stores a delayed event: binds event id, name,
/// payload, metadata (the order key, if any, without a number), the time
/// it was dispatched, and the time it is due.
pub(super) const INSERT_LATER: &str = "\
INSERT INTO outbox_later (event_id, event_name, payload, metadata, created_at, due_at) \
VALUES ($1, $2, $3, $4, $5, $6)";

/// The statement that moves up to `$1` events due at or before `$2` (the
/// database's `now()` when null) from `outbox_later` into
/// `outbox_events`, in due order, skipping rows another mover holds: a
/// keyed event takes its key's next number there (one upsert per key, in
/// key order, so that two movers lock keys in the same order). Returns how
/// many it moved, and in how many seconds the next event not yet due is
/// (by the database's clock; null when none waits).
#[cfg(feature = "worker")]
pub(crate) const MOVE_DUE: &str = "\
WITH due AS ( \
  DELETE FROM outbox_later WHERE id IN ( \
    SELECT id FROM outbox_later WHERE due_at <= coalesce($2::timestamptz, now()) \
    ORDER BY due_at, id LIMIT $1 FOR UPDATE SKIP LOCKED) \
  RETURNING id, event_id, event_name, payload, metadata, due_at), \
ranked AS ( \
  SELECT due.*, metadata ->> 'order_key' AS key, \
    row_number() OVER (PARTITION BY metadata ->> 'order_key' ORDER BY due_at, id) AS rank, \
    count(*) OVER (PARTITION BY metadata ->> 'order_key') AS taken \
  FROM due), \
numbered AS ( \
  INSERT INTO outbox_keys AS k (key, seq) \
  SELECT key, max(taken) FROM ranked WHERE key IS NOT NULL GROUP BY key ORDER BY key \
  ON CONFLICT (key) DO UPDATE SET seq = k.seq + excluded.seq, updated_at = now() \
  RETURNING key, seq, epoch), \
moved AS ( \
  INSERT INTO outbox_events (event_id, event_name, payload, metadata, created_at) \
  SELECT r.event_id, r.event_name, r.payload, \
    CASE WHEN n.key IS NULL THEN r.metadata ELSE r.metadata || jsonb_build_object( \
      'order_seq', (n.seq - r.taken + r.rank)::text, 'order_epoch', n.epoch::text) END, \
    r.due_at \
  FROM ranked r LEFT JOIN numbered n ON n.key = r.key \
  ORDER BY r.due_at, r.id \
  RETURNING 1) \
SELECT (SELECT count(*) FROM moved), \
  (SELECT extract(epoch FROM min(due_at) - clock_timestamp())::float8 FROM outbox_later \
   WHERE due_at > coalesce($2::timestamptz, now()))";

/// How many events wait, and when the next is due.
#[cfg(feature = "worker")]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Waiting {
    /// Events in `outbox_later`.
    pub(crate) events: i64,
    /// The earliest due time among them.
    pub(crate) next_due: Option<DateTime<Utc>>,
}

/// One event that waits, as the console lists it.
#[cfg(feature = "worker")]
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct WaitingEvent {
    pub(crate) event_id: uuid::Uuid,
    pub(crate) event_name: String,
    pub(crate) order_key: Option<String>,
    pub(crate) dispatched_at: DateTime<Utc>,
    pub(crate) due_at: DateTime<Utc>,
}

/// A row of [`Store::next_waiting`]: event id, name, order key, dispatch
/// time, due time.
#[cfg(feature = "worker")]
type WaitingRow = (
    uuid::Uuid,
    String,
    Option<String>,
    DateTime<Utc>,
    DateTime<Utc>,
);

impl Store {
    /// Inserts `envelope` into `outbox_later`, due at `due_at`. On a
    /// transaction, it waits there once the transaction commits.
    pub(crate) async fn insert_later<'e>(
        &self,
        executor: impl PgExecutor<'e>,
        envelope: &Envelope,
        due_at: DateTime<Utc>,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(INSERT_LATER)
            .bind(envelope.id)
            .bind(&envelope.name)
            .bind(Json(&envelope.payload))
            .bind(Json(&envelope.metadata))
            .bind(envelope.occurred_at)
            .bind(due_at)
            .execute(executor)
            .await?;
        Ok(())
    }

    /// Moves up to `limit` events due at or before `as_of` (the
    /// database's clock when `None`) into `outbox_events`, in one
    /// statement ([`MOVE_DUE`]); returns how many it moved.
    #[cfg(all(feature = "worker", feature = "testing"))]
    pub(crate) async fn move_due<'e>(
        &self,
        executor: impl PgExecutor<'e>,
        limit: u32,
        as_of: Option<DateTime<Utc>>,
    ) -> Result<u64, sqlx::Error> {
        Ok(self
            .move_due_and_look_ahead(executor, limit, as_of)
            .await?
            .0)
    }

    /// [`Store::move_due`], and how long until the next event that is not
    /// due yet is (`None` when none waits).
    #[cfg(feature = "worker")]
    pub(crate) async fn move_due_and_look_ahead<'e>(
        &self,
        executor: impl PgExecutor<'e>,
        limit: u32,
        as_of: Option<DateTime<Utc>>,
    ) -> Result<(u64, Option<std::time::Duration>), sqlx::Error> {
        let (moved, next_in): (i64, Option<f64>) = sqlx::query_as(MOVE_DUE)
            .bind(i64::from(limit))
            .bind(as_of)
            .fetch_one(executor)
            .await?;
        let next_in = next_in.map(|seconds| std::time::Duration::from_secs_f64(seconds.max(0.0)));
        Ok((moved.max(0) as u64, next_in))
    }

    /// How many events wait, and when the next is due.
    #[cfg(feature = "worker")]
    pub(crate) async fn waiting<'e>(
        &self,
        executor: impl PgExecutor<'e>,
    ) -> Result<Waiting, sqlx::Error> {
        let (events, next_due) = sqlx::query_as("SELECT count(*), min(due_at) FROM outbox_later")
            .fetch_one(executor)
            .await?;
        Ok(Waiting { events, next_due })
    }

    /// The next `limit` events to come due, earliest first.
    #[cfg(feature = "worker")]
    pub(crate) async fn next_waiting<'e>(
        &self,
        executor: impl PgExecutor<'e>,
        limit: u32,
    ) -> Result<Vec<WaitingEvent>, sqlx::Error> {
        let rows: Vec<WaitingRow> = sqlx::query_as(
            "SELECT event_id, event_name, metadata ->> 'order_key', created_at, due_at \
                 FROM outbox_later ORDER BY due_at, id LIMIT $1",
        )
        .bind(i64::from(limit))
        .fetch_all(executor)
        .await?;
        Ok(rows
            .into_iter()
            .map(
                |(event_id, event_name, order_key, dispatched_at, due_at)| WaitingEvent {
                    event_id,
                    event_name,
                    order_key,
                    dispatched_at,
                    due_at,
                },
            )
            .collect())
    }
}

/// The mover, in the worker beside the relay (feature `worker`).
#[cfg(feature = "worker")]
pub(crate) mod mover {
    use std::sync::Arc;
    use std::time::Duration;

    use sqlx::PgPool;
    use tokio::sync::Notify;
    use tokio_util::sync::CancellationToken;

    use super::super::Store;
    use super::super::relay::{Backoff, MAX_BACKOFF};

    /// How often the mover looks for due events at least. Between two
    /// looks it sleeps until the next due time it saw, when that is
    /// sooner: an event dispatched at least this long before it is due
    /// enters `outbox_events` at its due time (to the few milliseconds of
    /// a statement), and one dispatched closer to it at most this long
    /// after it, while the worker runs. The relay, woken by the move,
    /// publishes it at once.
    pub(crate) const MOVE_INTERVAL: Duration = Duration::from_secs(1);

    /// Events moved per statement.
    pub(crate) const MOVE_BATCH: u32 = 1_000;

    /// Moves every event due now, batch by batch; the total moved, and
    /// how long until the next event not due yet.
    pub(crate) async fn move_all_due(
        pool: &PgPool,
    ) -> Result<(u64, Option<Duration>), sqlx::Error> {
        let mut total = 0;
        loop {
            let (moved, next_in) = Store
                .move_due_and_look_ahead(pool, MOVE_BATCH, None)
                .await?;
            total += moved;
            if moved < u64::from(MOVE_BATCH) {
                return Ok((total, next_in));
            }
        }
    }

    /// Moves due events until `shutdown`: every [`MOVE_INTERVAL`], or at
    /// the next due time when that is sooner; wakes the relay (`relay`)
    /// after a move; a failure backs off as the relay's rounds do. On its
    /// own task and its own connection, so a million waiting events never
    /// slow the relay's claim.
    pub(crate) async fn run(pool: PgPool, relay: Arc<Notify>, shutdown: CancellationToken) {
        let mut backoff = Backoff::new(MOVE_INTERVAL, MAX_BACKOFF);
        while !shutdown.is_cancelled() {
            let moved = tokio::select! {
                () = shutdown.cancelled() => break,
                moved = move_all_due(&pool) => moved,
            };
            let wait = match moved {
                Ok((moved, next_in)) => {
                    backoff.reset();
                    if moved > 0 {
                        tracing::debug!(moved, "due events moved into the outbox");
                        relay.notify_one();
                    }
                    next_in.map_or(MOVE_INTERVAL, |next_in| next_in.min(MOVE_INTERVAL))
                }
                Err(err) => {
                    let wait = backoff.next_delay();
                    tracing::warn!(error = %err, retry_in = ?wait, "moving due events into the outbox failed");
                    wait
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }
}
