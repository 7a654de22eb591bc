//! Listeners: the functions that react to events, and the fan-out that
//! gives each its own task.
//!
//! The relay queues one `event:<name>` task per event, whose task id is the
//! event id. Its handler (the fan-out) queues one `listener:<name>:<listener>`
//! task per listener registered for that event, with a task id derived from
//! the event task's id and the listener's name (`listener_task_id`), so a
//! retried fan-out never queues a second copy. Each listener task then
//! retries on its own; a listener that returns [`SkipRetry`] gives up at
//! once (its task is archived, where `outbox retry-archived` finds it).
//!
//! Delivery is at least once: a listener can see the same event again (after
//! a crash, a timeout, a retry or a replay). Database work done through
//! [`ListenerContext::once`] happens once per event all the same (the
//! inbox, `super::inbox`); anything else a listener does must be idempotent
//! on [`ListenerContext::event_id`].
//!
//! An event whose payload does not decode into the listener's type is
//! retried like any failure, not archived: the producer and this listener
//! disagree on the event's shape, which is a matter of versions (a rolling
//! deploy, a Go service ahead of this one), and a version of this service
//! deployed later may read it. Retries, with Go asynq's backoff, span about
//! three weeks; the error names the event and the listener, and asynqmon
//! shows the task under Retry. The listener's own code never sees it.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use serde::de::DeserializeOwned;

use super::failures::FailureHook;
pub use super::failures::ListenerFailure;
use super::limits::Limits;
pub use super::limits::{InvalidLimit, Rate};
pub use super::listener_context::ListenerContext;
pub use super::listener_error::{ListenerError, SkipRetry};
use super::listener_options::Partition;
pub use super::listener_options::{ListenerOptions, OnFailure};
use super::ordering::{Fence, Ordered};
#[cfg(feature = "seaorm")]
pub use super::orm_context::OrmListenerContext;
use super::retry_policy::RetryPolicy;
pub use super::retry_policy::{Backoff, Snooze};
use super::retry_settings::RetryOverrides;
use super::task_names::listener_task_type;
use crate::database::Transactor;
use crate::outbox::Envelope;
use crate::outbox::Event;

type BoxFuture = Pin<Box<dyn Future<Output = Result<(), ListenerError>> + Send>>;
type Run = Arc<dyn Fn(Envelope, ListenerContext) -> BoxFuture + Send + Sync>;

/// One registered listener.
#[derive(Clone)]
pub(crate) struct Listener {
    event: &'static str,
    name: String,
    run: Run,
    /// Ordered, and what a failure for good does to the key; `None`: not
    /// ordered.
    ordered: Option<OnFailure>,
    /// Its limits (`WORKER_LIMITS` applied), and the partition they apply to.
    limits: Limits,
    partition: Option<Partition>,
    /// Its retries, timeout, backoff and snoozes (`WORKER_RETRIES`
    /// applied).
    policy: RetryPolicy,
}

impl Listener {
    /// The wire name of the event it listens to.
    pub(crate) fn event(&self) -> &'static str {
        self.event
    }

    /// The listener's name, unique among the event's listeners.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Whether it is ordered, and what a failure for good does to its key.
    pub(crate) fn ordered(&self) -> Option<OnFailure> {
        self.ordered
    }

    /// Its limits across every worker.
    pub(crate) fn limits(&self) -> Limits {
        self.limits
    }

    /// Its retries, timeout, backoff and bound on snoozes.
    pub(crate) fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// The partition its limits apply to for the event in `payload` (a
    /// task's envelope); empty without one.
    pub(crate) fn partition_of(&self, payload: &[u8]) -> String {
        let Some(partition) = &self.partition else {
            return String::new();
        };
        serde_json::from_slice::<crate::outbox::Envelope>(payload)
            .map(|envelope| partition(&envelope.payload))
            .unwrap_or_default()
    }

    /// `listener:<event>:<listener>`.
    pub(crate) fn task_type(&self) -> String {
        listener_task_type(self.event, &self.name)
    }

    /// Decodes the event in `envelope` and runs the listener on it. An
    /// event that does not decode into the listener's type is an error
    /// (retried, see the module docs).
    /// Its [`ListenerContext::once`] runs in `transactor`'s transactions.
    /// (The kit's tests; the worker counts duplicates, `call_counted`.)
    #[cfg(test)]
    pub(crate) async fn call(
        &self,
        envelope: Envelope,
        headers: BTreeMap<String, String>,
        transactor: Transactor,
    ) -> Result<(), ListenerError> {
        self.call_counted(envelope, headers, transactor, Counter::default(), None)
            .await
    }

    /// Decodes the event in `envelope` and runs the listener on it (an event
    /// that does not decode is an error, retried), counting the deliveries
    /// its inbox skips in `duplicates`.
    pub(crate) async fn call_counted(
        &self,
        envelope: Envelope,
        headers: BTreeMap<String, String>,
        transactor: Transactor,
        duplicates: Counter,
        fence: Option<Fence>,
    ) -> Result<(), ListenerError> {
        let context = ListenerContext::new(
            &envelope, headers, &self.name, transactor, duplicates, fence,
        );
        (self.run)(envelope, context).await
    }
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("event", &self.event)
            .field("name", &self.name)
            .finish()
    }
}

