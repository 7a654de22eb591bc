//! What an event can be stored on: a SeaORM transaction or connection, or a
//! sqlx connection or pool. Inside a transaction the row joins it; on a
//! connection or the pool it is a plain insert.
//!
//! SeaORM does not hand out the sqlx connection of its transactions, so on
//! SeaORM the row is inserted through `ConnectionTrait::execute` with a
//! `Statement`; on sqlx it is the [`Store`]'s insert.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, RuntimeErr,
    Statement,
};
use sqlx::{PgConnection, PgPool};

use super::later::INSERT_LATER;
use super::order::{INSERT_KEYED, ORDER_KEY, write_place};
use super::store::INSERT;
use super::unique::{self, UniqueRow};
use super::{Envelope, Store, Unique};

/// Something an event row can be inserted on: `&DatabaseTransaction` (in
/// `orm::Transactor::run`), `&DatabaseConnection`, `&mut PgConnection` (in
/// `database::Transactor::run` and a listener's `ctx.once`) or `&PgPool`.
pub trait Executor: Send {
    /// Inserts `envelope` as an unpublished row.
    fn insert_event(self, envelope: &Envelope) -> impl Future<Output = Result<(), DbErr>> + Send;

    /// Inserts `envelope` as [`Self::insert_event`] does, and writes into
    /// its metadata the sequence number its key took (`order_seq`), for an
    /// event with an order key (`Event::order_key`): the envelope the
    /// dispatcher returns.
    fn insert_numbered_event(
        self,
        envelope: &mut Envelope,
    ) -> impl Future<Output = Result<(), DbErr>> + Send
    where
        Self: Sized,
    {
        async move { self.insert_event(envelope).await }
    }

    /// Inserts `envelope` into `outbox_later`, due at `due_at`
    /// ([`crate::dispatch_at`]). The kit's executors do; on another, an
    /// error says it cannot.
    fn insert_later_event(
        self,
        envelope: &Envelope,
        due_at: DateTime<Utc>,
    ) -> impl Future<Output = Result<(), DbErr>> + Send
    where
        Self: Sized,
    {
        let _ = (envelope, due_at);
        async { Err(unsupported("dispatch_at")) }
    }

    /// Takes `key` for `window` and inserts `envelope` if it got it, in one
    /// statement ([`crate::dispatch_unique`]). The kit's executors do; on
    /// another, an error says it cannot.
    fn insert_unique_event(
        self,
        envelope: &mut Envelope,
        key: &str,
        window: Duration,
    ) -> impl Future<Output = Result<Unique, DbErr>> + Send
    where
        Self: Sized,
    {
        let _ = (envelope, key, window);
        async { Err(unsupported("dispatch_unique")) }
    }
}

/// The error of a dispatch that an executor other than the kit's cannot
/// store.
fn unsupported(what: &str) -> DbErr {
    DbErr::Custom(format!(
        "{what} needs one of the kit's executors (a SeaORM transaction or connection, or a sqlx \
         connection or pool)"
    ))
}

impl Executor for &DatabaseTransaction {
    async fn insert_event(self, envelope: &Envelope) -> Result<(), DbErr> {
        execute_insert(self, envelope).await.map(|_| ())
    }

    async fn insert_later_event(
        self,
        envelope: &Envelope,
        due_at: DateTime<Utc>,
    ) -> Result<(), DbErr> {
        execute_insert_later(self, envelope, due_at).await
    }

    async fn insert_unique_event(
        self,
        envelope: &mut Envelope,
        key: &str,
        window: Duration,
    ) -> Result<Unique, DbErr> {
        execute_insert_unique(self, envelope, key, window).await
    }

    async fn insert_numbered_event(self, envelope: &mut Envelope) -> Result<(), DbErr> {
        let place = execute_insert(self, envelope).await?;
        number(envelope, place);
        Ok(())
    }
}

impl Executor for &DatabaseConnection {
    async fn insert_event(self, envelope: &Envelope) -> Result<(), DbErr> {
        execute_insert(self, envelope).await.map(|_| ())
    }

    async fn insert_later_event(
        self,
        envelope: &Envelope,
        due_at: DateTime<Utc>,
    ) -> Result<(), DbErr> {
        execute_insert_later(self, envelope, due_at).await
    }

    async fn insert_unique_event(
        self,
        envelope: &mut Envelope,
        key: &str,
        window: Duration,
    ) -> Result<Unique, DbErr> {
        execute_insert_unique(self, envelope, key, window).await
    }

    async fn insert_numbered_event(self, envelope: &mut Envelope) -> Result<(), DbErr> {
        let place = execute_insert(self, envelope).await?;
        number(envelope, place);
        Ok(())
    }
}

impl Executor for &mut PgConnection {
    async fn insert_event(self, envelope: &Envelope) -> Result<(), DbErr> {
        self.insert_numbered_event(&mut envelope.clone()).await
    }

    async fn insert_later_event(
        self,
        envelope: &Envelope,
        due_at: DateTime<Utc>,
    ) -> Result<(), DbErr> {
        Store
            .insert_later(self, envelope, due_at)
            .await
            .map_err(sqlx_error)
    }

    async fn insert_unique_event(
        self,
        envelope: &mut Envelope,
        key: &str,
        window: Duration,
    ) -> Result<Unique, DbErr> {
        Store
            .insert_unique(self, envelope, key, window)
            .await
            .map_err(sqlx_error)
    }

