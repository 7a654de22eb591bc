//! The [`Limiter`] a listener's handler asks before each run: it takes a
//! concurrency slot (held by a [`Permit`] and its renewed lease) and a rate
//! turn, or says how long the run must wait, through the scripts of
//! [`super::scripts`].

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use tokio::task::JoinHandle;

use super::metrics::{LimitKind, LimitLabels, LimitMetrics};
use super::scripts::{FREE_SLOT, RENEW_SLOT, TAKE_SLOT, TAKE_TURN};
use super::settings::{Limits, Rate};
use crate::queue::{Client, QueueError, Task};
use crate::worker::task_names::listener_task_type;

/// How long a concurrency slot stays taken without a renewal: a killed
/// worker's slots free themselves within it. Renewed every third of it.
pub(super) const SLOT_LEASE: Duration = Duration::from_secs(30);
/// How long an idle limit's keys (and a waiter who never came back) live.
const IDLE_TTL: Duration = Duration::from_secs(24 * 3600);
/// How many times a release passes a slot on to the next waiter when the
/// one it was handed to no longer waits.
const MAX_HAND_OVERS: usize = 8;

/// What [`Limiter::acquire`] answers.
#[derive(Debug)]
pub(crate) enum Acquired {
    /// The run may start; release the permit when it ends.
    Granted(Permit),
    /// The run may not start yet: defer the task to `until`
    /// (`HandlerError::defer`); it may be woken earlier.
    Wait {
        /// When to run again at the latest.
        until: DateTime<Utc>,
        /// The limit that was reached.
        limit: LimitKind,
    },
}

/// Asks a listener's limits whether a run may start, in Valkey, across
/// every worker. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Limiter {
    inner: Arc<Inner>,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("task_type", &self.inner.task_type)
            .field("limits", &self.inner.limits)
            .field("slot_lease", &self.inner.slot_lease)
            .finish()
    }
}

#[derive(Clone)]
struct Inner {
    client: Client,
    /// `listener:<event>:<name>`, the hash tag of the limit's keys.
    task_type: String,
    event: String,
    listener: String,
    limits: Limits,
    slot_lease: Duration,
    metrics: Option<LimitMetrics>,
}

impl Limiter {
    /// The limiter of the listener `listener` of `event` (task type
    /// `listener:<event>:<listener>`), with `limits`, through `client`.
    pub(crate) fn new(client: Client, event: &str, listener: &str, limits: Limits) -> Self {
        Self {
            inner: Arc::new(Inner {
                client,
                task_type: listener_task_type(event, listener),
                event: event.to_string(),
                listener: listener.to_string(),
                limits,
                slot_lease: SLOT_LEASE,
                metrics: None,
            }),
        }
    }

    /// Counts deferrals and waits in `metrics`.
    pub(crate) fn with_metrics(mut self, metrics: LimitMetrics) -> Self {
        Arc::make_mut(&mut self.inner).metrics = Some(metrics);
        self
    }

    /// Leases concurrency slots for `lease` instead of [`SLOT_LEASE`]
    /// (at least 1 s).
    #[cfg(test)]
    pub(crate) fn with_slot_lease(mut self, lease: Duration) -> Self {
        Arc::make_mut(&mut self.inner).slot_lease = lease.max(Duration::from_secs(1));
        self
    }

    /// Whether the run of `task` may start now, under the limits of
    /// `partition` (`""` for the listener as a whole): a concurrency slot
    /// first, then the rate (a slot taken is freed again, to the next
    /// waiter, when the rate says wait). Without limits, granted with no
    /// Valkey call.
    pub(crate) async fn acquire(
        &self,
        partition: &str,
        task: &Task,
    ) -> Result<Acquired, QueueError> {
        let limits = self.inner.limits;
        if limits.is_none() {
            return Ok(Acquired::Granted(Permit { slot: None }));
        }
        let member = member(&task.queue, &task.id);
        let slot = match limits.concurrency {
            None => None,
            Some(limit) => match self.take_slot(partition, &member, limit).await? {
                Some(slot) => Some(slot),
                None => {
                    let lease =
                        TimeDelta::from_std(self.inner.slot_lease).unwrap_or(TimeDelta::MAX);
                    return Ok(self.wait(LimitKind::Concurrency, Utc::now() + lease));
                }
            },
        };
        if let Some(rate) = limits.rate
            && let Some(wait) = self.take_turn(partition, &member, rate).await?
        {
            if let Some(slot) = slot {
                slot.release().await;
            }
            // Back a little early: it sleeps the rest in the handler.
            let wait = TimeDelta::from_std(wait.saturating_sub(rate.wake_lead()))
                .unwrap_or(TimeDelta::MAX);
            return Ok(self.wait(LimitKind::Rate, Utc::now() + wait));
        }
        Ok(Acquired::Granted(Permit { slot }))
    }

