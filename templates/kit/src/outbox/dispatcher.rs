//! The outbox implementation of the project's `Dispatcher`: dispatching an
//! event inserts it into `outbox_events` on the executor it is given, with
//! the current W3C trace context in its metadata (with span export, the
//! context of the dispatch's `create` span, which covers the insert).
//! Beside [`dispatch`], the dispatches that take a time
//! ([`dispatch_at`], [`dispatch_in`]: into `outbox_later`, `super::later`)
//! or a key ([`dispatch_unique`]: `super::unique`).

use std::time::Duration;

use chrono::{DateTime, Utc};
#[cfg(not(feature = "seaorm"))]
use sqlx::PgExecutor;
use tracing::{Instrument as _, Span};

#[cfg(feature = "seaorm")]
use super::Executor;
use super::order::ORDER_KEY;
use super::{DispatchError, Dispatcher, Event, StoreError, Unique};
use super::{Envelope, Store};
use crate::{spans, trace_context};

/// Dispatches events by storing them in the outbox.
#[derive(Debug, Clone, Default)]
pub(crate) struct OutboxDispatcher {
    #[cfg_attr(feature = "seaorm", allow(dead_code))]
    store: Store,
}

impl OutboxDispatcher {
    /// A dispatcher that writes to `outbox_events`.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The envelope of `event`, with the trace context of the span of its
    /// dispatch (a child of the current one), and that span.
    fn envelope<E: Event>(event: &E) -> Result<(Envelope, Span), DispatchError> {
        let payload = serde_json::to_value(event).map_err(|source| DispatchError::Serialize {
            name: E::NAME,
            source,
        })?;
        let mut envelope = Envelope::new(E::NAME, payload);
        if let Some(key) = event.order_key() {
            envelope.metadata.insert(ORDER_KEY.into(), key);
        }
        let span = spans::create(E::NAME, &envelope.id);
        let parent = trace_context::current();
        // Without a current trace, only an exported span starts one.
        if parent.is_some() || !span.is_none() {
            trace_context::start(&span, parent.as_ref()).inject(&mut envelope.metadata);
        }
        Ok((envelope, span))
    }
}

#[cfg(feature = "seaorm")]
impl Dispatcher for OutboxDispatcher {
    async fn dispatch<E, X>(&self, executor: X, event: &E) -> Result<Envelope, DispatchError>
    where
        E: Event,
        X: Executor,
    {
        let (mut envelope, span) = Self::envelope(event)?;
        executor
            .insert_numbered_event(&mut envelope)
            .instrument(span)
            .await
            .map_err(|source| DispatchError::Store {
                name: E::NAME,
                source,
            })?;
        tracing::debug!(event = E::NAME, id = %envelope.id, "event stored in the outbox");
        Ok(envelope)
    }
}

#[cfg(not(feature = "seaorm"))]
impl Dispatcher for OutboxDispatcher {
    async fn dispatch<'e, E, X>(&self, executor: X, event: &E) -> Result<Envelope, DispatchError>
    where
        E: Event,
        X: PgExecutor<'e>,
    {
        let (mut envelope, span) = Self::envelope(event)?;
        self.store
            .insert(executor, &mut envelope)
            .instrument(span)
            .await
            .map_err(|source| DispatchError::Store {
                name: E::NAME,
                source,
            })?;
        tracing::debug!(event = E::NAME, id = %envelope.id, "event stored in the outbox");
        Ok(envelope)
    }
}

/// Stores `event` in the outbox on `executor`: the same call in a
/// handler's transaction, in `ctx.once` and on the pool, with no trait to
/// import. On a transaction, the event commits or rolls back with it.
///
/// See the [prelude](crate::prelude) for an example in a handler.
#[cfg(not(feature = "seaorm"))]
pub async fn dispatch<'e, E, X>(executor: X, event: &E) -> Result<Envelope, DispatchError>
where
    E: Event,
    X: PgExecutor<'e>,
{
    OutboxDispatcher::new().dispatch(executor, event).await
}

