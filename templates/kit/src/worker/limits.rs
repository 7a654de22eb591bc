//! Limits on how fast and how wide a listener runs, across every worker
//! (replica) sharing the queue: at most N runs at once (`concurrency`) and
//! at most R runs started per period (`rate`, with a burst), each for the
//! whole listener or per partition (a string key of the event, such as a
//! tenant). This module owns the limits' state in Valkey, the scripts that
//! change it, the [`Limiter`] a listener's handler asks before it runs, the
//! `WORKER_LIMITS` override and the limits' metrics ([`LimitMetrics`]).
//!
//! # Waiting holds no worker slot, and no one polls
//!
//! A run that may not start yet (but for the last moments before a rate
//! turn, its rate's short wait, slept in the handler) is not slept on:
//! [`Limiter::acquire`] answers [`Acquired::Wait`] and the handler returns
//! `HandlerError::defer(until)`; the consumer moves the task from active to
//! `:scheduled` (no retry counted, its error and retry count unchanged) and
//! frees its worker slot at once. The task comes back when its turn comes,
//! woken, not polling:
//!
//! - **rate**: one script (GCRA on Valkey's clock, `TIME`, as a queue)
//!   gives every run a turn: now, or the first turn free, turns spaced by
//!   the rate's interval (`per / count`), bursts as the burst allows. A
//!   run whose turn is further off than the short wait is deferred to just
//!   before it, by its rate's wake lead (two intervals, within 15-90 ms;
//!   the consumer that deferred the task moves it back to pending then, to
//!   the millisecond, see `crate::queue::consumer`), so waiting runs wake
//!   one by one, never as a herd, and a loaded worker slow to run them
//!   still has them back before their turns. A run back at its turn
//!   (or whose turn is within the short wait) sleeps what is left of it in
//!   the handler and starts on the turn; one back more than a quarter of
//!   an interval late has lost its turn and takes a new one (the turn is
//!   wasted, never given twice). So starts are the turns, late by less than
//!   a quarter of an interval: no window of one period holds more than
//!   `count + burst` starts, with three quarters of an interval to spare
//!   for the start's own delay. The bound holds on Valkey's clock, whatever
//!   the workers' clocks say: they are only told how long to wait.
//! - **concurrency**: a slot is a member of a sorted set scored by its
//!   lease's expiry, taken and freed by scripts, the lease renewed while the
//!   run lives. A run that finds no slot joins the listener's waiters (a
//!   sorted set, oldest first); whoever frees a slot hands it to the oldest
//!   waiter and wakes its task ([`crate::queue::Client::promote`]), which
//!   finds its slot held for it when it runs. A waiter whose task is gone
//!   passes its turn on. In case the waker dies between the two steps, a
//!   waiter also wakes after one slot lease by itself.
//!
//! With both, the slot is taken first; a run the rate then makes wait
//! frees it at once, to the next waiter.
//!
//! A listener without limits pays nothing: no Valkey call.
//!
//! # Crashes
//!
//! A worker killed with SIGKILL holds its slots until their leases run out
//! ([`SLOT_LEASE`], 30 s; renewed every third of it while runs live), then
//! they free themselves; its waiting tasks sit in `:scheduled` and any
//! worker's forwarder moves them to pending when due (`forward_interval`
//! late at worst, 5 s by default); a task it was running is recovered as
//! any (and takes its slot back if its lease is still held). Rate limits
//! keep no state per run.
//!
//! # Go asynq
//!
//! To a Go asynq server sharing the queue, a deferred task is an ordinary
//! scheduled task: asynqmon shows it under Scheduled, and Go's forwarder
//! moves it to pending when due (its score is the due time in whole
//! seconds, rounded up). A Go worker that handles the listener's task
//! type runs it without asking the limits: its runs are not limited, nor
//! counted in them. The limits' keys (`limits:{<task type>}:...`) are
//! outside asynq's namespace.
//!
//! # Keys
//!
//! Per listener (its task type `listener:<event>:<name>`, the hash tag of
//! all its keys, so that a script's keys share a cluster slot) and
//! partition (`""` for none): `slots` and `slot_waiters` (sorted sets of
//! `["<queue>","<task id>"]`), `rate` (a hash: `tat`, the GCRA's
//! theoretical arrival time, one interval past the last turn given, in µs
//! of Valkey's clock), `rate_turns` (deferred runs by turn) and
//! `rate_since` (deferred runs by when they first waited). Every key
//! expires once idle.

