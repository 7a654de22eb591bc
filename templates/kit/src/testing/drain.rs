//! The drain: the outbox published and every listener run, in the test's
//! process and without Valkey, until nothing is left ([`Drain`]); and one
//! listener run on one event ([`run_listener`]).
//!
//! A delivery takes the path the worker's takes: the relay's claim marks
//! the rows published, each event becomes the task the fan-out would queue
//! for each listener (its payload, headers and id), and the worker's
//! listener handler runs it, `ctx.once` and its inbox included, in the
//! trace the consumer would run it in, stopped at its listener's timeout
//! as the worker stops it (a failure). Only the queue is left out, and
//! with it the retries: a failure is reported, not retried, a `SkipRetry`
//! is reported as archived, and a `Snooze` as snoozed, not run again.
//!
//! Events dispatched for later (`kit::dispatch_in`) are delivered once
//! they are due, as the worker's mover would move them: by the clock, or
//! "as of" a time the test gives ([`Drain::as_of`],
//! [`TestDatabase::drain_as_of`]), so a test of a 24-hour reminder does
//! not wait 24 hours.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use prometheus_client::metrics::counter::Counter;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sqlx::PgPool;
use uuid::Uuid;

use super::TestDatabase;
use crate::database::Transactor;
use crate::outbox::Event;
use crate::outbox::{Envelope, Store};
use crate::queue::Task;
use crate::trace_context::{self, TraceContext};
use crate::worker::listeners::{Listener, ListenerContext, ListenerError, Listeners};

/// How many generations of events a drain follows before it calls the
/// chain a cycle.
const MAX_GENERATIONS: usize = 20;
/// How many deliveries one drain makes at most (listeners that dispatch
/// several events each, redelivered, grow a chain faster than its length).
const MAX_DELIVERIES: usize = 10_000;
/// How long one delivery may run.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);
/// Rows claimed per statement.
const CLAIM_BATCH: u32 = 1000;

/// Runs every unpublished event through the service's listeners, and the
/// events they dispatch in turn, until the outbox is drained; returns what
/// ran ([`DrainReport`]).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # if !kit::testing::example_has_a_database() { return; }
/// use kit::prelude::*;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Debug, Serialize, Deserialize)]
/// struct OrderPlaced {
///     quantity: i32,
/// }
/// impl Event for OrderPlaced {
///     const NAME: &'static str = "orderPlaced";
/// }
///
/// async fn confirm(event: OrderPlaced, ctx: ListenerContext) -> Result<(), ListenerError> {
///     ctx.once(async |tx| {
///         sqlx::query("SELECT $1").bind(event.quantity).execute(&mut *tx).await?;
///         Ok(())
///     })
///     .await?;
///     Ok(())
/// }
///
/// let mut listeners = Listeners::new();
/// listeners.listen("confirm", confirm);
///
/// let db = kit::testing::TestDatabase::new().await;
/// db.transactor()
///     .run(async |tx| Ok(dispatch(&mut *tx, &OrderPlaced { quantity: 2 }).await?))
///     .await
///     .unwrap();
///
/// let report = db.drain(&listeners).await;
/// report.assert_succeeded("orderPlaced", "confirm");
///
/// // Every event delivered twice: `ctx.once` ran the first time only.
/// db.transactor()
///     .run(async |tx| Ok(dispatch(&mut *tx, &OrderPlaced { quantity: 3 }).await?))
///     .await
///     .unwrap();
/// db.drain_twice(&listeners).await.assert_idempotent("orderPlaced", "confirm");
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Drain<'a> {
    listeners: &'a Listeners,
    deliveries: u32,
    max_generations: usize,
    timeout: Duration,
    as_of: Option<DateTime<Utc>>,
}

impl<'a> Drain<'a> {
    /// A drain through `listeners`: each delivery once, at most 20
    /// generations of events, 30 s per delivery.
    pub fn new(listeners: &'a Listeners) -> Self {
        Self {
            listeners,
            deliveries: 1,
            max_generations: MAX_GENERATIONS,
            timeout: DELIVERY_TIMEOUT,
            as_of: None,
        }
    }

