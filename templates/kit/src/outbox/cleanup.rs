//! Deletes published outbox rows once they are older than `OUTBOX_RETENTION`,
//! every `OUTBOX_CLEANUP_INTERVAL`, in bounded batches of short transactions.
//! Safe in every replica: rows another cleaner holds are skipped. Keys of
//! `kit::dispatch_unique` whose window is over go at the same interval.
//!
//! `in_batches` and [`every`] are the shape of any such cleanup; the
//! inbox's (`worker::inbox`) uses them too.

use std::future::Future;
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::Store;

/// Rows deleted per statement.
pub const CLEANUP_BATCH: u32 = 1_000;

/// Deletes every row published longer ago than `retention`, batch by batch,
/// and returns how many it deleted.
pub(crate) async fn delete_expired(pool: &PgPool, retention: Duration) -> Result<u64, sqlx::Error> {
    in_batches(|| Store.delete_published(pool, retention, CLEANUP_BATCH)).await
}

/// Runs [`delete_expired`] at start and then every `interval`, until
/// `shutdown` is cancelled.
pub(crate) async fn run(
    pool: PgPool,
    retention: Duration,
    interval: Duration,
    shutdown: CancellationToken,
) {
    tokio::join!(
        every(
            "published outbox events",
            interval,
            shutdown.clone(),
            || { delete_expired(&pool, retention) }
        ),
        every("expired unique keys", interval, shutdown, || {
            delete_expired_keys(&pool)
        }),
    );
}

/// Deletes every key of `kit::dispatch_unique` whose window is over, batch
/// by batch, and returns how many it deleted (a dispatch after the window
/// would take the key over anyway: this keeps keys used once from piling
/// up).
pub(crate) async fn delete_expired_keys(pool: &PgPool) -> Result<u64, sqlx::Error> {
    in_batches(|| Store.delete_expired_keys(pool, CLEANUP_BATCH)).await
}

/// Calls `delete_batch` (which deletes at most [`CLEANUP_BATCH`] rows and
/// says how many) until a batch comes back short; the total deleted.
pub(crate) async fn in_batches<F, Fut>(mut delete_batch: F) -> Result<u64, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<u64, sqlx::Error>>,
{
    let mut total = 0;
    loop {
        let deleted = delete_batch().await?;
        total += deleted;
        if deleted < u64::from(CLEANUP_BATCH) {
            return Ok(total);
        }
    }
}

/// Runs `delete` at start and then every `interval` until `shutdown` is
/// cancelled, logging how many `what` it deleted.
pub(crate) async fn every<F, Fut>(
    what: &'static str,
    interval: Duration,
    shutdown: CancellationToken,
    mut delete: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<u64, sqlx::Error>>,
{
    loop {
        // A hung database must not hold up shutdown: the batch in hand is
        // rolled back, and the next run deletes it.
        let deleted = tokio::select! {
            () = shutdown.cancelled() => break,
            deleted = delete() => deleted,
        };
        match deleted {
            Ok(0) => {}
            Ok(deleted) => tracing::info!(deleted, "deleted {what}"),
            Err(err) => tracing::warn!(error = %err, "cleanup of {what} failed"),
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(interval) => {}
        }
    }
}