/// Stores `event` in the outbox on `executor` (a SeaORM transaction or
/// connection, or a sqlx connection or pool): the same call in a handler's
/// transaction, in `ctx.once` and on the pool, with no trait to import. On
/// a transaction, the event commits or rolls back with it. See the
/// [prelude](crate::prelude) for an example in a handler.
#[cfg(feature = "seaorm")]
pub async fn dispatch<E, X>(executor: X, event: &E) -> Result<Envelope, DispatchError>
where
    E: Event,
    X: Executor,
{
    OutboxDispatcher::new().dispatch(executor, event).await
}

/// The due time of a dispatch `after` from now; `None` when it is due at
/// once.
fn due_in(after: Duration) -> Option<DateTime<Utc>> {
    if after.is_zero() {
        return None;
    }
    let after = chrono::Duration::from_std(after).unwrap_or(chrono::Duration::MAX);
    Some(
        Utc::now()
            .checked_add_signed(after)
            .unwrap_or(DateTime::<Utc>::MAX_UTC),
    )
}

/// The error of a failed store of `E`.
fn store_error<E: Event>(source: impl Into<StoreError>) -> DispatchError {
    DispatchError::Store {
        name: E::NAME,
        source: source.into(),
    }
}

/// Stores `event` in the outbox on `executor`, to be delivered at `when`
/// and not before: while a worker runs, its listeners start within two
/// seconds after `when`, typically milliseconds (three seconds for an
/// event dispatched less than a second before it). A `when` at or before the service's clock
/// (`Utc::now()`) dispatches it at once, as [`dispatch`] does. On a
/// transaction, the event commits or rolls back with it.
///
/// A delayed event waits in `outbox_later` until it is due, then enters
/// the outbox and takes its place in its key's order
/// ([`Event::order_key`]) then: after every event of its key committed
/// before that. It is due once the database's clock reaches `when`. The returned
/// envelope is the event as dispatched; once due, its time (`occurred_at`)
/// is `when`. See `docs/outbox.md`, "Events delivered later".
///
/// ```no_run
/// use kit::prelude::*;
/// # #[derive(serde::Serialize)]
/// # struct CartExpired { cart_id: i64 }
/// # impl Event for CartExpired { const NAME: &'static str = "cartExpired"; }
///
/// # async fn example(transactor: &Transactor) -> anyhow::Result<()> {
/// let at_six = "2026-12-24T18:00:00Z".parse()?;
/// transactor
///     .run(async |tx| Ok(kit::dispatch_at(&mut *tx, &CartExpired { cart_id: 7 }, at_six).await?))
///     .await?;
/// # Ok(())
/// # }
/// ```
#[cfg(not(feature = "seaorm"))]
pub async fn dispatch_at<'e, E, X>(
    executor: X,
    event: &E,
    when: DateTime<Utc>,
) -> Result<Envelope, DispatchError>
where
    E: Event,
    X: PgExecutor<'e>,
{
    if when <= Utc::now() {
        return dispatch(executor, event).await;
    }
    let (envelope, span) = OutboxDispatcher::envelope(event)?;
    Store
        .insert_later(executor, &envelope, when)
        .instrument(span)
        .await
        .map_err(store_error::<E>)?;
    tracing::debug!(event = E::NAME, id = %envelope.id, due_at = %when, "event stored for later");
    Ok(envelope)
}

