//! The relay's side of `outbox_events` (feature `worker`): claiming rows
//! and marking them published, giving a claim back, deleting published rows
//! after the retention, and the backlog the metrics report. The scheduler's
//! event ticks insert through [`Store::insert_unless_present`].

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgConnection, PgExecutor};
use uuid::Uuid;

use super::store::Store;
use super::{Envelope, Metadata};

/// A row claimed for publishing: its row id and its event.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ClaimedEvent {
    /// The row's `id` in `outbox_events`.
    pub(crate) row_id: i64,
    /// The event the row holds.
    pub(crate) envelope: Envelope,
}

/// How far behind the relay is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Backlog {
    /// Unpublished rows.
    pub(crate) events: i64,
    /// Age of the oldest unpublished row, if any.
    pub(crate) oldest_age: Option<Duration>,
}

type EventRow = (
    i64,
    Uuid,
    String,
    Json<serde_json::Value>,
    Json<Metadata>,
    DateTime<Utc>,
);

impl Store {
    /// Like [`Store::insert`], unless a row with the envelope's event id
    /// exists: then nothing is written. Returns whether the row was new.
    pub(crate) async fn insert_unless_present<'e>(
        &self,
        executor: impl PgExecutor<'e>,
        envelope: &Envelope,
    ) -> Result<bool, sqlx::Error> {
        let inserted = sqlx::query(
            "INSERT INTO outbox_events (event_id, event_name, payload, metadata, created_at) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (event_id) DO NOTHING",
        )
        .bind(envelope.id)
        .bind(&envelope.name)
        .bind(Json(&envelope.payload))
        .bind(Json(&envelope.metadata))
        .bind(envelope.occurred_at)
        .execute(executor)
        .await?
        .rows_affected();
        Ok(inserted == 1)
    }

    /// Claims up to `limit` unpublished rows with a row id above `after`,
    /// oldest first, skipping rows other relays hold, and marks them
    /// published, in one statement; returns them in id order. The mark
    /// commits or rolls back with `tx`, so a relay that fails before its
    /// commit leaves the rows unpublished; rows it could not deliver it
    /// gives back with [`Store::unmark`]. `after` lets the index scan start
    /// past rows already published (the relay's keyset claiming); 0 scans
    /// from the start.
    pub(crate) async fn claim_and_mark(
        &self,
        tx: &mut PgConnection,
        limit: u32,
        after: i64,
    ) -> Result<Vec<ClaimedEvent>, sqlx::Error> {
        let mut rows: Vec<EventRow> = sqlx::query_as(
            "UPDATE outbox_events SET published_at = now() WHERE id IN ( \
               SELECT id FROM outbox_events WHERE published_at IS NULL AND id > $2 \
               ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) \
             RETURNING id, event_id, event_name, payload, metadata, created_at",
        )
        .bind(i64::from(limit))
        .bind(after)
        .fetch_all(tx)
        .await?;
        // RETURNING follows no order; events go out in id order.
        rows.sort_unstable_by_key(|row| row.0);
        Ok(rows
            .into_iter()
            .map(
                |(row_id, id, name, payload, metadata, occurred_at)| ClaimedEvent {
                    row_id,
                    envelope: Envelope {
                        id,
                        name,
                        payload: payload.0,
                        metadata: metadata.0,
                        occurred_at,
                    },
                },
            )
            .collect())
    }

    /// Gives back rows claimed in `tx` that did not reach the queue: they
    /// are unpublished again when `tx` commits.
    pub(crate) async fn unmark(
        &self,
        tx: &mut PgConnection,
        row_ids: &[i64],
    ) -> Result<u64, sqlx::Error> {
        if row_ids.is_empty() {
            return Ok(0);
        }
        let done = sqlx::query("UPDATE outbox_events SET published_at = NULL WHERE id = ANY($1)")
            .bind(row_ids)
            .execute(tx)
            .await?;
        Ok(done.rows_affected())
    }

    /// Deletes up to `limit` rows published longer than `retention` ago and
    /// returns how many it deleted. Rows another cleaner holds are skipped,
    /// and so are the events a held key keeps ([`NOT_HELD`]).
    pub(crate) async fn delete_published<'e>(
        &self,
        executor: impl PgExecutor<'e>,
        retention: Duration,
        limit: u32,
    ) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(&format!(
            "DELETE FROM outbox_events WHERE id IN ( \
               SELECT id FROM outbox_events \
               WHERE published_at < now() - make_interval(secs => $1) AND {NOT_HELD} \
               ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)"
        ))
        .bind(retention.as_secs_f64())
        .bind(i64::from(limit))
        .execute(executor)
        .await?;
        Ok(done.rows_affected())
    }

    /// The number of unpublished rows and the age of the oldest.
    pub(crate) async fn backlog<'e>(
        &self,
        executor: impl PgExecutor<'e>,
    ) -> Result<Backlog, sqlx::Error> {
        let (events, oldest_age): (i64, Option<f64>) = sqlx::query_as(
            "SELECT count(*), extract(epoch FROM now() - min(created_at))::float8 \
             FROM outbox_events WHERE published_at IS NULL",
        )
        .fetch_one(executor)
        .await?;
        Ok(Backlog {
            events,
            oldest_age: oldest_age.map(|s| Duration::from_secs_f64(s.max(0.0))),
        })
    }
}

/// The condition on an `outbox_events` row that no held key keeps it: a
/// key is held by a failure that holds it (`listener_failures.holds_key`:
/// the first run of an ordered listener's key, failed for good, that
/// keeps the key), which keeps its event and the later events of its key
/// (same epoch) until `outbox` releases the key.
pub(crate) const NOT_HELD: &str = "NOT EXISTS ( \
    SELECT 1 FROM listener_failures f JOIN outbox_events e ON e.event_id = f.event_id \
    WHERE f.holds_key AND e.metadata ->> 'order_key' = outbox_events.metadata ->> 'order_key' \
      AND (coalesce((outbox_events.metadata ->> 'order_epoch')::bigint, 0), \
           (outbox_events.metadata ->> 'order_seq')::bigint) \
       >= (coalesce((e.metadata ->> 'order_epoch')::bigint, 0), \
           (e.metadata ->> 'order_seq')::bigint))";
