//! Helpers for the project's tests: bring a test database up to date.

use std::path::Path;

use sqlx::PgPool;

use super::runner::{Error, Migrator};

/// Applies every pending migration in `dir` to the database behind `pool`, with
/// goose's log lines silenced. Returns the resulting version.
pub async fn up(pool: &PgPool, dir: impl AsRef<Path>) -> Result<i64, Error> {
    let mut conn = pool.acquire().await?;
    Migrator::new(dir.as_ref())
        .logger(|_| {})
        .up(&mut conn)
        .await
}
