//! The Postgres pool and the [`Transactor`], which runs a unit of work in one
//! transaction.

use std::fmt;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Connection as _, PgConnection, Postgres, Transaction};

use crate::commit_hooks::{CommitHooks, noting_events};
use crate::config::DatabaseConfig;

/// A lazily connecting pool: building it needs no live database, so the
/// server starts (and reports not ready) while Postgres is still coming up.
///
/// Waiting for a connection gives up after `DATABASE_CONNECT_TIMEOUT`, and
/// Postgres cancels a statement that runs longer than
/// `DATABASE_STATEMENT_TIMEOUT`, so an unreachable or hung database makes
/// calls fail instead of waiting forever.
///
/// A connection that sat idle for a second or longer is checked
/// (a `ping`) before it is handed out, and replaced if Postgres closed it;
/// one in steady use is not, since the check costs a round trip per
/// transaction (sqlx checks every acquire by default). A connection closed
/// within the last second fails the one transaction that takes it.
pub fn connect_lazy(config: &DatabaseConfig) -> PgPool {
    PgPoolOptions::new()
        .max_connections(config.max_connections)
        .acquire_timeout(config.connect_timeout)
        .test_before_acquire(false)
        .before_acquire(|connection, meta| {
            Box::pin(async move {
                Ok(meta.idle_for < CHECK_IDLE_AFTER || connection.ping().await.is_ok())
            })
        })
        .connect_lazy_with(connect_options(config))
}

/// How long a pooled connection may sit idle before it is checked again
/// when it is taken.
const CHECK_IDLE_AFTER: Duration = Duration::from_secs(1);

/// The connection options of `config`, with its statement timeout.
pub(crate) fn connect_options(config: &DatabaseConfig) -> PgConnectOptions {
    let millis = config.statement_timeout.as_millis().to_string();
    config
        .url
        .connect_options()
        .options([("statement_timeout", millis.as_str())])
}

/// Opens one connection and runs `SELECT 1`, within
/// `DATABASE_CONNECT_TIMEOUT`; the error says why Postgres cannot be used
/// (refused, unknown host, wrong password, no answer in time) and names
/// the server, without its password.
pub async fn check_reachable(config: &DatabaseConfig) -> Result<(), UnreachableError> {
    let attempt = async {
        let mut connection = PgConnection::connect_with(&connect_options(config)).await?;
        sqlx::query("SELECT 1").execute(&mut connection).await?;
        connection.close().await
    };
    let reason = match tokio::time::timeout(config.connect_timeout, attempt).await {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(err)) => err.to_string(),
        Err(_) => format!(
            "no answer within {} (DATABASE_CONNECT_TIMEOUT)",
            humantime::format_duration(config.connect_timeout)
        ),
    };
    Err(UnreachableError {
        url: config.url.redacted(),
        reason,
    })
}

/// Postgres cannot be used: where and why.
#[derive(Debug, thiserror::Error)]
#[error("cannot reach Postgres at {url}: {reason}")]
pub struct UnreachableError {
    url: String,
    reason: String,
}

/// Runs closures in a database transaction: commit when the closure returns
/// `Ok`, roll back when it returns `Err` or panics.
///
/// Everything the closure does through the transaction it is handed,
/// including [`crate::dispatch()`], commits or rolls back together. The
/// closure returns an [`anyhow::Result`], so `?` works on any error and no
/// type annotation is needed:
///
/// ```no_run
/// # async fn example(transactor: &kit::database::Transactor) -> anyhow::Result<()> {
/// let id: i32 = transactor
///     .run(async |tx| {
///         let (id,): (i32,) = sqlx::query_as("SELECT 1").fetch_one(&mut *tx).await?;
///         Ok(id)
///     })
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Transactor {
    pool: PgPool,
    hooks: CommitHooks,
}

impl Transactor {
    /// A transactor on `pool`, with no after-commit hook.
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            hooks: CommitHooks::default(),
        }
    }

    /// Runs `hook` after each successful commit of a transaction that
    /// stored events (through the outbox's dispatcher, see
    /// `commit_hooks::events_stored`): the relay's wake-up, which a
    /// transaction that stored none (a listener's `ctx.once` that
    /// dispatches nothing) need not send.
    #[cfg(feature = "worker")]
    pub(crate) fn after_events(mut self, hook: impl Fn() + Send + Sync + 'static) -> Self {
        self.hooks.after_events(hook);
        self
    }

    /// Runs `hook` after every successful commit, such as a signal that
    /// wakes the outbox relay. The hook must be quick and must not fail.
    pub fn after_commit(mut self, hook: impl Fn() + Send + Sync + 'static) -> Self {
        self.hooks.after_commit(hook);
        self
    }

    /// Runs `work` in a new transaction. If `work` panics, the transaction
    /// is dropped unfinished, and sqlx rolls it back before the connection
    /// is used again.
    pub async fn run<T, F>(&self, work: F) -> anyhow::Result<T>
    where
        F: AsyncFnOnce(&mut PgConnection) -> anyhow::Result<T>,
    {
        let mut tx: Transaction<'static, Postgres> = self.pool.begin().await?;
        let (result, stored) = noting_events(work(&mut *tx)).await;
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

    /// Runs the after-commit hooks, for a transaction that was begun on
    /// [`Self::pool`] and committed by the caller (the inbox's, which must
    /// roll back, not commit, when the event was already handled), and
    /// that `stored` events or not ([`noting_events`]).
    #[cfg(feature = "worker")]
    pub(crate) fn committed(&self, stored: bool) {
        self.hooks.committed(stored);
    }

    /// The pool the transactions are taken from.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The same pool and after-commit hooks, with the transactions in
    /// SeaORM: what the application code uses.
    #[cfg(feature = "seaorm")]
    pub fn orm(&self) -> crate::orm::Transactor {
        crate::orm::Transactor::with_hooks(crate::orm::connection(&self.pool), self.hooks.clone())
    }
}

impl fmt::Debug for Transactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transactor").finish_non_exhaustive()
    }
}
