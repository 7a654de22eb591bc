//! The Postgres advisory lock that keeps two `migrate` runs from interleaving.
//!
//! The lock is goose's: session-level `pg_try_advisory_lock(4097083626)` (the CRC-32
//! of "goose"), taken on the same connection that runs the migrations, so goose's
//! own Provider-based runners and this tool exclude each other. goose polls every
//! 5 s up to 60 times; by default this polls every second for up to 5 minutes, which
//! gives the same patience with less waiting after the other run finishes.
//!
//! The lock belongs to the database session: if the process dies, Postgres releases
//! it when the connection closes.

use std::time::Duration;

use sqlx::PgConnection;

/// goose's `DefaultLockID`: `crc32.ChecksumIEEE("goose")`.
pub(crate) const LOCK_ID: i64 = 4_097_083_626;

/// How to wait for a lock held by someone else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LockOptions {
    /// Time between two attempts.
    pub(crate) poll_interval: Duration,
    /// Attempts before giving up.
    pub(crate) max_attempts: u32,
}

impl Default for LockOptions {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_secs(1),
            max_attempts: 300,
        }
    }
}

/// Errors taking or releasing the lock.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another session held the lock for every attempt.
    #[error("failed to acquire lock: still held by another session after {attempts} attempts")]
    Timeout {
        /// How many attempts were made.
        attempts: u32,
    },
    /// The database failed.
    #[error("failed to acquire lock: {0}")]
    Database(#[from] sqlx::Error),
}

/// Takes the lock on `conn`, polling while another session holds it. `on_wait` is
/// called once, before the first wait.
pub(crate) async fn acquire(
    conn: &mut PgConnection,
    options: LockOptions,
    on_wait: impl FnOnce(),
) -> Result<(), LockError> {
    let mut on_wait = Some(on_wait);
    for attempt in 1..=options.max_attempts.max(1) {
        let (locked,): (bool,) = sqlx::query_as("SELECT pg_try_advisory_lock($1)")
            .bind(LOCK_ID)
            .fetch_one(&mut *conn)
            .await?;
        if locked {
            return Ok(());
        }
        if attempt < options.max_attempts {
            if let Some(notify) = on_wait.take() {
                notify();
            }
            tokio::time::sleep(options.poll_interval).await;
        }
    }
    Err(LockError::Timeout {
        attempts: options.max_attempts.max(1),
    })
}

/// Releases the lock taken by [`acquire`] on the same connection.
pub(crate) async fn release(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(LOCK_ID)
        .execute(conn)
        .await?;
    Ok(())
}
