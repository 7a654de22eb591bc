//! What a listener gets besides the event ([`ListenerContext`]): the
//! event's id, time and metadata, the task's headers, the database, and
//! [`ListenerContext::once`], the work done once per event (the inbox,
//! `super::inbox`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use prometheus_client::metrics::counter::Counter;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::listener_error::ListenerError;
use super::ordering::Fence;
use crate::database::Transactor;
use crate::outbox::{Envelope, Metadata};

/// What a listener gets besides the event: its id and time, the task's
/// headers, the database, and [`Self::once`].
#[derive(Debug, Clone)]
pub struct ListenerContext {
    event_id: Uuid,
    occurred_at: DateTime<Utc>,
    metadata: Metadata,
    headers: BTreeMap<String, String>,
    pool: PgPool,
    listener: String,
    /// The worker's transactor on `pool`: its commits wake the relays.
    transactor: Transactor,
    /// Counts the deliveries [`Self::once`] skipped as duplicates.
    duplicates: Counter,
    /// The turn a run of an ordered listener's chain holds: its work
    /// commits only while it holds it.
    fence: Option<Fence>,
}

impl ListenerContext {
    /// The context of `listener`'s delivery of `envelope`: its
    /// [`Self::once`] runs in `transactor`'s transactions and counts the
    /// deliveries it skips in `duplicates`.
    pub(crate) fn new(
        envelope: &Envelope,
        headers: BTreeMap<String, String>,
        listener: &str,
        transactor: Transactor,
        duplicates: Counter,
        fence: Option<Fence>,
    ) -> Self {
        Self {
            event_id: envelope.id,
            occurred_at: envelope.occurred_at,
            metadata: envelope.metadata.clone(),
            headers,
            pool: transactor.pool().clone(),
            listener: listener.to_string(),
            transactor,
            duplicates,
            fence,
        }
    }

    /// The envelope id: the idempotency key for this event.
    pub fn event_id(&self) -> Uuid {
        self.event_id
    }

    /// When the event was dispatched.
    pub fn occurred_at(&self) -> DateTime<Utc> {
        self.occurred_at
    }

    /// The listener's name, its key in the inbox.
    pub fn listener(&self) -> &str {
        &self.listener
    }

    /// The headers of the listener's task (asynq task headers), which the
    /// fan-out copies from the event's task.
    pub fn headers(&self) -> &BTreeMap<String, String> {
        &self.headers
    }

    /// The event's metadata: the trace context (`traceparent`,
    /// `tracestate`) of its dispatch.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The database, for work that need not happen once per event.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Runs `work` in one transaction, once per event for this listener:
    /// `Some` with its value when it ran and committed, `None` when an
    /// earlier delivery of the event already did (see `super::inbox`). An
    /// error rolls everything back, and the retry runs `work` again.
    ///
    /// Put the listener's database writes in `work`, and the events it
    /// dispatches in turn (pass `tx` to the dispatcher). Work outside the
    /// database (an e-mail, an HTTP call) does not belong here: make it
    /// idempotent on [`Self::event_id`] by itself.
    pub async fn once<T, F>(&self, work: F) -> Result<Option<T>, ListenerError>
    where
        F: AsyncFnOnce(&mut PgConnection) -> Result<T, ListenerError>,
    {
        let done = super::inbox::once(
            &self.transactor,
            &self.listener,
            self.event_id,
            self.fence.as_ref(),
            work,
        )
        .await?;
        if done.is_none() {
            self.count_duplicate();
        }
        Ok(done)
    }

    /// Counts one delivery skipped by the inbox.
    pub(crate) fn count_duplicate(&self) {
        self.duplicates.inc();
    }

    /// The worker's transactor, whose commits wake the relays.
    #[cfg(feature = "seaorm")]
    pub(crate) fn transactor(&self) -> &Transactor {
        &self.transactor
    }

    /// The turn the run holds, for a run of an ordered listener's chain.
    #[cfg(feature = "seaorm")]
    pub(crate) fn fence(&self) -> Option<&Fence> {
        self.fence.as_ref()
    }
}
