//! The contract for publishing events: the [`Event`] and [`Dispatcher`]
//! traits, which [`super::OutboxDispatcher`] implements; tests may provide
//! their own dispatcher. The service names them `kit::outbox::Event` and
//! `kit::outbox::Dispatcher` (or through the prelude).

use std::future::Future;

use serde::Serialize;

#[cfg(feature = "seaorm")]
use super::Executor;
use super::envelope::Envelope;

/// A domain event that can be published.
pub trait Event: Serialize + Send + Sync {
    /// The wire name, in lowerCamelCase (`orderPlaced`), shared with Go services.
    const NAME: &'static str;

    /// The key whose events an ordered listener sees one at a time, in the
    /// order their transactions committed (`ListenerOptions::ordered` in
    /// `kit::worker::listeners`): an aggregate's id, such as the order's.
    /// Events of different types that return the same key share one order,
    /// so give each kind of aggregate its own form (`order:42`). `None`,
    /// the default: the event has no place in any order.
    ///
    /// Dispatching a keyed event takes the key's next sequence number in the
    /// dispatching transaction, under a lock on the key's row
    /// (`outbox_keys`): a second transaction that dispatches an event of the
    /// same key waits for the first to commit or roll back.
    ///
    /// ```
    /// use kit::outbox::Event;
    ///
    /// #[derive(serde::Serialize)]
    /// struct OrderCancelled {
    ///     order_id: i64,
    /// }
    ///
    /// impl Event for OrderCancelled {
    ///     const NAME: &'static str = "orderCancelled";
    ///
    ///     fn order_key(&self) -> Option<String> {
    ///         Some(format!("order:{}", self.order_id))
    ///     }
    /// }
    /// ```
    fn order_key(&self) -> Option<String> {
        None
    }
}

/// Why an event could not be dispatched.
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    /// The event could not be serialised to JSON.
    #[error("failed to serialise event `{name}`")]
    Serialize {
        /// The event's wire name.
        name: &'static str,
        /// serde's error.
        #[source]
        source: serde_json::Error,
    },
    /// The database refused the outbox row.
    #[error("failed to store event `{name}` in the outbox")]
    Store {
        /// The event's wire name.
        name: &'static str,
        /// The database's error.
        #[source]
        source: StoreError,
    },
}

/// The database error of a failed store: SeaORM's with the `seaorm` feature.
#[cfg(feature = "seaorm")]
pub type StoreError = sea_orm::DbErr;
/// The database error of a failed store: SeaORM's with the `seaorm` feature.
#[cfg(not(feature = "seaorm"))]
pub type StoreError = sqlx::Error;

/// Publishes events. The executor decides the atomicity: pass the
/// transaction of an `orm::Transactor::run` closure (`&DatabaseTransaction`)
/// or of a `database::Transactor::run` one (`&mut PgConnection`) and the
/// event commits or rolls back with the business writes; pass the SeaORM
/// connection or the pool and it is stored at once.
#[cfg(feature = "seaorm")]
pub trait Dispatcher: Send + Sync {
    /// Stores `event` in the outbox through `executor` and returns its envelope.
    fn dispatch<E, X>(
        &self,
        executor: X,
        event: &E,
    ) -> impl Future<Output = Result<Envelope, DispatchError>> + Send
    where
        E: Event,
        X: Executor;
}

/// Publishes events. The executor decides the atomicity: pass the
/// transaction of a `Transactor::run` closure and the event commits or rolls
/// back with the business writes; pass the pool and it is stored at once.
#[cfg(not(feature = "seaorm"))]
pub trait Dispatcher: Send + Sync {
    /// Stores `event` in the outbox through `executor` and returns its envelope.
    fn dispatch<'e, E, X>(
        &self,
        executor: X,
        event: &E,
    ) -> impl Future<Output = Result<Envelope, DispatchError>> + Send
    where
        E: Event,
        X: sqlx::PgExecutor<'e>;
}
