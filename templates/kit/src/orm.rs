//! SeaORM on the project's Postgres pool: the [`DatabaseConnection`] and the
//! [`Transactor`] that runs a unit of work in one SeaORM transaction.
//!
//! The connection wraps the same sqlx pool as the rest of the service, so
//! `migrate`, the relay and the listeners' inbox keep working on sqlx, and
//! the pool's settings (size, timeouts, statement timeout) apply to SeaORM
//! too.

use std::fmt;

use sea_orm::{DatabaseConnection, DatabaseTransaction, SqlxPostgresConnector, TransactionTrait};
use sqlx::PgPool;

use crate::commit_hooks::{CommitHooks, noting_events};

/// A SeaORM connection on `pool`: it opens no connections of its own.
pub fn connection(pool: &PgPool) -> DatabaseConnection {
    SqlxPostgresConnector::from_sqlx_postgres_pool(pool.clone())
}

/// Runs closures in a SeaORM transaction: commit when the closure returns
/// `Ok`, roll back when it returns `Err` or panics.
///
/// Everything the closure does through the `&DatabaseTransaction` it is
/// handed (entity inserts and updates, queries, [`crate::dispatch()`])
/// commits or rolls back together. The closure returns an
/// [`anyhow::Result`], so `?` works on any error and no type annotation is
/// needed:
///
/// ```no_run
/// # use sea_orm::ConnectionTrait;
/// # async fn example(transactor: &kit::orm::Transactor) -> anyhow::Result<()> {
/// let updated = transactor
///     .run(async |tx| {
///         let done = tx.execute_unprepared("UPDATE orders SET paid = true").await?;
///         Ok(done.rows_affected())
///     })
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Transactor {
    db: DatabaseConnection,
    hooks: CommitHooks,
}

impl Transactor {
    /// A transactor on the SeaORM connection `db`, with no after-commit hook.
    pub fn new(db: DatabaseConnection) -> Self {
        Self::with_hooks(db, CommitHooks::default())
    }

    /// A transactor on `db` that runs `hooks` after each commit (those of
    /// the `database::Transactor` it is the SeaORM form of).
    pub(crate) fn with_hooks(db: DatabaseConnection, hooks: CommitHooks) -> Self {
        Self { db, hooks }
    }

    /// Runs `hook` after every successful commit, such as a signal that
    /// wakes the outbox relay. The hook must be quick and must not fail.
    pub fn after_commit(mut self, hook: impl Fn() + Send + Sync + 'static) -> Self {
        self.hooks.after_commit(hook);
        self
    }

    /// Runs `work` in a new transaction. If `work` panics, the transaction
    /// is dropped unfinished, and SeaORM rolls it back before the connection
    /// is used again.
    pub async fn run<T, F>(&self, work: F) -> anyhow::Result<T>
    where
        F: AsyncFnOnce(&DatabaseTransaction) -> anyhow::Result<T>,
    {
        let tx = self.db.begin().await?;
        let (result, stored) = noting_events(work(&tx)).await;
        match result {
            Ok(value) => {
                tx.commit().await?;
                self.hooks.committed(stored);
                Ok(value)
            }
            Err(err) => {
                // A failed rollback leaves nothing committed either; the
                // caller's error is the one worth reporting.
                if let Err(rollback) = tx.rollback().await {
                    tracing::warn!(error = %rollback, "rollback failed");
                }
                Err(err)
            }
        }
    }

    /// The SeaORM connection, for work outside a transaction: each
    /// statement on it commits on its own.
    pub fn connection(&self) -> &DatabaseConnection {
        &self.db
    }
}

impl fmt::Debug for Transactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transactor").finish_non_exhaustive()
    }
}
