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
//! their dispatch order): one mover moves at a time, across replicas
//! (an advisory lock, [`MOVER_LOCK`]). The mover never waits on a user's
//! transaction: the events of a key whose row such a transaction holds
//! are left for the next round, and the others move. In `outbox_events`
//! the event's time
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

/// The key of the advisory lock a mover holds while it moves a batch
/// (`pg_try_advisory_xact_lock`): one mover at a time, in every replica,
/// so that the delayed events of one key are numbered in the order of
/// their due times. A mover that finds it held skips its round.
#[cfg(feature = "worker")]
pub(crate) const MOVER_LOCK: i64 = 0x6770_6b69_745f_6d76;

/// How long a mover waits at most to make the `outbox_keys` row of a key
/// that has none while a transaction that is not committed yet makes it
/// too: past it, that key's events are left for the next round. Set for
/// the batch's transaction, it also bounds any other wait a batch would
/// make (it takes its locks with `SKIP LOCKED`, so none is expected): the
/// batch fails then, and the mover backs off.
#[cfg(feature = "worker")]
const KEY_ROW_WAIT: &str = "SET LOCAL lock_timeout = '50ms'";

/// The keys, among the next `$1` events due at or before `$2` (the
/// database's `now()` when null) whose key is not in `$3`, that have no
/// row in `outbox_keys` (their first event, or an idle key's row was
/// deleted).
#[cfg(feature = "worker")]
const KEYS_WITHOUT_A_ROW: &str = "\
SELECT DISTINCT d.key FROM ( \
  SELECT metadata ->> 'order_key' AS key FROM outbox_later \
  WHERE due_at <= coalesce($2::timestamptz, now()) \
    AND NOT coalesce(metadata ->> 'order_key' = ANY ($3::text[]), false) \
  ORDER BY due_at, id LIMIT $1) d \
WHERE d.key IS NOT NULL AND NOT EXISTS (SELECT 1 FROM outbox_keys k WHERE k.key = d.key)";

/// Makes the `outbox_keys` rows of the keys `$1`, numbered from 0.
#[cfg(feature = "worker")]
const INSERT_KEY_ROWS: &str = "\
INSERT INTO outbox_keys (key, seq) SELECT unnest($1::text[]), 0 ON CONFLICT (key) DO NOTHING";

/// The statement that moves up to `$1` events due at or before `$2` (the
/// database's `now()` when null) whose key is not in `$3`, from
/// `outbox_later` into `outbox_events`, in due order. It never waits: it
/// skips the rows of `outbox_later` another transaction holds, and the
/// keys whose `outbox_keys` row another transaction holds (a user's
/// transaction that dispatched an event of the key and is still open):
/// those keys' events stay for the next round, every other event moves. A
/// keyed event takes its key's next number. Returns how many it moved, how
/// many it looked at, the keys it left, and in how many seconds the next
/// event not yet due is (by the database's clock; null when none waits).
#[cfg(feature = "worker")]
pub(crate) const MOVE_DUE: &str = "\
WITH candidates AS ( \
  SELECT id, metadata ->> 'order_key' AS key FROM outbox_later \
  WHERE due_at <= coalesce($2::timestamptz, now()) \
    AND NOT coalesce(metadata ->> 'order_key' = ANY ($3::text[]), false) \
  ORDER BY due_at, id LIMIT $1 FOR UPDATE SKIP LOCKED), \
locked AS ( \
  SELECT k.key FROM outbox_keys k WHERE k.key IN (SELECT key FROM candidates) \
  ORDER BY k.key FOR UPDATE SKIP LOCKED), \
due AS ( \
  DELETE FROM outbox_later l USING candidates c \
  WHERE l.id = c.id AND (c.key IS NULL OR c.key IN (SELECT key FROM locked)) \
  RETURNING l.id, l.event_id, l.event_name, l.payload, l.metadata, l.due_at), \
ranked AS ( \
  SELECT due.*, metadata ->> 'order_key' AS key, \
    row_number() OVER (PARTITION BY metadata ->> 'order_key' ORDER BY due_at, id) AS rank, \
    count(*) OVER (PARTITION BY metadata ->> 'order_key') AS taken \
  FROM due), \
numbered AS ( \
  UPDATE outbox_keys k SET seq = k.seq + t.taken, updated_at = now() \
  FROM (SELECT key, max(taken) AS taken FROM ranked WHERE key IS NOT NULL GROUP BY key) t \
  WHERE k.key = t.key \
  RETURNING k.key, k.seq, k.epoch), \
moved AS ( \
  INSERT INTO outbox_events (event_id, event_name, payload, metadata, created_at) \
  SELECT r.event_id, r.event_name, r.payload, \
    CASE WHEN n.key IS NULL THEN r.metadata ELSE r.metadata || jsonb_build_object( \
      'order_seq', (n.seq - r.taken + r.rank)::text, 'order_epoch', n.epoch::text) END, \
    r.due_at \
  FROM ranked r LEFT JOIN numbered n ON n.key = r.key \
  ORDER BY r.due_at, r.id \
  RETURNING 1) \
SELECT (SELECT count(*) FROM moved), (SELECT count(*) FROM candidates), \
  (SELECT coalesce(array_agg(DISTINCT key), '{}') FROM candidates \
   WHERE key IS NOT NULL AND key NOT IN (SELECT key FROM locked)), \
  (SELECT extract(epoch FROM min(due_at) - clock_timestamp())::float8 FROM outbox_later \
   WHERE due_at > coalesce($2::timestamptz, now()))";

