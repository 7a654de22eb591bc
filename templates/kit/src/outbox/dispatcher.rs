//! The outbox implementation of the project's `Dispatcher`: dispatching an
//! event inserts it into `outbox_events` on the executor it is given, with
//! the current W3C trace context in its metadata (with span export, the
//! context of the dispatch's `create` span, which covers the insert).

#[cfg(not(feature = "seaorm"))]
use sqlx::PgExecutor;
use tracing::{Instrument as _, Span};

#[cfg(feature = "seaorm")]
use super::Executor;
use super::order::ORDER_KEY;
use super::{DispatchError, Dispatcher, Event};
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