/// Stores `event` in the outbox on `executor`, to be delivered `after`
/// from now: [`dispatch_at`] of now plus `after` (a zero `after`
/// dispatches at once).
///
/// ```no_run
/// use std::time::Duration;
/// use kit::prelude::*;
/// # #[derive(serde::Serialize)]
/// # struct Reminder { user_id: i64 }
/// # impl Event for Reminder { const NAME: &'static str = "reminder"; }
///
/// # async fn example(transactor: &Transactor) -> anyhow::Result<()> {
/// let day = Duration::from_secs(24 * 3600);
/// transactor
///     .run(async |tx| Ok(kit::dispatch_in(&mut *tx, &Reminder { user_id: 7 }, day).await?))
///     .await?;
/// # Ok(())
/// # }
/// ```
#[cfg(not(feature = "seaorm"))]
pub async fn dispatch_in<'e, E, X>(
    executor: X,
    event: &E,
    after: Duration,
) -> Result<Envelope, DispatchError>
where
    E: Event,
    X: PgExecutor<'e>,
{
    match due_in(after) {
        Some(when) => dispatch_at(executor, event, when).await,
        None => dispatch(executor, event).await,
    }
}

/// Stores `event` in the outbox on `executor` unless an event dispatched
/// with the same `key` holds it: the first takes the key for `window`, and
/// until then every other dispatch of the key stores nothing and reports
/// [`Unique::Duplicate`] with the event that holds it. On a transaction,
/// the key is taken with it: a concurrent dispatch of the key waits for
/// it, and finds the key free again if it rolls back. The window counts
/// from the dispatch. See `docs/outbox.md`, "At most one per key in a
/// window".
///
/// ```no_run
/// use std::time::Duration;
/// use kit::prelude::*;
/// # #[derive(serde::Serialize)]
/// # struct SyncRequested { account_id: i64 }
/// # impl Event for SyncRequested { const NAME: &'static str = "syncRequested"; }
///
/// # async fn example(transactor: &Transactor) -> anyhow::Result<()> {
/// let hour = Duration::from_secs(3600);
/// let event = SyncRequested { account_id: 7 };
/// let outcome = transactor
///     .run(async |tx| Ok(kit::dispatch_unique(&mut *tx, &event, "sync:7", hour).await?))
///     .await?;
/// if let Unique::Duplicate { existing, until } = outcome {
///     tracing::info!(%existing, %until, "a sync is already on its way");
/// }
/// # Ok(())
/// # }
/// ```
#[cfg(not(feature = "seaorm"))]
pub async fn dispatch_unique<'e, E, X>(
    executor: X,
    event: &E,
    key: &str,
    window: Duration,
) -> Result<Unique, DispatchError>
where
    E: Event,
    X: PgExecutor<'e>,
{
    let (mut envelope, span) = OutboxDispatcher::envelope(event)?;
    let outcome = Store
        .insert_unique(executor, &mut envelope, key, window)
        .instrument(span)
        .await
        .map_err(store_error::<E>)?;
    tracing::debug!(event = E::NAME, id = %envelope.id, key, stored = outcome.is_stored(), "unique dispatch");
    Ok(outcome)
}

/// Stores `event` in the outbox on `executor` (a SeaORM transaction or
/// connection, or a sqlx connection or pool), to be delivered at `when`
/// and not before: while a worker runs, its listeners start within two
/// seconds after `when`, typically milliseconds (three seconds for an
/// event dispatched less than a second before it). A `when` at or before the service's clock
/// (`Utc::now()`) dispatches it at once, as [`dispatch`] does. On a
/// transaction, the event commits or rolls back with it.
///
/// A delayed event waits in `outbox_later` until it is due, then enters
/// the outbox and takes its place in its key's order
/// ([`Event::order_key`]) then: after every event of its key committed
/// before that. It is due once the database's clock reaches `when`. The returned
/// envelope is the event as dispatched; once due, its time (`occurred_at`)
/// is `when`. See `docs/outbox.md`, "Events delivered later".
///
/// ```no_run
/// use kit::prelude::*;
/// # #[derive(serde::Serialize)]
/// # struct CartExpired { cart_id: i64 }
/// # impl Event for CartExpired { const NAME: &'static str = "cartExpired"; }
///
/// # async fn example(transactor: &kit::orm::Transactor) -> anyhow::Result<()> {
/// let at_six = "2026-12-24T18:00:00Z".parse()?;
/// transactor
///     .run(async |tx| Ok(kit::dispatch_at(tx, &CartExpired { cart_id: 7 }, at_six).await?))
///     .await?;
/// # Ok(())
/// # }
/// ```
#[cfg(feature = "seaorm")]
pub async fn dispatch_at<E, X>(
    executor: X,
    event: &E,
    when: DateTime<Utc>,
) -> Result<Envelope, DispatchError>
where
    E: Event,
    X: Executor,
{
    if when <= Utc::now() {
        return dispatch(executor, event).await;
    }
    let (envelope, span) = OutboxDispatcher::envelope(event)?;
    executor
        .insert_later_event(&envelope, when)
        .instrument(span)
        .await
        .map_err(store_error::<E>)?;
    tracing::debug!(event = E::NAME, id = %envelope.id, due_at = %when, "event stored for later");
    Ok(envelope)
}