// The listeners' registration (`Listeners`) wires the limiter in; until it
// does, only the tests use it.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use redis::Script;
use tokio::task::JoinHandle;

use super::listeners::listener_task_type;
use crate::queue::{Client, QueueError, Task};

/// The environment variable that overrides listeners' limits at deploy
/// time (see [`parse_overrides`]).
pub(crate) const LIMITS_VAR: &str = "WORKER_LIMITS";
/// How long a concurrency slot stays taken without a renewal: a killed
/// worker's slots free themselves within it. Renewed every third of it.
pub(crate) const SLOT_LEASE: Duration = Duration::from_secs(30);
/// How long an idle limit's keys (and a waiter who never came back) live.
const IDLE_TTL: Duration = Duration::from_secs(24 * 3600);
/// The least and the most a deferred run is woken before its rate turn
/// ([`Rate::wake_lead`]).
const WAKE_LEAD_RANGE: (Duration, Duration) =
    (Duration::from_millis(15), Duration::from_millis(90));
/// How much earlier than its rate's wake lead a run may be back and still
/// sleep until its turn rather than wait again ([`Rate::short_wait`]).
const WAKE_MARGIN: Duration = Duration::from_millis(10);
/// How many times a release passes a slot on to the next waiter when the
/// one it was handed to no longer waits.
const MAX_HAND_OVERS: usize = 8;
/// The expected form of a `WORKER_LIMITS` entry, for errors.
const ENTRY_FORM: &str = "<event>.<listener>=concurrency:N,rate:N/s|N/m|N/h,burst:N \
     (any of the three, or `none`), entries separated by `;`, such as \
     orderPlaced.email=concurrency:5,rate:10/s,burst:10;orderPlaced.audit=rate:100/m";

/// The limits of one listener. [`Limits::default`] has none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// At most this many runs at once, across every worker (per partition
    /// when the listener has one).
    pub concurrency: Option<u32>,
    /// At most this many runs started per period, across every worker (per
    /// partition when the listener has one).
    pub rate: Option<Rate>,
}

impl Limits {
    /// Whether there is no limit at all.
    pub fn is_none(&self) -> bool {
        self.concurrency.is_none() && self.rate.is_none()
    }
}

/// `concurrency:5,rate:10/s,burst:10`, or `none`: the form of a
/// `WORKER_LIMITS` entry's right side.
impl fmt::Display for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.concurrency, self.rate) {
            (None, None) => f.write_str("none"),
            (Some(n), None) => write!(f, "concurrency:{n}"),
            (None, Some(rate)) => write!(f, "rate:{rate}"),
            (Some(n), Some(rate)) => write!(f, "concurrency:{n},rate:{rate}"),
        }
    }
}

impl FromStr for Limits {
    type Err = InvalidLimit;

    /// `concurrency:N`, `rate:N/s|N/m|N/h`, `burst:N` (with a rate),
    /// separated by commas, any of them; or `none`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("none") {
            return Ok(Self::default());
        }
        if text.is_empty() {
            return Err(InvalidLimit(
                "names no limit (write `none` for a listener without limits)".into(),
            ));
        }
        let mut limits = Self::default();
        let mut burst = None;
        for setting in text.split(',').map(str::trim) {
            let Some((name, value)) = setting.split_once(':') else {
                return Err(InvalidLimit(format!(
                    "`{setting}` is not a limit: it needs a name and a value, \
                     such as concurrency:5, rate:10/s or burst:10"
                )));
            };
            let (name, value) = (name.trim(), value.trim());
            let duplicate = || InvalidLimit(format!("`{name}` is given twice"));
            match name {
                "concurrency" => {
                    if limits.concurrency.is_some() {
                        return Err(duplicate());
                    }
                    limits.concurrency = Some(positive(setting, value)?);
                }
                "rate" => {
                    if limits.rate.is_some() {
                        return Err(duplicate());
                    }
                    let (count, per) = parse_count_per(value)?;
                    limits.rate = Some(Rate::new(count, per));
                }
                "burst" => {
                    if burst.is_some() {
                        return Err(duplicate());
                    }
                    burst = Some(positive(setting, value)?);
                }
                _ => {
                    return Err(InvalidLimit(format!(
                        "`{name}` is not a limit; the limits are concurrency, rate and burst"
                    )));
                }
            }
        }
        match (burst, &mut limits.rate) {
            (Some(burst), Some(rate)) => rate.burst = burst,
            (Some(_), None) => {
                return Err(InvalidLimit(
                    "`burst` needs a rate, such as rate:10/s,burst:10".into(),
                ));
            }
            (None, _) => {}
        }
        Ok(limits)
    }
}