/// The listeners of the service, by event.
#[derive(Clone, Default)]
pub struct Listeners {
    by_event: BTreeMap<&'static str, Vec<Listener>>,
    on_failure: Option<FailureHook>,
}

impl std::fmt::Debug for Listeners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listeners")
            .field("by_event", &self.by_event)
            .field("on_failure", &self.on_failure.is_some())
            .finish()
    }
}

impl Listeners {
    /// No listeners yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `handler` as the listener `name` of the event `E`.
    ///
    /// # Panics
    /// When `E` already has a listener called `name`: task ids are derived
    /// from the name, so two listeners must not share one.
    ///
    /// The handler takes the event and a context: a [`ListenerContext`], or
    /// with SeaORM an [`OrmListenerContext`], whose `once` hands a
    /// SeaORM transaction (any type made `From<ListenerContext>`).
    pub fn listen<E, C, F, Fut>(&mut self, name: &str, handler: F) -> &mut Self
    where
        E: Event + DeserializeOwned + 'static,
        C: From<ListenerContext> + Send + 'static,
        F: Fn(E, C) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), ListenerError>> + Send + 'static,
    {
        self.listen_with(name, ListenerOptions::new(), handler)
    }

    /// Registers `handler` as the listener `name` of the event `E`, run as
    /// `options` say: for example in the order of the events' keys.
    ///
    /// # Panics
    /// As [`Self::listen`].
    ///
    /// ```
    /// use kit::outbox::Event;
    /// use kit::worker::listeners::{ListenerContext, ListenerError, ListenerOptions, Listeners};
    ///
    /// #[derive(serde::Serialize, serde::Deserialize)]
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
    ///
    /// async fn stop_shipping(_: OrderCancelled, _: ListenerContext) -> Result<(), ListenerError> {
    ///     Ok(())
    /// }
    ///
    /// let mut listeners = Listeners::new();
    /// listeners.listen_with("shipping", ListenerOptions::new().ordered(), stop_shipping);
    /// ```
    pub fn listen_with<E, C, F, Fut>(
        &mut self,
        name: &str,
        options: ListenerOptions<E>,
        handler: F,
    ) -> &mut Self
    where
        E: Event + DeserializeOwned + 'static,
        C: From<ListenerContext> + Send + 'static,
        F: Fn(E, C) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), ListenerError>> + Send + 'static,
    {
        let listeners = self.by_event.entry(E::NAME).or_default();
        assert!(
            listeners.iter().all(|l| l.name != name),
            "event `{}` already has a listener called `{name}`",
            E::NAME
        );
        let handler = Arc::new(handler);
        let run: Run = Arc::new(move |envelope: Envelope, context: ListenerContext| {
            let handler = Arc::clone(&handler);
            Box::pin(async move {
                // Retried, not archived: a later version may read it (module docs).
                let event: E = serde_json::from_value(envelope.payload).map_err(|err| {
                    anyhow::anyhow!(
                        "the payload of `{}` {} does not decode into {}: {err}",
                        E::NAME,
                        envelope.id,
                        std::any::type_name::<E>()
                    )
                })?;
                handler(event, C::from(context)).await
            })
        });
        listeners.push(Listener {
            event: E::NAME,
            name: name.to_string(),
            run,
            ordered: options.ordered,
            limits: options.limits,
            partition: options.partition,
            policy: options.policy,
        });
        self
    }

    /// Calls `hook` with each listener task that failed for good (its
    /// retries spent, or a [`SkipRetry`]), once the worker has recorded it
    /// in `listener_failures` and before the queue archives it: to alert
    /// someone, or to copy it elsewhere (asynq #1078). The hook runs on the
    /// worker's task; keep it short, or spawn.
    ///
    /// ```
    /// use kit::worker::listeners::{ListenerFailure, Listeners};
    ///
    /// let mut listeners = Listeners::new();
    /// listeners.on_failure(|failure: ListenerFailure| async move {
    ///     tracing::error!(
    ///         listener = failure.listener,
    ///         event = ?failure.event_id,
    ///         error = failure.error,
    ///         "a listener gave up"
    ///     );
    /// });
    /// ```
    pub fn on_failure<F, Fut>(&mut self, hook: F) -> &mut Self
    where
        F: Fn(ListenerFailure) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let hook = Arc::new(hook);
        self.on_failure = Some(Arc::new(move |failure| {
            let hook = Arc::clone(&hook);
            Box::pin(async move { hook(failure).await })
        }));
        self
    }

    /// Sets the limits of the listeners `overrides` names (`WORKER_LIMITS`),
    /// replacing those their registration gave. An override of a listener
    /// the service does not have is an error that names it and lists them.
    pub(crate) fn override_limits(
        &mut self,
        overrides: &super::limits::LimitOverrides,
    ) -> anyhow::Result<()> {
        for ((event, name), limits) in overrides {
            let found = self
                .by_event
                .get_mut(event.as_str())
                .and_then(|listeners| listeners.iter_mut().find(|l| &l.name == name));
            let Some(listener) = found else {
                anyhow::bail!(
                    "WORKER_LIMITS names `{event}.{name}`, which is no listener of this service \
                     (its listeners: {})",
                    self.known()
                );
            };
            listener.limits = *limits;
        }
        Ok(())
    }

    /// Sets what `overrides` (`WORKER_RETRIES`) names of the policies of
    /// the listeners it names. An override of a listener the service does
    /// not have is an error that names it and lists them.
    pub(crate) fn override_policies(&mut self, overrides: &RetryOverrides) -> anyhow::Result<()> {
        for ((event, name), settings) in overrides {
            let found = self
                .by_event
                .get_mut(event.as_str())
                .and_then(|listeners| listeners.iter_mut().find(|l| &l.name == name));
            let Some(listener) = found else {
                anyhow::bail!(
                    "{} names `{event}.{name}`, which is no listener of this service \
                     (its listeners: {})",
                    super::retry_settings::RETRIES_VAR,
                    self.known()
                );
            };
            settings.apply_to(&mut listener.policy);
        }
        Ok(())
    }

    /// `event.listener` of every listener, or `none`.
    fn known(&self) -> String {
        let known: Vec<String> = self
            .all()
            .map(|l| format!("{}.{}", l.event, l.name))
            .collect();
        if known.is_empty() {
            "none".to_string()
        } else {
            known.join(", ")
        }
    }

    /// The policy of the listener `name` of the event `event`, if the
    /// service has it.
    pub(crate) fn policy_of(&self, event: &str, name: &str) -> Option<RetryPolicy> {
        self.of(event)
            .iter()
            .find(|l| l.name == name)
            .map(|l| l.policy)
    }

    /// Each listener's policy by its task type (`listener:<event>:<name>`).
    pub(crate) fn task_policies(&self) -> BTreeMap<String, RetryPolicy> {
        self.all()
            .map(|listener| (listener.task_type(), listener.policy))
            .collect()
    }

    /// The hook of [`Self::on_failure`], if any.
    pub(crate) fn failure_hook(&self) -> Option<FailureHook> {
        self.on_failure.clone()
    }

    /// The listeners of the event called `event`.
    pub(crate) fn of(&self, event: &str) -> &[Listener] {
        self.by_event
            .get(event)
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// Every listener.
    /// The ordered listeners, by name, and those that move on past a run
    /// that failed for good.
    pub(crate) fn ordered(&self) -> Ordered {
        let mut ordered = Ordered::default();
        for listener in self.all() {
            match listener.ordered() {
                Some(OnFailure::MoveOn) => {
                    ordered.names.insert(listener.name.clone());
                    ordered.moving_on.insert(listener.name.clone());
                }
                Some(OnFailure::HoldKey) => {
                    ordered.names.insert(listener.name.clone());
                }
                None => {}
            }
        }
        ordered
    }

    pub(crate) fn all(&self) -> impl Iterator<Item = &Listener> {
        self.by_event.values().flatten()
    }
}
