//! The SQL on `outbox_events` that the `outbox` command needs: events by
//! id, filtered lists, the table's figures, and batched deletes.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::types::Json;
use sqlx::{PgPool, Postgres, QueryBuilder};
use uuid::Uuid;

use crate::outbox::NOT_HELD;

use crate::outbox::{Envelope, Metadata};

/// One row of `outbox_events`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct EventRow {
    pub(crate) id: Uuid,
    pub(crate) name: String,
    pub(crate) created_at: DateTime<Utc>,
    /// `None` while the relay has not published it.
    pub(crate) published_at: Option<DateTime<Utc>>,
    pub(crate) payload: serde_json::Value,
    pub(crate) metadata: Metadata,
}

impl EventRow {
    /// The envelope as the relay queued it.
    pub(crate) fn envelope(&self) -> Envelope {
        Envelope {
            id: self.id,
            name: self.name.clone(),
            payload: self.payload.clone(),
            metadata: self.metadata.clone(),
            occurred_at: self.created_at,
        }
    }

    /// The W3C trace id in the metadata's `traceparent`, if any.
    /// Only 32 lowercase hex digits count (W3C's form): the console puts
    /// it into a link.
    pub(crate) fn trace_id(&self) -> Option<&str> {
        let traceparent = self.metadata.get("traceparent")?;
        traceparent.split('-').nth(1).filter(|id| {
            id.len() == 32
                && id
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
    }
}

type Row = (
    Uuid,
    String,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
    Json<serde_json::Value>,
    Json<Metadata>,
);

const COLUMNS: &str =
    "SELECT event_id, event_name, created_at, published_at, payload, metadata FROM outbox_events";

fn to_event((id, name, created_at, published_at, payload, metadata): Row) -> EventRow {
    EventRow {
        id,
        name,
        created_at,
        published_at,
        payload: payload.0,
        metadata: metadata.0,
    }
}

/// Which events to list.
#[derive(Debug, Clone, Default)]
pub(crate) struct Filter {
    pub(crate) name: Option<String>,
    /// `Some(true)`: published only; `Some(false)`: unpublished only.
    pub(crate) published: Option<bool>,
    /// Created at or after.
    pub(crate) since: Option<DateTime<Utc>>,
    /// Created before.
    pub(crate) until: Option<DateTime<Utc>>,
    pub(crate) limit: Option<u32>,
    /// Newest first (lists) or oldest first (replays).
    pub(crate) newest_first: bool,
}

/// The events with these ids, in no particular order; unknown ids are
/// simply absent.
pub(crate) async fn by_ids(pool: &PgPool, ids: &[Uuid]) -> Result<Vec<EventRow>, sqlx::Error> {
    let rows: Vec<Row> = sqlx::query_as(&format!("{COLUMNS} WHERE event_id = ANY($1)"))
        .bind(ids)
        .fetch_all(pool)
        .await?;
    Ok(rows.into_iter().map(to_event).collect())
}

/// The events that pass `filter`.
pub(crate) async fn list(pool: &PgPool, filter: &Filter) -> Result<Vec<EventRow>, sqlx::Error> {
    let mut query: QueryBuilder<Postgres> = QueryBuilder::new(COLUMNS);
    query.push(" WHERE true");
    if let Some(name) = &filter.name {
        query.push(" AND event_name = ").push_bind(name.clone());
    }
    match filter.published {
        Some(true) => query.push(" AND published_at IS NOT NULL"),
        Some(false) => query.push(" AND published_at IS NULL"),
        None => &mut query,
    };
    if let Some(since) = filter.since {
        query.push(" AND created_at >= ").push_bind(since);
    }
    if let Some(until) = filter.until {
        query.push(" AND created_at < ").push_bind(until);
    }
    query.push(if filter.newest_first {
        " ORDER BY id DESC"
    } else {
        " ORDER BY id"
    });
    if let Some(limit) = filter.limit {
        query.push(" LIMIT ").push_bind(i64::from(limit));
    }
    let rows: Vec<Row> = query.build_query_as().fetch_all(pool).await?;
    Ok(rows.into_iter().map(to_event).collect())
}

/// The table's figures for `outbox status`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(crate) struct TableStats {
    pub(crate) unpublished: i64,
    /// Age of the oldest unpublished event: the relay's lag.
    pub(crate) oldest_unpublished_age_seconds: Option<f64>,
    pub(crate) published_last_minute: i64,
    pub(crate) published_last_hour: i64,
    /// Published longer ago than `OUTBOX_RETENTION`: the cleanup loop's
    /// next work.
    pub(crate) due_for_cleanup: i64,
    /// The table with its indexes and TOAST, in bytes.
    pub(crate) table_bytes: i64,
}

type StatsRow = (i64, Option<f64>, i64, i64, i64, i64);

/// The table's figures, in one statement: the unpublished rows through
/// their partial index, the rest in one pass over the table.
pub(crate) async fn stats(pool: &PgPool, retention: Duration) -> Result<TableStats, sqlx::Error> {
    let (unpublished, oldest, last_minute, last_hour, due, bytes): StatsRow = sqlx::query_as(
        "SELECT u.count, u.oldest, p.last_minute, p.last_hour, p.due, \
                pg_total_relation_size('outbox_events') \
         FROM (SELECT count(*) AS count, \
                      extract(epoch FROM now() - min(created_at))::float8 AS oldest \
               FROM outbox_events WHERE published_at IS NULL) u, \
              (SELECT count(*) FILTER (WHERE published_at >= now() - interval '1 minute') \
                        AS last_minute, \
                      count(*) FILTER (WHERE published_at >= now() - interval '1 hour') \
                        AS last_hour, \
                      count(*) FILTER (WHERE published_at < now() - make_interval(secs => $1)) \
                        AS due \
               FROM outbox_events) p",
    )
    .bind(retention.as_secs_f64())
    .fetch_one(pool)
    .await?;
    Ok(TableStats {
        unpublished,
        oldest_unpublished_age_seconds: oldest.map(|s| s.max(0.0)),
        published_last_minute: last_minute,
        published_last_hour: last_hour,
        due_for_cleanup: due,
        table_bytes: bytes,
    })
}

/// Deletes up to `limit` rows published before `before`, oldest first, and
/// returns how many. Rows another cleaner holds are skipped.
pub(crate) async fn delete_published_before(
    pool: &PgPool,
    before: DateTime<Utc>,
    limit: u32,
    include_held: bool,
) -> Result<u64, sqlx::Error> {
    let held = if include_held { "true" } else { NOT_HELD };
    let done = sqlx::query(&format!(
        "DELETE FROM outbox_events WHERE id IN ( \
           SELECT id FROM outbox_events WHERE published_at < $1 AND {held} \
           ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)"
    ))
    .bind(before)
    .bind(i64::from(limit))
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}

/// How many rows were published before `before`, and how many of them a
/// held key keeps.
pub(crate) async fn count_published_before(
    pool: &PgPool,
    before: DateTime<Utc>,
) -> Result<(i64, i64), sqlx::Error> {
    sqlx::query_as(&format!(
        "SELECT count(*), count(*) FILTER (WHERE NOT {NOT_HELD}) \
         FROM outbox_events WHERE published_at < $1"
    ))
    .bind(before)
    .fetch_one(pool)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trace_id_comes_from_the_traceparent() {
        let mut row = EventRow {
            id: Uuid::nil(),
            name: "orderPlaced".into(),
            created_at: Utc::now(),
            published_at: None,
            payload: serde_json::Value::Null,
            metadata: Metadata::new(),
        };
        assert_eq!(row.trace_id(), None);
        row.metadata.insert(
            "traceparent".into(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
        );
        assert_eq!(row.trace_id(), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        row.metadata.insert(
            "traceparent".into(),
            "00-4bf92f3577b34da6a3ce929d0e0e47/\"-00f067aa0ba902b7-01".into(),
        );
        assert_eq!(row.trace_id(), None);
    }
}