/// At most `count` runs started per `per`, `burst` of them at once after a
/// quiet spell (at least 1: then runs are spaced evenly, `per / count`
/// apart). No window of one period holds more than `count + burst` starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Runs per period.
    pub count: u32,
    /// The period.
    pub per: Duration,
    /// How many runs may start at once after a quiet spell; 1 spaces them
    /// evenly.
    pub burst: u32,
}

impl Rate {
    /// `count` runs per `per`, evenly spaced (a burst of 1).
    pub fn new(count: u32, per: Duration) -> Self {
        Self {
            count,
            per,
            burst: 1,
        }
    }

    /// `count` runs per second.
    pub fn per_second(count: u32) -> Self {
        Self::new(count, Duration::from_secs(1))
    }

    /// `count` runs per minute.
    pub fn per_minute(count: u32) -> Self {
        Self::new(count, Duration::from_secs(60))
    }

    /// `count` runs per hour.
    pub fn per_hour(count: u32) -> Self {
        Self::new(count, Duration::from_secs(3600))
    }

    /// The same rate with a burst of `burst` runs at once.
    pub fn with_burst(self, burst: u32) -> Self {
        Self { burst, ..self }
    }

    /// `10/s`, `100/m`, `5000/h` (or `N/<duration>`, such as `10/5s`),
    /// optionally with a burst: `10/s,burst:20`. The form [`Rate`]'s
    /// `Display` writes.
    pub fn parse(text: &str) -> Result<Self, InvalidLimit> {
        let (rate, burst) = match text.split_once(',') {
            Some((rate, burst)) => (rate, Some(burst.trim())),
            None => (text, None),
        };
        let (count, per) = parse_count_per(rate.trim())?;
        let mut rate = Self::new(count, per);
        if let Some(burst) = burst {
            let value = burst.strip_prefix("burst:").ok_or_else(|| {
                InvalidLimit(format!(
                    "`{burst}` is not a burst; expected a rate such as 10/s, \
                     optionally with a burst: 10/s,burst:20"
                ))
            })?;
            rate.burst = positive(burst, value.trim())?;
        }
        Ok(rate)
    }

    /// The time between two runs at the steady rate, in µs.
    fn interval_micros(&self) -> f64 {
        self.per.as_secs_f64() * 1e6 / f64::from(self.count.max(1))
    }

    /// How far ahead of the steady rate a burst may run, in µs.
    fn tolerance_micros(&self) -> f64 {
        self.interval_micros() * f64::from(self.burst.max(1) - 1)
    }

    /// How long before its turn a deferred run is woken: two intervals,
    /// within [`WAKE_LEAD_RANGE`]. A run late back by more than the lead
    /// and a quarter of an interval loses its turn, and a worker starved of
    /// CPU wakes runs late by tens of milliseconds (15 ms ahead, a 20/s
    /// limit ran at 6/s on a loaded machine, scripts/bench/README.md); a
    /// woken run sleeps the lead in its handler, holding its worker slot, so
    /// about two runs of a listener sleep at once (fewer below 22/s, where
    /// the lead is its most; more above 133/s, where it is its least).
    fn wake_lead(&self) -> Duration {
        let (least, most) = WAKE_LEAD_RANGE;
        Duration::from_secs_f64(2.0 * self.interval_micros() / 1e6).clamp(least, most)
    }

    /// How far off a turn may be for its run to sleep until it in the
    /// handler rather than be deferred: the wake lead and a margin, so that
    /// a woken run finds its turn within it. A deferral and its wake-up
    /// cost about as much as such a sleep.
    fn short_wait(&self) -> Duration {
        self.wake_lead() + WAKE_MARGIN
    }

    /// How late a run may come back for its turn and still have it, in µs:
    /// a quarter of an interval. No period holds more than `count + burst`
    /// turns taken late by less than one interval; the rest of the
    /// interval is a margin for the delay between the grant and the start.
    fn grace_micros(&self) -> f64 {
        self.interval_micros() / 4.0
    }
}