    /// Drains as if the clock read `when`: events dispatched for later
    /// (`kit::dispatch_at`, `kit::dispatch_in`) due at or before `when`
    /// are delivered too, in due order, as the worker delivers them once
    /// their time comes. Without it, the drain delivers those due now.
    ///
    /// Only the outbox's clock moves: an event a listener dispatches
    /// `dispatch_in` an hour is due an hour from the real now, so within
    /// `when` it is delivered in the same drain (a listener that
    /// reschedules itself without end meets the generations' bound,
    /// [`Drain::max_generations`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// # if !kit::testing::example_has_a_database() { return; }
    /// use std::time::Duration;
    /// use kit::prelude::*;
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Debug, Serialize, Deserialize)]
    /// struct Reminder {
    ///     user_id: i64,
    /// }
    /// impl Event for Reminder {
    ///     const NAME: &'static str = "reminder";
    /// }
    ///
    /// async fn remind(event: Reminder, ctx: ListenerContext) -> Result<(), ListenerError> {
    ///     ctx.once(async |tx| {
    ///         sqlx::query("SELECT $1").bind(event.user_id).execute(&mut *tx).await?;
    ///         Ok(())
    ///     })
    ///     .await?;
    ///     Ok(())
    /// }
    /// let listeners = kit::testing::listeners(|l| {
    ///     l.listen("remind", remind);
    /// });
    ///
    /// let db = kit::testing::TestDatabase::new().await;
    /// let day = Duration::from_secs(24 * 3600);
    /// db.transactor()
    ///     .run(async |tx| Ok(dispatch_in(&mut *tx, &Reminder { user_id: 7 }, day).await?))
    ///     .await
    ///     .unwrap();
    ///
    /// // Not yet: the reminder is due tomorrow.
    /// assert!(db.drain(&listeners).await.of("reminder", "remind").is_empty());
    /// // Tomorrow, as far as the outbox knows.
    /// let tomorrow = chrono::Utc::now() + chrono::Duration::hours(24);
    /// db.drain_as_of(&listeners, tomorrow)
    ///     .await
    ///     .assert_succeeded("reminder", "remind");
    /// # }
    /// ```
    pub fn as_of(mut self, when: DateTime<Utc>) -> Self {
        self.as_of = Some(when);
        self
    }

    /// Delivers every event twice to each listener, one right after the
    /// other, as the queue may: the redelivery check.
    pub fn twice(mut self) -> Self {
        self.deliveries = 2;
        self
    }

    /// Stops with an error once a chain of events, each dispatched by a
    /// listener of the one before, is longer than `generations`.
    pub fn max_generations(mut self, generations: usize) -> Self {
        self.max_generations = generations;
        self
    }

    /// Reports a delivery that runs longer than `timeout` as timed out
    /// (one whose listener's own timeout is shorter fails at that one, as
    /// on the worker).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Drains the outbox of the database behind `pool`.
    ///
    /// # Panics
    ///
    /// When the listeners dispatch one another without end, or the
    /// database fails: see [`Self::try_run`].
    pub async fn run(&self, pool: &PgPool) -> DrainReport {
        match self.try_run(pool).await {
            Ok(report) => report,
            Err(err) => panic!("{err:#}"),
        }
    }

    /// Drains the outbox of the database behind `pool`. A listener's
    /// failure, panic or timeout is in the report, not an error; a chain of
    /// events longer than the bound (a cycle) is, and names the cycle.
    pub async fn try_run(&self, pool: &PgPool) -> anyhow::Result<DrainReport> {
        let transactor = Transactor::new(pool.clone());
        let mut report = DrainReport::default();
        let mut lineages: HashMap<Uuid, Lineage> = HashMap::new();
        loop {
            let claimed = claim_all(pool, self.as_of).await?;
            if claimed.is_empty() {
                return Ok(report);
            }
            for envelope in claimed {
                let lineage = lineages
                    .remove(&envelope.id)
                    .unwrap_or_else(|| Lineage::root(&envelope.name));
                if lineage.generations() > self.max_generations {
                    anyhow::bail!(lineage.cycle_error(self.max_generations));
                }
                anyhow::ensure!(
                    report.deliveries.len() < MAX_DELIVERIES,
                    "the drain stopped after {MAX_DELIVERIES} deliveries, with events still \
                     coming: the listeners dispatch more than they drain\n\
                     last: {}",
                    lineage.describe(0)
                );
                for listener in self.listeners.of(&envelope.name) {
                    for attempt in 1..=self.deliveries {
                        let delivery =
                            deliver(listener, &envelope, &transactor, attempt, self.timeout)
                                .await?;
                        for event in &delivery.dispatched {
                            lineages.insert(event.id, lineage.child(listener.name(), &event.name));
                        }
                        report.deliveries.push(delivery);
                    }
                }
                report.events.push(envelope);
            }
        }
    }
}

