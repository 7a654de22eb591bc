//! A queue belongs to one service: the chains of its ordered listeners are
//! kept beside the queue, and two services consuming one queue would take
//! each other's events. A worker with ordered listeners records its
//! service on each queue it consumes while it runs ([`OWN`]: the record
//! lasts [`HELD_FOR`] past the last refresh, every 10 s), and does not
//! start while another service's record is there. A service is its
//! database: the id the kit's migration gave it (`outbox_service`), or
//! `WORKER_SERVICE_ID` when set (two copies of one database, such as a
//! staging restored from production, that share a Valkey).

use std::time::Duration;

use sqlx::PgPool;

use super::keys::Namespace;
use super::scripts::OWN;
use super::{Ordering, millis};
use crate::queue::QueueError;

/// How long a service's record on a queue outlasts its last refresh.
pub(crate) const HELD_FOR: Duration = Duration::from_secs(60);

/// The service's id: `configured`, else its database's.
pub(crate) async fn service_id(pool: &PgPool, configured: Option<&str>) -> anyhow::Result<String> {
    if let Some(id) = configured {
        return Ok(id.to_string());
    }
    let id: Option<uuid::Uuid> = sqlx::query_scalar("SELECT id FROM outbox_service")
        .fetch_optional(pool)
        .await
        .map_err(|err| {
            anyhow::anyhow!(
                "cannot read this service's id from `outbox_service` ({err}): apply the \
                 migrations (cargo run --bin migrate -- up)"
            )
        })?;
    id.map(|id| id.to_string()).ok_or_else(|| {
        anyhow::anyhow!(
            "`outbox_service` has no row: apply the migrations (cargo run --bin migrate -- up)"
        )
    })
}

/// Another service's workers consume a queue of this one.
#[derive(Debug, thiserror::Error)]
#[error(
    "queue `{queue}` is consumed by the workers of another service (id {other}; this one is \
     {this}): two services cannot share a queue, since each takes the other's events and keeps \
     the order of its listeners beside it. Give this service queues of its own (WORKER_QUEUES \
     and OUTBOX_QUEUES), or stop the other service's workers (its record expires {held_for} s \
     after). Two copies of one database sharing a Valkey set WORKER_SERVICE_ID apart"
)]
pub(crate) struct QueueTaken {
    pub queue: String,
    pub other: String,
    pub this: String,
    pub held_for: u64,
}

impl Ordering {
    /// Records `service` on each queue (or refreshes its record); an error
    /// names a queue another service's workers hold.
    pub(crate) async fn own_queues(&self, service: &str) -> anyhow::Result<()> {
        let mut conn = self.queue.connection();
        for queue in self.queues.iter() {
            let other: String = OWN
                .key(Namespace::of_queue(queue).service())
                .arg(service)
                .arg(millis(HELD_FOR))
                .invoke_async(&mut conn)
                .await
                .map_err(QueueError::from)?;
            if !other.is_empty() {
                return Err(QueueTaken {
                    queue: queue.clone(),
                    other,
                    this: service.to_string(),
                    held_for: HELD_FOR.as_secs(),
                }
                .into());
            }
        }
        Ok(())
    }
}