impl FromStr for Rate {
    type Err = InvalidLimit;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

/// `10/s`, `100/m`, `5000/h`, `10/5s`; `,burst:N` after it unless the
/// burst is 1.
impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/", self.count)?;
        match self.per.as_secs() {
            1 | 60 | 3600 if self.per.subsec_nanos() == 0 => {
                f.write_str(match self.per.as_secs() {
                    1 => "s",
                    60 => "m",
                    _ => "h",
                })?;
            }
            _ => write!(f, "{}", humantime::format_duration(self.per))?,
        }
        if self.burst != 1 {
            write!(f, ",burst:{}", self.burst)?;
        }
        Ok(())
    }
}

/// `N/s`, `N/m`, `N/h` or `N/<duration>`: a count of at least 1 per a
/// period longer than zero.
fn parse_count_per(text: &str) -> Result<(u32, Duration), InvalidLimit> {
    let expected = "expected N/s, N/m or N/h (or N/<duration>, such as 10/5s)";
    let Some((count, unit)) = text.split_once('/') else {
        return Err(InvalidLimit(format!("`{text}` is not a rate; {expected}")));
    };
    let count = positive(text, count.trim())?;
    let unit = unit.trim();
    let per = match unit {
        "s" => Duration::from_secs(1),
        "m" => Duration::from_secs(60),
        "h" => Duration::from_secs(3600),
        _ => humantime::parse_duration(unit)
            .map_err(|_| InvalidLimit(format!("`{text}`: `{unit}` is not a period; {expected}")))?,
    };
    if per.is_zero() {
        return Err(InvalidLimit(format!(
            "`{text}`: the period must be longer than zero"
        )));
    }
    Ok((count, per))
}

/// A whole number of at least 1, the value of `setting`.
fn positive(setting: &str, value: &str) -> Result<u32, InvalidLimit> {
    match value.parse::<u32>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(InvalidLimit(format!(
            "`{setting}`: `{value}` is not a whole number of at least 1"
        ))),
    }
}

/// Why a limit's text does not read: what is wrong and the form expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidLimit(String);

/// A `WORKER_LIMITS` entry that does not read: which, why, and the form
/// expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{LIMITS_VAR}: the entry `{entry}` {problem}; expected {ENTRY_FORM}")]
pub struct LimitsError {
    /// The entry as written.
    pub entry: String,
    /// What is wrong with it.
    pub problem: String,
}

/// The limits of listeners by (event, listener), as `WORKER_LIMITS` sets
/// them.
pub(crate) type LimitOverrides = BTreeMap<(String, String), Limits>;

/// Reads `WORKER_LIMITS`: entries separated by `;`, each
/// `<event>.<listener>=<limits>`, the limits as [`Limits`] reads them
/// (`concurrency:N`, `rate:N/s|N/m|N/h`, `burst:N`, comma-separated, or
/// `none`), such as
/// `orderPlaced.email=concurrency:5,rate:10/s,burst:10;orderPlaced.audit=rate:100/m`.
/// An entry replaces every limit the code gives its listener: what it does
/// not name, the listener does not have. Blank entries are ignored; a
/// listener named twice is an error.
pub(crate) fn parse_overrides(text: &str) -> Result<LimitOverrides, LimitsError> {
    let mut overrides = LimitOverrides::new();
    for entry in text.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let error = |problem: String| LimitsError {
            entry: entry.to_string(),
            problem,
        };
        let Some((name, limits)) = entry.split_once('=') else {
            return Err(error(
                "has no `=` between the listener and its limits".into(),
            ));
        };
        let name = name.trim();
        let Some((event, listener)) = name
            .rsplit_once('.')
            .filter(|(event, listener)| !event.trim().is_empty() && !listener.trim().is_empty())
        else {
            return Err(error(format!(
                "does not name a listener as <event>.<listener>: `{name}`"
            )));
        };
        let limits: Limits = limits.parse().map_err(|err: InvalidLimit| error(err.0))?;
        let key = (event.trim().to_string(), listener.trim().to_string());
        if overrides.insert(key, limits).is_some() {
            return Err(error(format!("names `{name}` again")));
        }
    }
    Ok(overrides)
}