impl TestDatabase {
    /// [`Drain::run`] of this database through `listeners`: every event
    /// delivered once.
    pub async fn drain(&self, listeners: &Listeners) -> DrainReport {
        Drain::new(listeners).run(self.pool()).await
    }

    /// [`Drain::run`] of this database through `listeners`, every event
    /// delivered twice ([`Drain::twice`]).
    pub async fn drain_twice(&self, listeners: &Listeners) -> DrainReport {
        Drain::new(listeners).twice().run(self.pool()).await
    }

    /// [`Drain::run`] of this database through `listeners` as if the clock
    /// read `when` ([`Drain::as_of`]): events dispatched for later and due
    /// by then are delivered too.
    pub async fn drain_as_of(&self, listeners: &Listeners, when: DateTime<Utc>) -> DrainReport {
        Drain::new(listeners).as_of(when).run(self.pool()).await
    }
}

/// The service's listeners, as `register` (the service's
/// `listeners::register`) registers them for the worker.
pub fn listeners(register: impl FnOnce(&mut Listeners)) -> Listeners {
    let mut listeners = Listeners::new();
    register(&mut listeners);
    listeners
}

/// Runs the listener `handler`, registered as `name`, on `event`, as the
/// worker would (a real [`ListenerContext`], `once` included), and reports
/// how it ended and what it dispatched.
///
/// # Panics
///
/// When the database fails.
pub async fn run_listener<E, C, F, Fut>(
    pool: &PgPool,
    name: &str,
    handler: F,
    event: &E,
) -> Delivery
where
    E: Event + Serialize + DeserializeOwned + 'static,
    C: From<ListenerContext> + Send + 'static,
    F: Fn(E, C) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), ListenerError>> + Send + 'static,
{
    let mut listeners = Listeners::new();
    listeners.listen(name, handler);
    let payload = serde_json::to_value(event).expect("the event serialises");
    let envelope = Envelope::new(E::NAME, payload);
    let transactor = Transactor::new(pool.clone());
    deliver(
        &listeners.of(E::NAME)[0],
        &envelope,
        &transactor,
        1,
        DELIVERY_TIMEOUT,
    )
    .await
    .unwrap_or_else(|err| panic!("{err:#}"))
}

/// A [`ListenerContext`] for `listener`'s delivery of the event `event_id`,
/// to call a listener's function directly; its `once` records in the inbox
/// of the database behind `pool`.
pub fn listener_context(pool: &PgPool, listener: &str, event_id: Uuid) -> ListenerContext {
    let mut envelope = Envelope::new("", serde_json::Value::Null);
    envelope.id = event_id;
    ListenerContext::new(
        &envelope,
        Default::default(),
        listener,
        Transactor::new(pool.clone()),
        Counter::default(),
        None,
    )
}

/// Every unpublished event, marked published, in id order, after the
/// events for later due by `as_of` (now, when `None`) were moved into the
/// outbox, as the worker's mover moves them.
async fn claim_all(pool: &PgPool, as_of: Option<DateTime<Utc>>) -> anyhow::Result<Vec<Envelope>> {
    while Store.move_due(pool, CLAIM_BATCH, as_of).await? == u64::from(CLAIM_BATCH) {}
    let mut all = Vec::new();
    loop {
        let mut tx = pool.begin().await?;
        let claimed = Store.claim_and_mark(&mut tx, CLAIM_BATCH, 0).await?;
        tx.commit().await?;
        let full = claimed.len() == CLAIM_BATCH as usize;
        all.extend(claimed.into_iter().map(|claimed| claimed.envelope));
        if !full {
            return Ok(all);
        }
    }
}

/// The task the fan-out queues for `listener` on the relay's task of
/// `envelope`.
fn listener_task(listener: &Listener, envelope: &Envelope) -> Task {
    Task {
        task_type: listener.task_type(),
        id: crate::worker::task_names::listener_task_id(envelope.id, listener.name()).to_string(),
        payload: serde_json::to_vec(envelope).expect("an envelope serialises"),
        headers: crate::trace_context::task_headers(&envelope.metadata),
        queue: crate::queue::DEFAULT_QUEUE.to_string(),
        retried: 0,
        failed_before: false,
        max_retry: listener.policy().retries,
    }
}

