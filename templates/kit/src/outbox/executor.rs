//! What an event can be stored on: a SeaORM transaction or connection, or a
//! sqlx connection or pool. Inside a transaction the row joins it; on a
//! connection or the pool it is a plain insert.
//!
//! SeaORM does not hand out the sqlx connection of its transactions, so on
//! SeaORM the row is inserted through `ConnectionTrait::execute` with a
//! `Statement`; on sqlx it is the [`Store`]'s insert.

use std::future::Future;

use sea_orm::{
    ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, RuntimeErr,
    Statement,
};
use sqlx::{PgConnection, PgPool};

use super::order::{INSERT_KEYED, ORDER_KEY};
use super::{Envelope, Store};

/// Something an event row can be inserted on: `&DatabaseTransaction` (in
/// `orm::Transactor::run`), `&DatabaseConnection`, `&mut PgConnection` (in
/// `database::Transactor::run` and a listener's `ctx.once`) or `&PgPool`.
pub trait Executor: Send {
    /// Inserts `envelope` as an unpublished row.
    fn insert_event(self, envelope: &Envelope) -> impl Future<Output = Result<(), DbErr>> + Send;
}

impl Executor for &DatabaseTransaction {
    async fn insert_event(self, envelope: &Envelope) -> Result<(), DbErr> {
        execute_insert(self, envelope).await
    }
}

impl Executor for &DatabaseConnection {
    async fn insert_event(self, envelope: &Envelope) -> Result<(), DbErr> {
        execute_insert(self, envelope).await
    }
}

impl Executor for &mut PgConnection {
    async fn insert_event(self, envelope: &Envelope) -> Result<(), DbErr> {
        Store
            .insert(self, &mut envelope.clone())
            .await
            .map_err(sqlx_error)?;
        Ok(())
    }
}

impl Executor for &PgPool {
    async fn insert_event(self, envelope: &Envelope) -> Result<(), DbErr> {
        Store
            .insert(self, &mut envelope.clone())
            .await
            .map_err(sqlx_error)?;
        Ok(())
    }
}

/// The [`Store`]'s insert, as a SeaORM statement (a keyed event's takes its
/// sequence number as the store's does, `super::order`).
async fn execute_insert(db: &impl ConnectionTrait, envelope: &Envelope) -> Result<(), DbErr> {
    let metadata =
        serde_json::to_value(&envelope.metadata).map_err(|err| DbErr::Json(err.to_string()))?;
    let mut values: Vec<sea_orm::Value> = vec![
        envelope.id.into(),
        envelope.name.clone().into(),
        envelope.payload.clone().into(),
        metadata.into(),
        envelope.occurred_at.into(),
    ];
    let sql = match envelope.metadata.get(ORDER_KEY) {
        Some(key) => {
            values.push(key.clone().into());
            INSERT_KEYED
        }
        None => {
            "INSERT INTO outbox_events (event_id, event_name, payload, metadata, created_at) \
             VALUES ($1, $2, $3, $4, $5)"
        }
    };
    db.execute(Statement::from_sql_and_values(
        DbBackend::Postgres,
        sql,
        values,
    ))
    .await?;
    Ok(())
}

/// A sqlx error as SeaORM reports the errors of its own statements.
fn sqlx_error(err: sqlx::Error) -> DbErr {
    DbErr::Exec(RuntimeErr::SqlxError(err))
}