/// [`parse_overrides`] of `WORKER_LIMITS`; none when it is unset or blank.
pub(crate) fn overrides_from_env() -> Result<LimitOverrides, LimitsError> {
    match std::env::var(LIMITS_VAR) {
        Ok(text) => parse_overrides(&text),
        Err(_) => Ok(LimitOverrides::new()),
    }
}

/// Which limit made a run wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum LimitKind {
    /// No concurrency slot was free.
    Concurrency,
    /// The rate allowed no run yet.
    Rate,
}

impl LimitKind {
    /// `concurrency` or `rate`, its metrics label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Concurrency => "concurrency",
            Self::Rate => "rate",
        }
    }
}

/// The labels of the limits' metrics:
/// `event="orderPlaced",listener="email",limit="rate"`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct LimitLabels {
    /// The event's wire name.
    pub event: String,
    /// The listener's name.
    pub listener: String,
    /// `concurrency` or `rate`.
    pub limit: String,
}

/// Runs deferred by a limit, and how long runs waited for one. Cloning
/// shares them.
#[derive(Debug, Clone)]
pub(crate) struct LimitMetrics {
    /// Runs deferred because a limit was reached (a run deferred twice
    /// counts twice).
    pub deferred: Family<LimitLabels, Counter>,
    /// How long runs that had to wait waited, from their first deferral
    /// to their start, in seconds (Valkey's clock).
    pub waited: Family<LimitLabels, Histogram, fn() -> Histogram>,
}

/// Buckets from 10 ms to about 5.5 min.
fn wait_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 16))
}

impl Default for LimitMetrics {
    fn default() -> Self {
        Self {
            deferred: Family::default(),
            waited: Family::new_with_constructor(wait_histogram),
        }
    }
}

impl LimitMetrics {
    /// Exports the series of `listener` of `event` for each limit it has,
    /// at 0, before its first wait.
    pub(crate) fn register_listener(&self, event: &str, listener: &str, limits: Limits) {
        let kinds = [
            limits.concurrency.map(|_| LimitKind::Concurrency),
            limits.rate.map(|_| LimitKind::Rate),
        ];
        for kind in kinds.into_iter().flatten() {
            let labels = LimitLabels {
                event: event.to_string(),
                listener: listener.to_string(),
                limit: kind.as_str().to_string(),
            };
            drop(self.deferred.get_or_create(&labels));
            drop(self.waited.get_or_create(&labels));
        }
    }

    /// Registers both families in `registry` (the worker's `outbox_`
    /// prefix: `outbox_listener_limit_deferred_total` and
    /// `outbox_listener_limit_wait_seconds`).
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "listener_limit_deferred",
            "Listener runs deferred because a limit was reached, by event, listener and limit",
            self.deferred.clone(),
        );
        registry.register(
            "listener_limit_wait_seconds",
            "How long listener runs waited for a limit before they started, by event, listener and limit",
            self.waited.clone(),
        );
    }
}

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
fn member(queue: &str, id: &str) -> String {
    serde_json::to_string(&(queue, id)).expect("two strings serialise")
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Takes a slot, or registers a waiter. The holders' expired leases are
/// dropped first. A member that holds a slot already (handed to it while
/// it waited, or its own run's, recovered) keeps it. Granted, the member
/// leaves the waiters, and the slots still free go to the oldest waiters.
/// Returns `{granted (1/0), µs waited since first registered (0 if not),
/// members handed a slot}`.
///
/// KEYS: holders, waiters. ARGV: member, limit, lease (µs), holders' TTL
/// (ms), waiters' TTL (ms).
static TAKE_SLOT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local limit, lease = tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", now)
local held = redis.call("ZSCORE", KEYS[1], ARGV[1])
if held or redis.call("ZCARD", KEYS[1]) < limit then
    redis.call("ZADD", KEYS[1], now + lease, ARGV[1])
    local waited = 0
    local since = redis.call("ZSCORE", KEYS[2], ARGV[1])
    if since then
        waited = now - tonumber(since)
        redis.call("ZREM", KEYS[2], ARGV[1])
    end
    local handed = {}
    local free = limit - redis.call("ZCARD", KEYS[1])
    if free > 0 then
        handed = redis.call("ZRANGE", KEYS[2], 0, free - 1)
        for _, waiter in ipairs(handed) do
            redis.call("ZADD", KEYS[1], now + lease, waiter)
            redis.call("ZREM", KEYS[2], waiter)
        end
    end
    redis.call("PEXPIRE", KEYS[1], ARGV[4])
    return {1, math.floor(waited), handed}
end
redis.call("ZADD", KEYS[2], "NX", now, ARGV[1])
redis.call("PEXPIRE", KEYS[2], ARGV[5])
return {0, 0, {}}
"#,
    )
});

