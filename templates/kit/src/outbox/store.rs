//! The SQL on `outbox_events` that storing an event runs. Every function
//! takes the executor to run on, so an insert joins whatever transaction the
//! caller is in. The relay's side (claiming and marking rows, in one
//! transaction of its own) is `claims`.

use sqlx::PgExecutor;
use sqlx::types::Json;

use super::Envelope;
use super::order::{INSERT_KEYED, ORDER_KEY, write_place};

/// The statement that stores an event without a key: binds event id, name,
/// payload, metadata, time; returns the row id, and no sequence number (a
/// keyed event's is `super::order::INSERT_KEYED`, which returns both).
pub(super) const INSERT: &str = "\
INSERT INTO outbox_events (event_id, event_name, payload, metadata, created_at) \
VALUES ($1, $2, $3, $4, $5) RETURNING id, NULL::bigint, NULL::bigint";

/// Access to the `outbox_events` table.
#[derive(Debug, Clone, Copy, Default)]
pub struct Store;

impl Store {
    /// Inserts `envelope` as an unpublished row and returns the row id. On a
    /// transaction, the row is visible to the relay only after commit. An
    /// envelope with an `order_key` in its metadata takes the key's next
    /// sequence number (`super::order`), which is written, with its
    /// numbering's epoch, into the row's metadata and into `envelope`'s.
    pub(crate) async fn insert<'e>(
        &self,
        executor: impl PgExecutor<'e>,
        envelope: &mut Envelope,
    ) -> Result<i64, sqlx::Error> {
        let key = envelope.metadata.get(ORDER_KEY).cloned();
        let statement = if key.is_some() { INSERT_KEYED } else { INSERT };
        let mut query = sqlx::query_as(statement)
            .bind(envelope.id)
            .bind(&envelope.name)
            .bind(Json(&envelope.payload))
            .bind(Json(&envelope.metadata))
            .bind(envelope.occurred_at);
        if let Some(key) = key {
            query = query.bind(key);
        }
        let (id, seq, epoch): (i64, Option<i64>, Option<i64>) = query.fetch_one(executor).await?;
        // The commit of the transaction this runs in wakes the relays.
        crate::commit_hooks::events_stored();
        if let (Some(seq), Some(epoch)) = (seq, epoch) {
            write_place(&mut envelope.metadata, seq, epoch);
        }
        Ok(id)
    }
}