    async fn insert_numbered_event(self, envelope: &mut Envelope) -> Result<(), DbErr> {
        Store.insert(self, envelope).await.map_err(sqlx_error)?;
        Ok(())
    }
}

impl Executor for &PgPool {
    async fn insert_event(self, envelope: &Envelope) -> Result<(), DbErr> {
        self.insert_numbered_event(&mut envelope.clone()).await
    }

    async fn insert_later_event(
        self,
        envelope: &Envelope,
        due_at: DateTime<Utc>,
    ) -> Result<(), DbErr> {
        Store
            .insert_later(self, envelope, due_at)
            .await
            .map_err(sqlx_error)
    }

    async fn insert_unique_event(
        self,
        envelope: &mut Envelope,
        key: &str,
        window: Duration,
    ) -> Result<Unique, DbErr> {
        Store
            .insert_unique(self, envelope, key, window)
            .await
            .map_err(sqlx_error)
    }

    async fn insert_numbered_event(self, envelope: &mut Envelope) -> Result<(), DbErr> {
        Store.insert(self, envelope).await.map_err(sqlx_error)?;
        Ok(())
    }
}

/// Writes `place`, the number its key took and the numbering's epoch, into
/// `envelope`'s metadata.
fn number(envelope: &mut Envelope, place: Option<(i64, i64)>) {
    if let Some((seq, epoch)) = place {
        write_place(&mut envelope.metadata, seq, epoch);
    }
}

/// The [`Store`]'s insert, as a SeaORM statement (a keyed event's takes its
/// sequence number as the store's does, `super::order`, and returns it with
/// its epoch).
async fn execute_insert(
    db: &impl ConnectionTrait,
    envelope: &Envelope,
) -> Result<Option<(i64, i64)>, DbErr> {
    let metadata =
        serde_json::to_value(&envelope.metadata).map_err(|err| DbErr::Json(err.to_string()))?;
    let mut values: Vec<sea_orm::Value> = vec![
        envelope.id.into(),
        envelope.name.clone().into(),
        envelope.payload.clone().into(),
        metadata.into(),
        envelope.occurred_at.into(),
    ];
    let statement = match envelope.metadata.get(ORDER_KEY) {
        Some(key) => {
            values.push(key.clone().into());
            INSERT_KEYED
        }
        None => INSERT,
    };
    let row = db
        .query_one(Statement::from_sql_and_values(
            DbBackend::Postgres,
            statement,
            values,
        ))
        .await?
        .ok_or_else(|| DbErr::RecordNotInserted)?;
    // The commit of the transaction this runs in wakes the relays.
    crate::commit_hooks::events_stored();
    let seq = row.try_get_by_index::<Option<i64>>(1)?;
    let epoch = row.try_get_by_index::<Option<i64>>(2)?;
    Ok(seq.zip(epoch))
}

/// The values every statement that stores an event binds first: event
/// id, name, payload, metadata, time.
fn event_values(envelope: &Envelope) -> Result<Vec<sea_orm::Value>, DbErr> {
    let metadata =
        serde_json::to_value(&envelope.metadata).map_err(|err| DbErr::Json(err.to_string()))?;
    Ok(vec![
        envelope.id.into(),
        envelope.name.clone().into(),
        envelope.payload.clone().into(),
        metadata.into(),
        envelope.occurred_at.into(),
    ])
}

/// The [`Store`]'s `insert_later`, as a SeaORM statement.
async fn execute_insert_later(
    db: &impl ConnectionTrait,
    envelope: &Envelope,
    due_at: DateTime<Utc>,
) -> Result<(), DbErr> {
    let mut values = event_values(envelope)?;
    values.push(due_at.into());
    db.execute(Statement::from_sql_and_values(
        DbBackend::Postgres,
        INSERT_LATER,
        values,
    ))
    .await?;
    Ok(())
}

/// The [`Store`]'s `insert_unique`, as a SeaORM statement.
async fn execute_insert_unique(
    db: &impl ConnectionTrait,
    envelope: &mut Envelope,
    key: &str,
    window: Duration,
) -> Result<Unique, DbErr> {
    let mut values = event_values(envelope)?;
    values.push(key.into());
    values.push(window.as_secs_f64().into());
    let statement = match envelope.metadata.get(ORDER_KEY) {
        Some(order_key) => {
            values.push(order_key.clone().into());
            unique::insert_unique_keyed()
        }
        None => unique::insert_unique(),
    };
    let row = db
        .query_one(Statement::from_sql_and_values(
            DbBackend::Postgres,
            statement,
            values,
        ))
        .await?
        .ok_or_else(|| DbErr::RecordNotFound("outbox_unique".into()))?;
    let row: UniqueRow = (
        row.try_get_by_index(0)?,
        row.try_get_by_index(1)?,
        row.try_get_by_index(2)?,
        row.try_get_by_index(3)?,
        row.try_get_by_index(4)?,
    );
    Ok(unique::outcome(envelope, row))
}

/// A sqlx error as SeaORM reports the errors of its own statements.
fn sqlx_error(err: sqlx::Error) -> DbErr {
    DbErr::Exec(RuntimeErr::SqlxError(err))
}
