//! [`OrmListenerContext`]: a listener's context in a SeaORM service, whose
//! [`once`](OrmListenerContext::once) hands a SeaORM transaction.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sea_orm::{DatabaseConnection, DatabaseTransaction};
use sqlx::PgPool;
use uuid::Uuid;

use super::listener_context::ListenerContext;
use super::listener_error::ListenerError;
use crate::outbox::Metadata;

/// What a listener of a SeaORM service gets besides the event: the same as
/// a [`ListenerContext`], with [`Self::once`] in a SeaORM transaction on the
/// same pool. Take it in the handler's signature and `Listeners::listen`
/// hands it:
///
/// ```no_run
/// use kit::prelude::*;
/// use sea_orm::{ConnectionTrait, Statement};
/// # #[derive(Debug, serde::Serialize, serde::Deserialize)]
/// # pub struct OrderPlaced { pub order_id: uuid::Uuid }
/// # impl Event for OrderPlaced { const NAME: &'static str = "orderPlaced"; }
///
/// pub async fn handle(event: OrderPlaced, ctx: OrmListenerContext) -> Result<(), ListenerError> {
///     ctx.once(async |tx| {
///         let sql = "UPDATE orders SET confirmed = true WHERE id = $1";
///         let statement = Statement::from_sql_and_values(
///             tx.get_database_backend(),
///             sql,
///             [event.order_id.into()],
///         );
///         tx.execute(statement).await?;
///         Ok(())
///     })
///     .await?;
///     Ok(())
/// }
///
/// let mut listeners = Listeners::new();
/// listeners.listen("confirm", handle);
/// ```
#[derive(Debug, Clone)]
pub struct OrmListenerContext {
    inner: ListenerContext,
}

impl From<ListenerContext> for OrmListenerContext {
    fn from(inner: ListenerContext) -> Self {
        Self { inner }
    }
}

impl OrmListenerContext {
    /// The envelope id: the idempotency key for this event.
    pub fn event_id(&self) -> Uuid {
        self.inner.event_id()
    }

    /// When the event was dispatched.
    pub fn occurred_at(&self) -> DateTime<Utc> {
        self.inner.occurred_at()
    }

    /// The listener's name, its key in the inbox.
    pub fn listener(&self) -> &str {
        self.inner.listener()
    }

    /// The headers of the listener's task (asynq task headers).
    pub fn headers(&self) -> &BTreeMap<String, String> {
        self.inner.headers()
    }

    /// The event's metadata: the trace context of its dispatch.
    pub fn metadata(&self) -> &Metadata {
        self.inner.metadata()
    }

    /// The sqlx pool under SeaORM's connection.
    pub fn pool(&self) -> &PgPool {
        self.inner.pool()
    }

    /// SeaORM's connection on the pool, for work that need not happen once
    /// per event: each statement on it commits on its own.
    pub fn connection(&self) -> DatabaseConnection {
        crate::orm::connection(self.inner.pool())
    }

    /// Runs `work` in one SeaORM transaction, once per event for this
    /// listener: `Some` with its value when it ran and committed, `None`
    /// when an earlier delivery of the event already did. An error rolls
    /// everything back, and the retry runs `work` again. Events dispatched
    /// on `tx` (`kit::dispatch(tx, &event)`) commit with the work.
    pub async fn once<T, F>(&self, work: F) -> Result<Option<T>, ListenerError>
    where
        F: AsyncFnOnce(&DatabaseTransaction) -> Result<T, ListenerError>,
    {
        let done = super::inbox::once_orm(
            self.inner.transactor(),
            self.inner.listener(),
            self.inner.event_id(),
            self.inner.fence(),
            work,
        )
        .await?;
        if done.is_none() {
            self.inner.count_duplicate();
        }
        Ok(done)
    }
}