    /// Frees the concurrency slot of `partition` that the task `id` of
    /// `queue` holds, and hands it to the oldest waiter: a waiter handed a
    /// slot whose task is deleted before it runs (`outbox cancel`) would
    /// otherwise hold it until its lease runs out. Nothing without a
    /// concurrency limit, or when the task holds no slot.
    pub(crate) async fn free_deleted(
        &self,
        partition: &str,
        queue: &str,
        id: &str,
    ) -> Result<(), QueueError> {
        let Some(limit) = self.inner.limits.concurrency else {
            return Ok(());
        };
        let slots = SlotKeys {
            limiter: self.clone(),
            holders: self.key("slots", partition),
            waiters: self.key("slot_waiters", partition),
            limit,
        };
        let handed = slots.free(&member(queue, id)).await?;
        slots.hand_over(handed).await;
        Ok(())
    }

    /// [`Acquired::Wait`], counted.
    fn wait(&self, limit: LimitKind, until: DateTime<Utc>) -> Acquired {
        if let Some(metrics) = &self.inner.metrics {
            metrics.deferred.get_or_create(&self.labels(limit)).inc();
        }
        Acquired::Wait { until, limit }
    }

    /// Records that a run waited `micros` µs for `limit` (nothing for 0:
    /// it did not wait).
    fn waited(&self, limit: LimitKind, micros: i64) {
        if micros <= 0 {
            return;
        }
        if let Some(metrics) = &self.inner.metrics {
            metrics
                .waited
                .get_or_create(&self.labels(limit))
                .observe(micros as f64 / 1e6);
        }
    }

    fn labels(&self, limit: LimitKind) -> LimitLabels {
        LimitLabels {
            event: self.inner.event.clone(),
            listener: self.inner.listener.clone(),
            limit: limit.as_str().to_string(),
        }
    }

    /// `limits:{<task type>}:<kind>:<partition>`.
    fn key(&self, kind: &str, partition: &str) -> String {
        format!("limits:{{{}}}:{kind}:{partition}", self.inner.task_type)
    }

    /// Takes a concurrency slot of `partition` for `member`, or registers
    /// it as a waiter (`None`). Slots left free (their holders' leases ran
    /// out) go to the oldest waiters.
    async fn take_slot(
        &self,
        partition: &str,
        member: &str,
        limit: u32,
    ) -> Result<Option<Slot>, QueueError> {
        let slots = Arc::new(SlotKeys {
            limiter: self.clone(),
            holders: self.key("slots", partition),
            waiters: self.key("slot_waiters", partition),
            limit,
        });
        let (granted, waited, handed): (i64, i64, Vec<String>) = TAKE_SLOT
            .key(&slots.holders)
            .key(&slots.waiters)
            .arg(member)
            .arg(limit)
            .arg(micros(self.inner.slot_lease))
            .arg(millis(self.inner.slot_lease * 2))
            .arg(millis(IDLE_TTL))
            .invoke_async(&mut self.inner.client.connection())
            .await?;
        slots.hand_over(handed).await;
        if granted != 1 {
            return Ok(None);
        }
        self.waited(LimitKind::Concurrency, waited);
        Ok(Some(Slot::start(slots, member.to_string())))
    }

    /// Takes `member`'s turn of `rate` in `partition`: `None` once the run
    /// may start (after sleeping until a turn at most its short wait off),
    /// else how long until its turn.
    async fn take_turn(
        &self,
        partition: &str,
        member: &str,
        rate: Rate,
    ) -> Result<Option<Duration>, QueueError> {
        let (granted, wait, waited): (i64, i64, i64) = TAKE_TURN
            .key(self.key("rate", partition))
            .key(self.key("rate_turns", partition))
            .key(self.key("rate_since", partition))
            .arg(member)
            .arg(rate.interval_micros())
            .arg(rate.tolerance_micros())
            .arg(rate.grace_micros())
            .arg(micros(rate.short_wait()))
            .arg(millis(IDLE_TTL))
            .invoke_async(&mut self.inner.client.connection())
            .await?;
        let wait = Duration::from_micros(u64::try_from(wait).unwrap_or(0));
        if granted != 1 {
            return Ok(Some(wait.max(Duration::from_micros(1))));
        }
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        self.waited(LimitKind::Rate, waited);
        Ok(None)
    }
}

/// What a granted run holds: its concurrency slot, if the listener has a
/// concurrency limit. Release it when the run ends, [`Permit::release`];
/// one dropped unreleased (a panic, a timeout) is released in the
/// background.
#[derive(Debug)]
pub(crate) struct Permit {
    slot: Option<Slot>,
}

impl Permit {
    /// Frees the run's slot and hands it to the oldest waiter, whose task
    /// it wakes. A failure is logged, not returned: the slot frees itself
    /// when its lease runs out, and the waiters wake by themselves.
    pub(crate) async fn release(mut self) {
        if let Some(slot) = self.slot.take() {
            slot.release().await;
        }
    }
}

