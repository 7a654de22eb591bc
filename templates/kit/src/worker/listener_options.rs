//! How a listener runs besides what its handler does: in the order of its
//! events' keys or not, what a run that keeps failing does to that order,
//! the limits on how many of its runs go at once and how fast they start,
//! across every worker (`super::limits`), and its retries, timeout, backoff
//! and bound on snoozes (`super::retry_policy`). Given to
//! [`Listeners::listen_with`](super::listeners::Listeners::listen_with).

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use super::limits::{Limits, Rate};
use super::retry_policy::{Backoff, RetryPolicy};

/// The partition of a run's limits, from its event's payload.
pub(crate) type Partition = Arc<dyn Fn(&serde_json::Value) -> String + Send + Sync>;

/// What a run of an ordered listener that failed for good (its retries
/// spent, or a [`SkipRetry`](super::listeners::SkipRetry)) does to its key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnFailure {
    /// The key waits: the run is archived (and recorded in
    /// `listener_failures`), and the later events of its key wait until
    /// `outbox retry-archived` runs it again and it succeeds, or `outbox
    /// skip` moves past it. `outbox status` counts it as a blocked key.
    #[default]
    HoldKey,
    /// The run is archived and recorded as any failure, and the key moves
    /// on to its next event.
    MoveOn,
}

/// How a listener runs; [`ListenerOptions::new`] is how
/// [`Listeners::listen`](super::listeners::Listeners::listen) runs one.
///
/// ```
/// use std::time::Duration;
/// use kit::worker::listeners::{Backoff, ListenerOptions, OnFailure, Rate};
///
/// # #[derive(serde::Serialize)]
/// # struct OrderCancelled;
/// # impl kit::outbox::Event for OrderCancelled { const NAME: &'static str = "orderCancelled"; }
/// // One event of an order at a time, in commit order; a run that keeps
/// // failing holds the order's later events.
/// let shipping = ListenerOptions::<OrderCancelled>::new().ordered();
/// // The same, but moving on past a run that failed for good.
/// let projection = ListenerOptions::<OrderCancelled>::new()
///     .ordered()
///     .on_failure(OnFailure::MoveOn);
/// // At most 5 at once and 10 a second, across every worker.
/// let email = ListenerOptions::<OrderCancelled>::new()
///     .concurrency(5)
///     .rate(Rate::per_second(10));
/// // Given up after 3 runs in about a minute, each stopped after 10 s.
/// let payment = ListenerOptions::<OrderCancelled>::new()
///     .retries(2)
///     .timeout(Duration::from_secs(10))
///     .backoff(Backoff::exponential(Duration::from_secs(10), Duration::from_secs(40)));
/// // May take 10 minutes; put off at most 20 times by `Snooze`.
/// let thumbnail = ListenerOptions::<OrderCancelled>::new()
///     .timeout(Duration::from_secs(600))
///     .max_snoozes(20);
/// # let _ = (shipping, projection, email, payment, thumbnail);
/// ```
pub struct ListenerOptions<E> {
    pub(crate) ordered: Option<OnFailure>,
    pub(crate) limits: Limits,
    pub(crate) partition: Option<Partition>,
    pub(crate) policy: RetryPolicy,
    _event: PhantomData<fn(&E)>,
}

impl<E> ListenerOptions<E> {
    /// A listener that runs each event as it comes, in parallel with the
    /// others.
    pub fn new() -> Self {
        Self {
            ordered: None,
            limits: Limits::default(),
            partition: None,
            policy: RetryPolicy::default(),
            _event: PhantomData,
        }
    }

    /// Runs the events that share a key (`Event::order_key`) one at a time,
    /// in the order their transactions committed, across every worker; a
    /// later event of a key waits while an earlier one is retried. The
    /// listeners of this name of other events that are ordered too share
    /// the order (`orderPlaced` and `orderCancelled` keyed by the order).
    /// Events without a key run as they come. See `kit::worker` for what it
    /// costs and what `outbox replay` does.
    pub fn ordered(mut self) -> Self {
        self.ordered = Some(self.ordered.unwrap_or_default());
        self
    }

    /// What a run that failed for good does to its key (an ordered
    /// listener's; [`OnFailure::HoldKey`] unless said).
    pub fn on_failure(mut self, on_failure: OnFailure) -> Self {
        self.ordered = Some(on_failure);
        self
    }

    /// At most `runs` at once, across every worker (per partition, with
    /// [`Self::partition_by`]). A run that finds no slot free waits in the
    /// queue's `scheduled` set, holding no worker slot, until a run ends and
    /// hands it its slot. `WORKER_LIMITS` overrides it at deploy time.
    pub fn concurrency(mut self, runs: u32) -> Self {
        self.limits.concurrency = Some(runs);
        self
    }

    /// At most `rate` runs started per period, across every worker (per
    /// partition, with [`Self::partition_by`]), a burst as the rate says.
    /// A run whose turn has not come waits in the queue's `scheduled` set
    /// until it does, holding no worker slot. `WORKER_LIMITS` overrides it.
    pub fn rate(mut self, rate: Rate) -> Self {
        self.limits.rate = Some(rate);
        self
    }

    /// Applies the limits to each value of `partition` apart (a tenant, a
    /// partner): at most N runs at once, or R per period, for each.
    pub fn partition_by<F>(mut self, partition: F) -> Self
    where
        E: serde::de::DeserializeOwned,
        F: Fn(&E) -> String + Send + Sync + 'static,
    {
        self.partition = Some(Arc::new(move |payload: &serde_json::Value| {
            // An event that does not decode runs in no partition; its
            // listener fails on it anyway (and is retried).
            E::deserialize(payload).map_or_else(|_| String::new(), |event| partition(&event))
        }));
        self
    }
}

/// Retries, timeout, backoff and snoozes (`WORKER_RETRIES` overrides the
/// first three at deploy time).
impl<E> ListenerOptions<E> {
    /// Retries after the first failed run (25 unless said): a listener
    /// with `.retries(2)` runs at most 3 times, then its task is archived
    /// (and recorded in `listener_failures`).
    pub fn retries(mut self, retries: u32) -> Self {
        self.policy.retries = retries;
        self
    }

    /// The longest one run may take (30 minutes unless said), in whole
    /// seconds (rounded up). A run past it is stopped: its `ctx.once`
    /// transaction rolls back, and the run counts as failed (retried or
    /// archived as its retries say).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.policy.timeout = timeout;
        self
    }

    /// The wait before each retry ([`Backoff::asynq`], Go asynq's, unless
    /// said).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.policy.backoff = backoff;
        self
    }

    /// How many times a task of the listener may put itself off with a
    /// [`Snooze`](super::listeners::Snooze) (100 unless said); a snooze
    /// past it counts as a failure.
    pub fn max_snoozes(mut self, snoozes: u32) -> Self {
        self.policy.max_snoozes = snoozes;
        self
    }
}

impl<E> Default for ListenerOptions<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E> std::fmt::Debug for ListenerOptions<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenerOptions")
            .field("ordered", &self.ordered)
            .field("limits", &self.limits)
            .field("partition", &self.partition.is_some())
            .field("policy", &self.policy)
            .finish()
    }
}