/// Runs one delivery of `envelope` to `listener` through the worker's
/// handler, in a task of its own (a panic is reported, not raised).
async fn deliver(
    listener: &Listener,
    envelope: &Envelope,
    transactor: &Transactor,
    attempt: u32,
    timeout: Duration,
) -> anyhow::Result<Delivery> {
    let pool = transactor.pool();
    let last_row = last_row_id(pool).await?;
    let recorded_before = inbox_recorded(pool, listener.name(), envelope.id).await;
    let duplicates = Counter::default();
    let (owned, task) = (listener.clone(), listener_task(listener, envelope));
    let (transactor, counted) = (transactor.clone(), duplicates.clone());
    // In the trace the consumer runs a task in: its headers' (the relay's),
    // continued, or a new one; so the events a listener dispatches carry
    // the trace they carry under the worker.
    let retried = i32::try_from(task.retried).unwrap_or(i32::MAX);
    let span = crate::spans::process(&task.id, &task.task_type, &task.queue, retried);
    let parent = TraceContext::from_metadata(&task.headers);
    let run = async move {
        crate::worker::listener_handler::run_listener(&owned, transactor, task, counted, None).await
    };
    let mut run = trace_context::spawn_in_task_trace(span, parent.as_ref(), run);
    // The worker stops a run at its listener's timeout (a failure, the
    // task retried); the drain's own bound reports a run that hangs.
    let listener_timeout = listener.policy().run_timeout();
    let outcome = match tokio::time::timeout(listener_timeout.min(timeout), &mut run).await {
        Err(_) => {
            run.abort();
            if listener_timeout < timeout {
                Outcome::Failed(format!(
                    "context deadline exceeded: ran past its listener's timeout of \
                     {listener_timeout:?}"
                ))
            } else {
                Outcome::TimedOut(timeout)
            }
        }
        Ok(Err(join)) => Outcome::Panicked(panic_message(join)),
        Ok(Ok(Ok(()))) => Outcome::Succeeded,
        Ok(Ok(Err(err))) if err.skips_retry() => Outcome::Archived(err.to_string()),
        Ok(Ok(Err(err))) => match err.deferred_until() {
            Some(until) if err.is_snooze() => Outcome::Snoozed(until),
            _ => Outcome::Failed(err.to_string()),
        },
    };
    let once = if duplicates.get() > 0 {
        Once::Skipped
    } else if !recorded_before && inbox_recorded(pool, listener.name(), envelope.id).await {
        Once::Ran
    } else {
        Once::NotRun
    };
    Ok(Delivery {
        event: envelope.name.clone(),
        event_id: envelope.id,
        listener: listener.name().to_string(),
        attempt,
        outcome,
        once,
        dispatched: super::dispatched::read_after(pool, last_row).await?,
    })
}

/// The text of a listener's panic.
fn panic_message(join: tokio::task::JoinError) -> String {
    if !join.is_panic() {
        return join.to_string();
    }
    let payload = join.into_panic();
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|text| text.to_string()))
        .unwrap_or_else(|| "a panic without a message".to_string())
}

/// The highest row id in the outbox, 0 when it is empty.
async fn last_row_id(pool: &PgPool) -> anyhow::Result<i64> {
    Ok(
        sqlx::query_scalar("SELECT COALESCE(max(id), 0)::bigint FROM outbox_events")
            .fetch_one(pool)
            .await?,
    )
}

/// Whether the inbox holds `listener`'s record of `event_id` (false also
/// without an inbox table).
async fn inbox_recorded(pool: &PgPool, listener: &str, event_id: Uuid) -> bool {
    sqlx::query_scalar::<_, bool>(
        "SELECT EXISTS (SELECT 1 FROM inbox_processed WHERE listener = $1 AND event_id = $2)",
    )
    .bind(listener)
    .bind(event_id)
    .fetch_one(pool)
    .await
    .unwrap_or(false)
}

/// The chain of events that led to one: each dispatched by a listener of
/// the one before.
#[derive(Debug, Clone)]
struct Lineage {
    /// The first event's name, then each listener and the event it
    /// dispatched.
    first: String,
    steps: Vec<(String, String)>,
}

impl Lineage {
    fn root(event: &str) -> Self {
        Self {
            first: event.to_string(),
            steps: Vec::new(),
        }
    }

