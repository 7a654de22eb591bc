//! Deletes published outbox rows once they are older than `OUTBOX_RETENTION`,
//! every `OUTBOX_CLEANUP_INTERVAL`, in bounded batches of short transactions.
//! Safe in every replica: rows another cleaner holds are skipped.

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::Store;

/// Rows deleted per statement.
pub const CLEANUP_BATCH: u32 = 1_000;

/// Deletes every row published longer ago than `retention`, batch by batch,
/// and returns how many it deleted.
pub async fn delete_expired(pool: &PgPool, retention: Duration) -> Result<u64, sqlx::Error> {
    let mut total = 0;
    loop {
        let deleted = Store
            .delete_published(pool, retention, CLEANUP_BATCH)
            .await?;
        total += deleted;
        if deleted < u64::from(CLEANUP_BATCH) {
            return Ok(total);
        }
    }
}

/// Runs [`delete_expired`] at start and then every `interval`, until
/// `shutdown` is cancelled.
pub async fn run(
    pool: PgPool,
    retention: Duration,
    interval: Duration,
    shutdown: CancellationToken,
) {
    loop {
        // A hung database must not hold up shutdown: the batch in hand is
        // rolled back, and the next run deletes it.
        let deleted = tokio::select! {
            () = shutdown.cancelled() => break,
            deleted = delete_expired(&pool, retention) => deleted,
        };
        match deleted {
            Ok(0) => {}
            Ok(deleted) => tracing::info!(deleted, "deleted published outbox events"),
            Err(err) => tracing::warn!(error = %err, "outbox cleanup failed"),
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(interval) => {}
        }
    }
}