/// Stores `event` in the outbox on `executor`, to be delivered `after`
/// from now: [`dispatch_at`] of now plus `after` (a zero `after`
/// dispatches at once).
///
/// ```no_run
/// use std::time::Duration;
/// use kit::prelude::*;
/// # #[derive(serde::Serialize)]
/// # struct Reminder { user_id: i64 }
/// # impl Event for Reminder { const NAME: &'static str = "reminder"; }
///
/// # async fn example(transactor: &kit::orm::Transactor) -> anyhow::Result<()> {
/// let day = Duration::from_secs(24 * 3600);
/// transactor
///     .run(async |tx| Ok(kit::dispatch_in(tx, &Reminder { user_id: 7 }, day).await?))
///     .await?;
/// # Ok(())
/// # }
/// ```
#[cfg(feature = "seaorm")]
pub async fn dispatch_in<E, X>(
    executor: X,
    event: &E,
    after: Duration,
) -> Result<Envelope, DispatchError>
where
    E: Event,
    X: Executor,
{
    match due_in(after) {
        Some(when) => dispatch_at(executor, event, when).await,
        None => dispatch(executor, event).await,
    }
}

/// Stores `event` in the outbox on `executor` (a SeaORM transaction or
/// connection, or a sqlx connection or pool) unless an event dispatched
/// with the same `key` holds it: the first takes the key for `window`, and
/// until then every other dispatch of the key stores nothing and reports
/// [`Unique::Duplicate`] with the event that holds it. On a transaction,
/// the key is taken with it: a concurrent dispatch of the key waits for
/// it, and finds the key free again if it rolls back. The window counts
/// from the dispatch. See `docs/outbox.md`, "At most one per key in a
/// window".
///
/// ```no_run
/// use std::time::Duration;
/// use kit::prelude::*;
/// # #[derive(serde::Serialize)]
/// # struct SyncRequested { account_id: i64 }
/// # impl Event for SyncRequested { const NAME: &'static str = "syncRequested"; }
///
/// # async fn example(transactor: &kit::orm::Transactor) -> anyhow::Result<()> {
/// let hour = Duration::from_secs(3600);
/// let event = SyncRequested { account_id: 7 };
/// let outcome = transactor
///     .run(async |tx| Ok(kit::dispatch_unique(tx, &event, "sync:7", hour).await?))
///     .await?;
/// if let Unique::Duplicate { existing, until } = outcome {
///     tracing::info!(%existing, %until, "a sync is already on its way");
/// }
/// # Ok(())
/// # }
/// ```
#[cfg(feature = "seaorm")]
pub async fn dispatch_unique<E, X>(
    executor: X,
    event: &E,
    key: &str,
    window: Duration,
) -> Result<Unique, DispatchError>
where
    E: Event,
    X: Executor,
{
    let (mut envelope, span) = OutboxDispatcher::envelope(event)?;
    let outcome = executor
        .insert_unique_event(&mut envelope, key, window)
        .instrument(span)
        .await
        .map_err(store_error::<E>)?;
    tracing::debug!(event = E::NAME, id = %envelope.id, key, stored = outcome.is_stored(), "unique dispatch");
    Ok(outcome)
}