    fn child(&self, listener: &str, event: &str) -> Self {
        let mut child = self.clone();
        child.steps.push((listener.to_string(), event.to_string()));
        child
    }

    fn generations(&self) -> usize {
        self.steps.len()
    }

    /// `a` → listener `l` → `b` ..., from `from` on.
    fn describe(&self, from: usize) -> String {
        let names: Vec<&str> = std::iter::once(self.first.as_str())
            .chain(self.steps.iter().map(|(_, event)| event.as_str()))
            .collect();
        let mut text = format!("`{}`", names[from]);
        for (listener, event) in &self.steps[from..] {
            text.push_str(&format!(" → listener `{listener}` → `{event}`"));
        }
        text
    }

    fn cycle_error(&self, bound: usize) -> String {
        let names: Vec<&str> = std::iter::once(self.first.as_str())
            .chain(self.steps.iter().map(|(_, event)| event.as_str()))
            .collect();
        let last = names.len() - 1;
        let start = names[..last]
            .iter()
            .rposition(|name| *name == names[last])
            .unwrap_or(0);
        format!(
            "the drain stopped: a chain of events went past {bound} generations, each \
             dispatched by a listener of the one before\n  cycle: {}\n\
             help: a listener that dispatches an event leading back to its own needs a \
             condition that ends the chain (or raise the bound with `Drain::max_generations`)",
            self.describe(start)
        )
    }
}

/// How one delivery ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The listener returned `Ok`.
    Succeeded,
    /// The listener returned an error, or ran past its listener's timeout:
    /// the worker would retry it.
    Failed(String),
    /// The listener returned a `SkipRetry` (or its event is no envelope):
    /// the worker would archive the task at once.
    Archived(String),
    /// The listener panicked, with this message.
    Panicked(String),
    /// The listener ran past the drain's timeout and was stopped.
    TimedOut(Duration),
    /// The listener returned a [`Snooze`](crate::worker::listeners::Snooze):
    /// the worker would run it again at this time, without spending an
    /// attempt. The drain does not.
    Snoozed(DateTime<Utc>),
}

/// What `ctx.once` did in one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Once {
    /// Its work ran and committed, with the inbox record.
    Ran,
    /// An earlier delivery had committed it, so it was skipped.
    Skipped,
    /// It was not called, or its work failed and rolled back.
    NotRun,
}

/// One delivery of an event to a listener.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The event's wire name.
    pub event: String,
    /// The event id.
    pub event_id: Uuid,
    /// The listener's name.
    pub listener: String,
    /// 1, or 2 for the redelivery of [`Drain::twice`].
    pub attempt: u32,
    /// How it ended.
    pub outcome: Outcome,
    /// What its `ctx.once` did.
    pub once: Once,
    /// The events it dispatched (committed), in order.
    pub dispatched: Vec<Envelope>,
}

impl Delivery {
    /// Whether the listener returned `Ok`.
    pub fn succeeded(&self) -> bool {
        self.outcome == Outcome::Succeeded
    }

    /// Asserts that the listener returned `Ok`, naming the failure.
    #[track_caller]
    pub fn assert_succeeded(&self) {
        assert!(self.succeeded(), "{self}{}", help(&self.outcome));
    }
}

impl fmt::Display for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "listener `{}` of `{}` {}{}: ",
            self.listener,
            self.event,
            self.event_id,
            if self.attempt > 1 {
                " (redelivered)"
            } else {
                ""
            }
        )?;
        match &self.outcome {
            Outcome::Succeeded => write!(f, "succeeded")?,
            Outcome::Failed(error) => write!(f, "failed: {error}")?,
            Outcome::Archived(error) => write!(f, "archived (not retried): {error}")?,
            Outcome::Panicked(message) => write!(f, "panicked: {message}")?,
            Outcome::TimedOut(after) => write!(f, "still running after {after:?}, stopped")?,
            Outcome::Snoozed(until) => write!(f, "snoozed until {}", until.to_rfc3339())?,
        }
        match self.once {
            Once::Ran => write!(f, "; ctx.once ran")?,
            Once::Skipped => write!(f, "; ctx.once skipped (already done)")?,
            Once::NotRun => {}
        }
        for event in &self.dispatched {
            write!(f, "; dispatched `{}` {}", event.name, event.id)?;
        }
        Ok(())
    }
}