/// The keys of one partition's concurrency limit.
#[derive(Debug)]
struct SlotKeys {
    limiter: Limiter,
    holders: String,
    waiters: String,
    limit: u32,
}

impl SlotKeys {
    /// Wakes the tasks of the waiters `handed` a slot (members); a slot
    /// handed to a task that no longer waits is freed again, to the next
    /// waiter. A failure is logged: the waiters wake after a slot lease.
    async fn hand_over(&self, mut handed: Vec<String>) {
        let client = &self.limiter.inner.client;
        for _ in 0..MAX_HAND_OVERS {
            if handed.is_empty() {
                return;
            }
            let mut by_queue: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for waiter in &handed {
                match serde_json::from_str::<(String, String)>(waiter) {
                    Ok((queue, id)) => by_queue.entry(queue).or_default().push(id),
                    Err(_) => {
                        tracing::warn!(%waiter, key = %self.waiters, "not a waiter of a limit; skipped")
                    }
                }
            }
            let mut gone = Vec::new();
            for (queue, ids) in by_queue {
                match client.promote(&queue, &ids).await {
                    Ok(ids) => gone.extend(ids.iter().map(|id| member(&queue, id))),
                    Err(err) => {
                        tracing::warn!(%queue, error = %err, "could not wake the tasks waiting for a limit; they wake after a slot lease");
                    }
                }
            }
            handed = Vec::new();
            for member in gone {
                match self.free(&member).await {
                    Ok(next) => handed.extend(next),
                    Err(err) => {
                        tracing::warn!(error = %err, "could not pass a slot on; it frees itself after its lease");
                    }
                }
            }
        }
    }

    /// Frees `member`'s slot and hands the free slots to the oldest
    /// waiters, whom it returns.
    async fn free(&self, member: &str) -> Result<Vec<String>, QueueError> {
        let lease = self.limiter.inner.slot_lease;
        Ok(FREE_SLOT
            .key(&self.holders)
            .key(&self.waiters)
            .arg(member)
            .arg(self.limit)
            .arg(micros(lease))
            .arg(millis(lease * 2))
            .invoke_async(&mut self.limiter.inner.client.connection())
            .await?)
    }
}

/// A concurrency slot held, its lease renewed in the background until it
/// is released; one dropped unreleased (a panic, a timeout, an error
/// between taking it and the run) is released in the background.
#[derive(Debug)]
struct Slot {
    keys: Arc<SlotKeys>,
    member: String,
    renewal: JoinHandle<()>,
    released: bool,
}

impl Slot {
    /// The slot `member` holds, renewed every third of the lease.
    fn start(keys: Arc<SlotKeys>, member: String) -> Self {
        let renewal = tokio::spawn({
            let (keys, member) = (Arc::clone(&keys), member.clone());
            async move {
                let lease = keys.limiter.inner.slot_lease;
                loop {
                    tokio::time::sleep(lease / 3).await;
                    let renewed: Result<i64, _> = RENEW_SLOT
                        .key(&keys.holders)
                        .arg(&member)
                        .arg(micros(lease))
                        .arg(millis(lease * 2))
                        .invoke_async(&mut keys.limiter.inner.client.connection())
                        .await;
                    match renewed {
                        Ok(1) => {}
                        Ok(_) => {
                            tracing::warn!(%member, key = %keys.holders, "a run's concurrency slot expired while it ran (Valkey was out of reach?); the limit may be exceeded");
                            return;
                        }
                        Err(err) => {
                            tracing::warn!(%member, error = %err, "could not renew a run's concurrency slot");
                        }
                    }
                }
            }
        });
        Self {
            keys,
            member,
            renewal,
            released: false,
        }
    }

    /// Frees the slot, hands it on and wakes the waiter's task.
    async fn release(mut self) {
        self.released = true;
        self.renewal.abort();
        free_slot(&self.keys, &self.member).await;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        // Without a runtime, the lease (no longer renewed) frees it.
        self.renewal.abort();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (keys, member) = (Arc::clone(&self.keys), std::mem::take(&mut self.member));
            runtime.spawn(async move { free_slot(&keys, &member).await });
        }
    }
}

/// Frees `member`'s slot of `keys`, hands it on and wakes the waiter's
/// task. A failure is logged: the slot frees itself after its lease.
async fn free_slot(keys: &SlotKeys, member: &str) {
    match keys.free(member).await {
        Ok(handed) => keys.hand_over(handed).await,
        Err(err) => {
            tracing::warn!(%member, error = %err, "could not free a concurrency slot; it frees itself after its lease");
        }
    }
}

/// A run's member in the limits' sorted sets: `["<queue>","<task id>"]`
/// (task ids are unique within a queue only).
pub(super) fn member(queue: &str, id: &str) -> String {
    serde_json::to_string(&(queue, id)).expect("two strings serialise")
}

pub(super) fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

pub(super) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