/// Frees a slot; the slots then free (this one, and any whose lease ran
/// out) go to the oldest waiters, leased for them. Returns the members
/// handed a slot.
///
/// KEYS: holders, waiters. ARGV: member, limit, lease (µs), holders' TTL
/// (ms).
static FREE_SLOT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call("ZREM", KEYS[1], ARGV[1])
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", now)
local handed = {}
local free = tonumber(ARGV[2]) - redis.call("ZCARD", KEYS[1])
if free > 0 then
    handed = redis.call("ZRANGE", KEYS[2], 0, free - 1)
    for _, waiter in ipairs(handed) do
        redis.call("ZADD", KEYS[1], now + tonumber(ARGV[3]), waiter)
        redis.call("ZREM", KEYS[2], waiter)
    end
    if #handed > 0 then
        redis.call("PEXPIRE", KEYS[1], ARGV[4])
    end
end
return handed
"#,
    )
});

/// Extends a held slot's lease; 0 when the member holds none (its lease
/// ran out and the slot was taken back).
///
/// KEYS: holders. ARGV: member, lease (µs), holders' TTL (ms).
static RENEW_SLOT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local renewed = redis.call("ZADD", KEYS[1], "XX", "CH", now + tonumber(ARGV[2]), ARGV[1])
if renewed == 1 then
    redis.call("PEXPIRE", KEYS[1], ARGV[3])
end
return renewed
"#,
    )
});

/// A rate's turn: GCRA on Valkey's clock (µs) as a queue. `tat`, the
/// theoretical arrival time, is one interval past the last turn given; a
/// new turn is `max(now, tat - tolerance)` (now while the rate and burst
/// allow, else the first free turn), and moves `tat` one interval on. A
/// turn further off than the short wait is kept in the turns set and the
/// run told to wait for it; one within it is the run's at once (it sleeps
/// the rest). A run back for its turn gets it (within the short wait),
/// is told to wait the rest (earlier), or, more than the grace late, has
/// lost it and takes a new one. Turns not claimed within an hour are
/// dropped. Returns `{granted (1/0), µs until the turn (0 if now), µs
/// waited since first told to wait (granted runs only)}`.
///
/// KEYS: state (hash: tat), turns, since. ARGV: member, interval (µs),
/// tolerance (µs), grace (µs), short wait (µs), idle TTL (ms).
static TAKE_TURN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval, tolerance = tonumber(ARGV[2]), tonumber(ARGV[3])
local grace, short, ttl = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local turn = tonumber(redis.call("ZSCORE", KEYS[2], ARGV[1]))
if turn and now > turn + grace then
    redis.call("ZREM", KEYS[2], ARGV[1])
    turn = nil
end
if not turn then
    local tat = tonumber(redis.call("HGET", KEYS[1], "tat")) or now
    if tat < now then
        tat = now
    end
    turn = math.max(now, tat - tolerance)
    redis.call("HSET", KEYS[1], "tat", tat + interval)
    redis.call("PEXPIRE", KEYS[1], math.ceil((tat + interval - now) / 1000) + ttl)
    if turn - now > short then
        redis.call("ZADD", KEYS[2], turn, ARGV[1])
        redis.call("ZADD", KEYS[3], "NX", now, ARGV[1])
        redis.call("ZREMRANGEBYSCORE", KEYS[2], "-inf", now - 3600000000)
        redis.call("ZREMRANGEBYSCORE", KEYS[3], "-inf", now - ttl * 1000)
        local expiry = math.ceil((turn - now) / 1000) + ttl
        redis.call("PEXPIRE", KEYS[2], expiry)
        redis.call("PEXPIRE", KEYS[3], expiry)
        return {0, math.ceil(turn - now), 0}
    end
elseif turn - now > short then
    return {0, math.ceil(turn - now), 0}
else
    redis.call("ZREM", KEYS[2], ARGV[1])
