//! The listeners' inbox (`inbox_processed`): what makes a listener's
//! database work happen once per event, however often the event is
//! delivered.
//!
//! [`once`] runs the work in a transaction that first inserts the pair
//! (listener, event id). The pair's primary key decides, not a check before
//! the insert: a second delivery, even one running at the same moment on
//! another worker, waits for the first transaction and then finds the pair
//! taken, so its work is skipped. Work that fails rolls the pair back with
//! everything else, and the retry runs it again. Events dispatched through
//! the same transaction commit with the work, so a chain of listeners stays
//! exactly once in effect.
//!
//! Records older than `INBOX_RETENTION` are deleted by `run_cleanup`: a
//! duplicate arriving later than that would run again, so the retention
//! must outlast every redelivery (the queue's retries and deduplication
//! window, and any replay).

use std::time::Duration;

use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::listener_error::ListenerError;
use super::ordering::Fence;
use crate::database::Transactor;
use crate::outbox::cleanup;
/// Rows deleted per cleanup statement, as for the outbox.
pub(crate) use crate::outbox::cleanup::CLEANUP_BATCH;

/// Records (listener, event id), or does nothing when a delivery before did.
const RECORD: &str = "INSERT INTO inbox_processed (listener, event_id) VALUES ($1, $2) \
                      ON CONFLICT (listener, event_id) DO NOTHING";

/// SQLSTATE `undefined_table`.
const UNDEFINED_TABLE: &str = "42P01";

/// Runs `work` in a new transaction of `transactor` unless `listener`
/// already committed work for `event_id`: `Some` with the work's value when
/// it ran and committed, `None` when it was skipped. An error from `work`
/// rolls the transaction back, recording nothing. A commit runs the
/// transactor's after-commit hook, as `Transactor::run` does, so events the
/// work dispatched wake the relays at once. With a `fence` (a run of an
/// ordered listener's chain), the work commits only while the run holds
/// its turn; else it rolls back with `Superseded`.
pub(crate) async fn once<T, F>(
    transactor: &Transactor,
    listener: &str,
    event_id: Uuid,
    fence: Option<&Fence>,
    work: F,
) -> Result<Option<T>, ListenerError>
where
    F: AsyncFnOnce(&mut PgConnection) -> Result<T, ListenerError>,
{
    let mut tx = transactor.pool().begin().await?;
    let recorded = sqlx::query(RECORD)
        .bind(listener)
        .bind(event_id)
        .execute(&mut *tx)
        .await
        .map_err(explain)?
        .rows_affected()
        == 1;
    if !recorded {
        tx.rollback().await?;
        return Ok(None);
    }
    // On an error `tx` is dropped unfinished, which rolls it back.
    let (value, stored) = crate::commit_hooks::noting_events(work(&mut tx)).await;
    let value = value?;
    if let Some(fence) = fence {
        fence.check().await?;
    }
    tx.commit().await?;
    transactor.committed(stored);
    Ok(Some(value))
}

/// [`once`] in a SeaORM transaction on the transactor's pool: the same
/// inbox record, the same commit and after-commit hook.
#[cfg(feature = "seaorm")]
pub(crate) async fn once_orm<T, F>(
    transactor: &Transactor,
    listener: &str,
    event_id: Uuid,
    fence: Option<&Fence>,
    work: F,
) -> Result<Option<T>, ListenerError>
where
    F: AsyncFnOnce(&sea_orm::DatabaseTransaction) -> Result<T, ListenerError>,
{
    use sea_orm::{ConnectionTrait, DbBackend, Statement, TransactionTrait};

    let tx = crate::orm::connection(transactor.pool()).begin().await?;
    let record = Statement::from_sql_and_values(
        DbBackend::Postgres,
        RECORD,
        [listener.into(), event_id.into()],
    );
    let recorded = match tx.execute(record).await {
        Ok(done) => done.rows_affected() == 1,
        // SeaORM carries sqlx's error: explained by its SQLSTATE, as above.
        Err(sea_orm::DbErr::Exec(sea_orm::RuntimeErr::SqlxError(err))) => {
            return Err(explain(err));
        }
        Err(err) => return Err(err.into()),
    };
    if !recorded {
        tx.rollback().await?;
        return Ok(None);
    }
    // On an error `tx` is dropped unfinished, which rolls it back.
    let (value, stored) = crate::commit_hooks::noting_events(work(&tx)).await;
    let value = value?;
    if let Some(fence) = fence {
        fence.check().await?;
    }
    tx.commit().await?;
    transactor.committed(stored);
    Ok(Some(value))
}

/// A missing inbox table is a migration not applied; say so.
fn explain(err: sqlx::Error) -> ListenerError {
    let missing = err
        .as_database_error()
        .and_then(|db| db.code())
        .is_some_and(|code| code == UNDEFINED_TABLE);
    if missing {
        anyhow::anyhow!(
            "the inbox table `inbox_processed` does not exist: apply the migrations \
             (cargo run --bin migrate -- up)"
        )
    } else {
        err.into()
    }
}

/// Deletes every record older than `retention`, batch by batch, and
/// returns how many it deleted.
pub(crate) async fn delete_expired(pool: &PgPool, retention: Duration) -> Result<u64, sqlx::Error> {
    cleanup::in_batches(|| async {
        let deleted = sqlx::query(
            "DELETE FROM inbox_processed WHERE (listener, event_id) IN ( \
               SELECT listener, event_id FROM inbox_processed \
               WHERE processed_at < now() - make_interval(secs => $1) \
               LIMIT $2 FOR UPDATE SKIP LOCKED)",
        )
        .bind(retention.as_secs_f64())
        .bind(i64::from(CLEANUP_BATCH))
        .execute(pool)
        .await?;
        Ok(deleted.rows_affected())
    })
    .await
}

/// Runs [`delete_expired`] at start and then every `interval`, until
/// `shutdown` is cancelled.
pub(crate) async fn run_cleanup(
    pool: PgPool,
    retention: Duration,
    interval: Duration,
    shutdown: CancellationToken,
) {
    cleanup::every("expired inbox records", interval, shutdown, || {
        delete_expired(&pool, retention)
    })
    .await;
}