/// A hint for a failure whose cause is known.
fn help(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::Failed(error) if error.contains("does not decode into") => {
            "\nhelp: the event's type changed since it was dispatched (a field renamed or \
             retyped?): keep reading the old shape (`#[serde(alias = \"old_name\")]`, \
             `#[serde(default)]`), as the worker must for events already queued"
        }
        Outcome::TimedOut(_) => {
            "\nhelp: a listener must not wait on something the test never provides"
        }
        Outcome::Snoozed(_) => {
            "\nhelp: the worker runs a snoozed listener again at that time, without \
             spending an attempt; the drain does not"
        }
        _ => "",
    }
}

/// What a drain did: every event it published and every delivery, in the
/// order they ran. Its `Display` lists them.
#[derive(Debug, Clone, Default)]
pub struct DrainReport {
    events: Vec<Envelope>,
    deliveries: Vec<Delivery>,
}

impl DrainReport {
    /// Every event the drain published, in order, with or without
    /// listeners.
    pub fn events(&self) -> &[Envelope] {
        &self.events
    }

    /// Every delivery, in the order they ran.
    pub fn deliveries(&self) -> &[Delivery] {
        &self.deliveries
    }

    /// The deliveries of the event named `event` to `listener`.
    pub fn of(&self, event: &str, listener: &str) -> Vec<&Delivery> {
        self.deliveries
            .iter()
            .filter(|delivery| delivery.event == event && delivery.listener == listener)
            .collect()
    }

    /// Asserts that every delivery succeeded.
    #[track_caller]
    pub fn assert_all_succeeded(&self) {
        if let Some(failed) = self.deliveries.iter().find(|d| !d.succeeded()) {
            panic!(
                "expected every delivery to succeed, and {failed}{}\n{self}",
                help(&failed.outcome)
            );
        }
    }

    /// Asserts that `listener` ran on an `event` and succeeded every time.
    #[track_caller]
    pub fn assert_succeeded(&self, event: &str, listener: &str) {
        let deliveries = self.of(event, listener);
        assert!(
            !deliveries.is_empty(),
            "expected listener `{listener}` to run on `{event}`, and it did not run\n\
             help: is it registered (the service's `listeners::register`), and was an \
             `{event}` dispatched and committed before the drain?\n{self}"
        );
        if let Some(failed) = deliveries.into_iter().find(|d| !d.succeeded()) {
            panic!(
                "expected listener `{listener}` of `{event}` to succeed, and {failed}{}\n{self}",
                help(&failed.outcome)
            );
        }
    }

    /// Asserts that `listener` ran on an `event` and that some delivery of
    /// it did not succeed; returns the first such.
    #[track_caller]
    pub fn assert_failed(&self, event: &str, listener: &str) -> &Delivery {
        self.deliveries
            .iter()
            .find(|d| d.event == event && d.listener == listener && !d.succeeded())
            .unwrap_or_else(|| {
                panic!(
                    "expected listener `{listener}` of `{event}` to fail, and it did not\n{self}"
                )
            })
    }

    /// After [`Drain::twice`]: asserts that every delivery of `listener` on
    /// an `event` succeeded, that its `ctx.once` work ran on the first
    /// delivery and was skipped on the second, and that the second
    /// dispatched nothing.
    #[track_caller]
    pub fn assert_idempotent(&self, event: &str, listener: &str) {
        self.assert_succeeded(event, listener);
        let deliveries = self.of(event, listener);
        assert!(
            deliveries.iter().any(|d| d.attempt > 1),
            "expected listener `{listener}` of `{event}` to be delivered twice: drain with \
             `drain_twice` (or `Drain::twice`)\n{self}"
        );
        for delivery in deliveries.iter().filter(|d| d.attempt > 1) {
            assert!(
                delivery.once != Once::Ran,
                "the redelivery ran `ctx.once` again: {delivery}\n{self}"
            );
            assert!(
                delivery.dispatched.is_empty(),
                "the redelivery dispatched events again (dispatch them in `ctx.once`, with \
                 its `tx`): {delivery}\n{self}"
            );
        }
    }
}

impl fmt::Display for DrainReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the drain published {} events and made {} deliveries:",
            self.events.len(),
            self.deliveries.len()
        )?;
        for delivery in &self.deliveries {
            write!(f, "\n  {delivery}")?;
        }
        Ok(())
    }
}