end
local wait = math.max(0, math.ceil(turn - now))
local waited = 0
local since = tonumber(redis.call("ZSCORE", KEYS[3], ARGV[1]))
if since then
    waited = now - since + wait
    redis.call("ZREM", KEYS[3], ARGV[1])
end
return {1, wait, math.floor(waited)}
"#,
    )
});

/// Every script of the limits, by name (the check that each passes every
/// key it touches in KEYS).
#[cfg(test)]
pub(crate) fn scripts() -> Vec<(&'static str, &'static Script)> {
    vec![
        ("TAKE_SLOT", &TAKE_SLOT),
        ("FREE_SLOT", &FREE_SLOT),
        ("RENEW_SLOT", &RENEW_SLOT),
        ("TAKE_TURN", &TAKE_TURN),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn overrides(text: &str) -> LimitOverrides {
        parse_overrides(text).unwrap_or_else(|err| panic!("{err}"))
    }

    fn key(event: &str, listener: &str) -> (String, String) {
        (event.to_string(), listener.to_string())
    }

    #[test]
    fn rates_read_per_second_minute_and_hour_with_an_optional_burst() {
        assert_eq!(Rate::parse("10/s").unwrap(), Rate::per_second(10));
        assert_eq!(Rate::parse("100/m").unwrap(), Rate::per_minute(100));
        assert_eq!(Rate::parse(" 5000/h ").unwrap(), Rate::per_hour(5000));
        assert_eq!(
            Rate::parse("10/s,burst:20").unwrap(),
            Rate::per_second(10).with_burst(20)
        );
        assert_eq!(
            Rate::parse("3/5s").unwrap(),
            Rate::new(3, Duration::from_secs(5))
        );
        assert_eq!(Rate::per_second(10).burst, 1, "evenly spaced unless said");
    }

    #[test]
    fn rates_write_the_form_they_read() {
        for text in [
            "10/s",
            "100/m",
            "5000/h",
            "10/s,burst:20",
            "3/5s",
            "7/1m 30s",
        ] {
            let rate = Rate::parse(text).unwrap();
            assert_eq!(rate.to_string(), text);
            assert_eq!(Rate::parse(&rate.to_string()).unwrap(), rate);
        }
    }

    #[test]
    fn a_wrong_rate_says_what_is_wrong_and_the_form_expected() {
        for (text, says) in [
            ("10", "`10` is not a rate; expected N/s, N/m or N/h"),
            ("10/x", "`x` is not a period; expected N/s, N/m or N/h"),
            ("0/s", "`0` is not a whole number of at least 1"),
            ("-1/s", "`-1` is not a whole number of at least 1"),
            ("ten/s", "`ten` is not a whole number"),
            ("10/0s", "the period must be longer than zero"),
            ("10/s,burst:0", "`0` is not a whole number of at least 1"),
            ("10/s,20", "`20` is not a burst"),
        ] {
            let err = Rate::parse(text).unwrap_err().to_string();
            assert!(err.contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn the_rate_spaces_runs_by_its_interval_and_bursts_ahead_by_its_tolerance() {
        let rate = Rate::per_second(50).with_burst(5);
        assert_eq!(rate.interval_micros(), 20_000.0);
        assert_eq!(rate.tolerance_micros(), 80_000.0);
        assert_eq!(Rate::per_minute(3).tolerance_micros(), 0.0);
    }

    #[test]
    fn a_deferred_run_is_woken_two_intervals_early_within_15_to_90_ms_and_sleeps_the_rest() {
        let lead = |rate: Rate| rate.wake_lead().as_millis();
        assert_eq!(lead(Rate::per_second(50)), 40);
        assert_eq!(lead(Rate::per_second(20)), 90);
        assert_eq!(lead(Rate::per_minute(1)), 90);
        assert_eq!(lead(Rate::per_second(1_000)), 15);
        // A run woken early finds its turn within its short wait.
        let rate = Rate::per_second(20);
        assert_eq!(rate.short_wait(), rate.wake_lead() + WAKE_MARGIN);
    }

    #[test]
    fn worker_limits_reads_each_listeners_limits() {
        let parsed = overrides(
            "orderPlaced.email=concurrency:5,rate:10/s,burst:10;orderPlaced.audit=rate:100/m",
        );
        assert_eq!(
            parsed,
            LimitOverrides::from([
                (
                    key("orderPlaced", "email"),
                    Limits {
                        concurrency: Some(5),
                        rate: Some(Rate::per_second(10).with_burst(10)),
                    },
                ),
                (
                    key("orderPlaced", "audit"),
                    Limits {
                        concurrency: None,
                        rate: Some(Rate::per_minute(100)),
                    },
                ),
            ])
        );
    }

    #[test]
    fn worker_limits_allows_spaces_blank_entries_none_and_dotted_events() {
        let parsed = overrides(
            " orderPlaced.email = burst:2 , rate:10/s ; ; orderPlaced.audit=none;shop.order.placed.audit=concurrency:1;",
        );
        assert_eq!(
            parsed[&key("orderPlaced", "email")].rate,
            Some(Rate::per_second(10).with_burst(2))
        );
        assert!(parsed[&key("orderPlaced", "audit")].is_none());
        assert_eq!(
            parsed[&key("shop.order.placed", "audit")].concurrency,
            Some(1)
        );
        assert!(overrides("").is_empty());
        assert!(overrides(" ; ").is_empty());
    }

    #[test]
    fn a_wrong_worker_limits_entry_is_named_with_what_is_wrong_and_the_form_expected() {
        for (text, entry, says) in [
            ("orderPlaced.email", "orderPlaced.email", "has no `=`"),
            (
                "email=rate:10/s",
                "email=rate:10/s",
                "does not name a listener as <event>.<listener>: `email`",
            ),
            (
                ".email=rate:10/s",
                ".email=rate:10/s",
                "does not name a listener",
            ),
            ("a.b=", "a.b=", "names no limit (write `none`"),
            ("a.b=rate:10/x", "a.b=rate:10/x", "`x` is not a period"),
            (
                "a.b=concurrency:0",
                "a.b=concurrency:0",
                "`concurrency:0`: `0` is not a whole number of at least 1",
            ),
            (
                "a.b=concurrency",
                "a.b=concurrency",
                "`concurrency` is not a limit: it needs a name and a value",
            ),
            (
                "a.b=speed:3",
                "a.b=speed:3",
                "`speed` is not a limit; the limits are concurrency, rate and burst",
            ),
            ("a.b=burst:3", "a.b=burst:3", "`burst` needs a rate"),
            (
                "a.b=rate:1/s,rate:2/s",
                "a.b=rate:1/s,rate:2/s",
                "`rate` is given twice",
            ),
            (
                "a.b=rate:1/s;x.y=none;a.b=none",
                "a.b=none",
                "names `a.b` again",
            ),
        ] {
            let err = parse_overrides(text).unwrap_err();
            assert_eq!(err.entry, entry, "{text}");
            let message = err.to_string();
            assert!(
                message.starts_with(&format!("WORKER_LIMITS: the entry `{entry}` ")),
                "{message}"
            );
            assert!(message.contains(says), "{text}: {message}");
            assert!(
                message
                    .contains("expected <event>.<listener>=concurrency:N,rate:N/s|N/m|N/h,burst:N"),
                "{message}"
            );
        }
    }

    #[test]
    fn limits_write_the_form_worker_limits_reads() {
        for text in [
            "none",
            "concurrency:5",
            "rate:10/s",
            "concurrency:5,rate:10/s,burst:10",
        ] {
            let limits: Limits = text.parse().unwrap();
            assert_eq!(limits.to_string(), text);
        }
    }

    #[test]
    fn the_metrics_are_exported_under_their_names() {
        let metrics = LimitMetrics::default();
        let mut registry = Registry::default();
        metrics.register(registry.sub_registry_with_prefix("outbox"));
        let labels = LimitLabels {
            event: "orderPlaced".into(),
            listener: "email".into(),
            limit: "rate".into(),
        };
        metrics.deferred.get_or_create(&labels).inc();
        metrics.waited.get_or_create(&labels).observe(0.25);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(
                r#"outbox_listener_limit_deferred_total{event="orderPlaced",listener="email",limit="rate"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"outbox_listener_limit_wait_seconds_count{event="orderPlaced",listener="email",limit="rate"} 1"#
            ),
            "{text}"
        );
    }

    #[test]
    fn a_run_is_known_by_its_queue_and_task_id() {
        assert_eq!(member("default", "abc"), r#"["default","abc"]"#);
        assert_ne!(member("a:b", "c"), member("a", "b:c"));
    }
}