/// What a mover's round did ([`Store::move_due_and_look_ahead`]).
#[cfg(feature = "worker")]
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Round {
    /// Events moved into `outbox_events`.
    pub(crate) moved: u64,
    /// Keys whose due events were left for the next round: another
    /// transaction held their `outbox_keys` row.
    pub(crate) left: Vec<String>,
    /// How long until the next event that is not due yet (`None` when
    /// none waits, or the round was skipped).
    pub(crate) next_in: Option<std::time::Duration>,
    /// Whether another mover held [`MOVER_LOCK`], so that this round
    /// stopped there.
    pub(crate) skipped: bool,
}

/// What one batch of a round did: moved, looked at, left, next in.
#[cfg(feature = "worker")]
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Batch {
    pub(crate) moved: u64,
    pub(crate) seen: u64,
    pub(crate) left: Vec<String>,
    pub(crate) next_in: Option<std::time::Duration>,
}

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

    /// Moves every event due at or before `as_of` (the database's clock
    /// when `None`) into `outbox_events`, as the worker's mover does,
    /// waiting for another mover's batch to end rather than skipping;
    /// returns how many it moved.
    #[cfg(all(feature = "worker", feature = "testing"))]
    pub(crate) async fn move_due(
        &self,
        pool: &sqlx::PgPool,
        limit: u32,
        as_of: Option<DateTime<Utc>>,
    ) -> Result<u64, sqlx::Error> {
        let mut moved = 0;
        loop {
            let round = self.move_due_and_look_ahead(pool, limit, as_of).await?;
            moved += round.moved;
            if !round.skipped {
                return Ok(moved);
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// One round of the mover: batch after batch of up to `limit` events
    /// due at or before `as_of` (the database's clock when `None`), each
    /// in a transaction of its own that holds [`MOVER_LOCK`], until none
    /// is left but those of keys another transaction holds. Another mover
    /// holding the lock ends the round (`skipped`).
    #[cfg(feature = "worker")]
    pub(crate) async fn move_due_and_look_ahead(
        &self,
        pool: &sqlx::PgPool,
        limit: u32,
        as_of: Option<DateTime<Utc>>,
    ) -> Result<Round, sqlx::Error> {
        let mut round = Round::default();
        loop {
            let mut tx = pool.begin().await?;
            if !self.take_mover_lock(&mut tx).await? {
                tx.rollback().await?;
                round.skipped = true;
                return Ok(round);
            }
            let batch = self
                .move_due_batch(&mut tx, limit, as_of, &round.left)
                .await?;
            tx.commit().await?;
            round.moved += batch.moved;
            round.left.extend(batch.left);
            round.next_in = batch.next_in;
            if batch.seen < u64::from(limit) {
                return Ok(round);
            }
        }
    }

    /// Takes [`MOVER_LOCK`] in the transaction on `conn`, if no other
    /// mover holds it; whether it got it.
    #[cfg(feature = "worker")]
    pub(crate) async fn take_mover_lock(
        &self,
        conn: &mut sqlx::PgConnection,
    ) -> Result<bool, sqlx::Error> {
        sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
            .bind(MOVER_LOCK)
            .fetch_one(conn)
            .await
    }

    /// One batch ([`MOVE_DUE`]) in the transaction on `conn`, which holds
    /// [`MOVER_LOCK`], leaving out the events of the keys in `left`: makes
    /// the missing `outbox_keys` rows first, waiting at most
    /// [`KEY_ROW_WAIT`] for each.
    #[cfg(feature = "worker")]
    pub(crate) async fn move_due_batch(
        &self,
        conn: &mut sqlx::PgConnection,
        limit: u32,
        as_of: Option<DateTime<Utc>>,
        left: &[String],
    ) -> Result<Batch, sqlx::Error> {
        sqlx::query(KEY_ROW_WAIT).execute(&mut *conn).await?;
        let missing: Vec<String> = sqlx::query_scalar(KEYS_WITHOUT_A_ROW)
            .bind(i64::from(limit))
            .bind(as_of)
            .bind(left)
            .fetch_all(&mut *conn)
            .await?;
        // One statement for all; if a key's row is being made by a
        // transaction still open, one per key, so that only that one waits.
        if !missing.is_empty() && !insert_key_rows(conn, &missing).await? && missing.len() > 1 {
            for key in &missing {
                insert_key_rows(conn, std::slice::from_ref(key)).await?;
            }
        }
        let (moved, seen, left, next_in): (i64, i64, Vec<String>, Option<f64>) =
            sqlx::query_as(MOVE_DUE)
                .bind(i64::from(limit))
                .bind(as_of)
                .bind(left)
                .fetch_one(&mut *conn)
                .await?;
        Ok(Batch {
            moved: moved.max(0) as u64,
            seen: seen.max(0) as u64,
            left,
            next_in: next_in.map(|seconds| std::time::Duration::from_secs_f64(seconds.max(0.0))),
        })
    }

    /// In how long the next waiting event is due (zero when one is due
    /// now), by the database's clock; `None` when none waits. One read of
    /// the due index, outside a transaction: the mover's look before it
    /// takes its lock and moves.
    #[cfg(feature = "worker")]
    pub(crate) async fn next_due_in<'e>(
        &self,
        executor: impl PgExecutor<'e>,
    ) -> Result<Option<std::time::Duration>, sqlx::Error> {
        let seconds: Option<f64> = sqlx::query_scalar(
            "SELECT extract(epoch FROM min(due_at) - clock_timestamp())::float8 FROM outbox_later",
        )
        .fetch_one(executor)
        .await?;
        Ok(seconds.map(|seconds| std::time::Duration::from_secs_f64(seconds.max(0.0))))
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

/// Makes the `outbox_keys` rows of `keys` in a savepoint of the
/// transaction on `conn`; `false`, the savepoint rolled back, when one of
/// them is being made by another transaction that did not end within
/// [`KEY_ROW_WAIT`] (lock timeout).
#[cfg(feature = "worker")]
async fn insert_key_rows(
    conn: &mut sqlx::PgConnection,
    keys: &[String],
) -> Result<bool, sqlx::Error> {
    use sqlx::Connection as _;
    let mut savepoint = conn.begin().await?;
    match sqlx::query(INSERT_KEY_ROWS)
        .bind(keys)
        .execute(&mut *savepoint)
        .await
    {
        Ok(_) => {
            savepoint.commit().await?;
            Ok(true)
        }
        Err(sqlx::Error::Database(err)) if err.code().as_deref() == Some("55P03") => {
            savepoint.rollback().await?;
            Ok(false)
        }
        Err(err) => Err(err),
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

    /// Moves due events until `shutdown`: every [`MOVE_INTERVAL`], or at
    /// the next due time when that is sooner; wakes the relay (`relay`)
    /// after a move; a failure backs off as the relay's rounds do. On its
    /// own task and its own connection, so a million waiting events never
    /// slow the relay's claim.
    pub(crate) async fn run(pool: PgPool, relay: Arc<Notify>, shutdown: CancellationToken) {
        let mut backoff = Backoff::new(MOVE_INTERVAL, MAX_BACKOFF);
        while !shutdown.is_cancelled() {
            // A look first: while no event is due, the round is one read,
            // with no transaction or lock (under load, a round each second
            // that took them delayed the relay's rounds).
            let look = tokio::select! {
                () = shutdown.cancelled() => break,
                look = Store.next_due_in(&pool) => look,
            };
            let round = match look {
                Ok(None) => Ok(super::Round::default()),
                Ok(Some(next_in)) if !next_in.is_zero() => Ok(super::Round {
                    next_in: Some(next_in),
                    ..super::Round::default()
                }),
                Ok(Some(_)) => tokio::select! {
                    () = shutdown.cancelled() => break,
                    round = Store.move_due_and_look_ahead(&pool, MOVE_BATCH, None) => round,
                },
                Err(err) => Err(err),
            };
            let wait = match round {
                Ok(round) => {
                    backoff.reset();
                    if round.moved > 0 {
                        tracing::debug!(moved = round.moved, "due events moved into the outbox");
                        relay.notify_one();
                    }
                    if !round.left.is_empty() {
                        tracing::debug!(keys = ?round.left, "due events of keys another transaction holds left for the next round");
                    }
                    round
                        .next_in
                        .map_or(MOVE_INTERVAL, |next_in| next_in.min(MOVE_INTERVAL))
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
