//! The scheduler: events dispatched, and jobs run, on every tick of a
//! schedule, exactly once per tick however many worker replicas run.
//!
//! - The schedules are registered in `src/schedules/` (`gpkit add
//!   schedule`): each implements [`ScheduledEvent`] or [`ScheduledJob`].
//! - One replica at a time leads: it holds a lease on Valkey (`lease`).
//!   Only the leader enqueues ticks; the others wait to take over.
//! - Every tick has a deterministic id, a UUIDv5 of the service, the
//!   schedule's name and the tick's time (`Tick::id_of`), the same on
//!   every replica (`spec` computes the same tick times everywhere). Two
//!   replicas that both believe they lead (a paused process, a partition)
//!   enqueue the same ids, and the second enqueue is a no-op:
//!   - an event tick is inserted into the outbox with the tick id as its
//!     event id, `ON CONFLICT (event_id) DO NOTHING`; the relay then
//!     publishes it as any event, so listeners get the usual envelope;
//!   - a job tick is the asynq task `job:<name>` with the tick id as its
//!     task id, which the queue refuses to hold twice.
//!
//!   Ids deduplicate while the outbox row (`OUTBOX_RETENTION`) or the
//!   completed task (`OUTBOX_TASK_RETENTION`) is kept.
//! - Ticks missed while no replica led (downtime, a dead leader's lease
//!   running out) are skipped, unless the schedule asks to catch up: a new
//!   leader then enqueues up to that many of the latest ticks after the last
//!   one enqueued (`progress`), each under its own id (those already
//!   enqueued are no-ops). A schedule that never ticked catches up on
//!   nothing.
//! - An event tick wakes the relay of this worker (and, with
//!   `OUTBOX_WAKE=valkey`, of the others), as a committed event does.
//! - The leader writes the schedules and each tick it enqueued where
//!   asynqmon's Schedulers page reads them (`history`).

pub(crate) mod history;
pub(crate) mod lease;
pub(crate) mod progress;
pub(crate) mod spec;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::join_all;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use self::lease::{Acquired, Lease};
use self::progress::Progress;
use self::spec::Spec;
use crate::outbox::Event;
use crate::outbox::relay::{MAX_RETRY, TASK_TIMEOUT};
use crate::outbox::wake::Wake;
use crate::outbox::{Envelope, Metadata, Store};
use crate::queue::{Client, Consumer, EnqueueOutcome, HandlerError, NewTask, Task};

/// `schedule="nightly_report"`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ScheduleLabels {
    /// The schedule's name.
    pub(crate) schedule: String,
}

/// The scheduler's instruments. Cloning shares them.
#[derive(Debug, Clone, Default)]
pub(crate) struct SchedulerMetrics {
    /// Ticks this replica enqueued as new, by schedule.
    pub(crate) ticks: Family<ScheduleLabels, Counter>,
    /// 1 while this replica leads, else 0.
    pub(crate) leader: Gauge,
}

/// The prefix of a job's task type: `job:<name>`.
pub(crate) const JOB_TASK_PREFIX: &str = "job:";

/// One tick of a schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tick {
    /// The schedule's name.
    pub schedule: String,
    /// The tick's id: the event id of an event tick, the task id of a job
    /// tick. The same on every replica.
    pub id: Uuid,
    /// When the tick was due.
    pub at: DateTime<Utc>,
}

impl Tick {
    /// The tick of `schedule` due `at`.
    pub fn new(schedule: &str, at: DateTime<Utc>) -> Self {
        Self {
            schedule: schedule.to_string(),
            id: Self::id_of(schedule, at),
            at,
        }
    }

    /// UUIDv5 of `<service>/<schedule>@<unix seconds>`.
    pub(crate) fn id_of(schedule: &str, at: DateTime<Utc>) -> Uuid {
        let name = format!("{}/{schedule}@{}", env!("CARGO_PKG_NAME"), at.timestamp());
        Uuid::new_v5(&Uuid::NAMESPACE_OID, name.as_bytes())
    }
}

/// A schedule that dispatches an event on every tick.
pub trait ScheduledEvent: Send + Sync + 'static {
    /// The event it dispatches.
    type Event: Event;
    /// The schedule's name.
    const NAME: &'static str;
    /// When it ticks: a cron spec, `@hourly` ..., or `@every <duration>`.
    const CRON: &'static str;
    /// The IANA time zone `CRON` is read in.
    const TIME_ZONE: &'static str;
    /// How many missed ticks a new leader enqueues (0: none).
    const CATCH_UP: u32;

    /// The event of `tick`.
    fn build(&self, tick: &Tick) -> Self::Event;
}

/// A schedule that runs a job (the task `job:<name>`) on every tick.
pub trait ScheduledJob: Send + Sync + 'static {
    /// The schedule's name.
    const NAME: &'static str;
    /// When it ticks: a cron spec, `@hourly` ..., or `@every <duration>`.
    const CRON: &'static str;
    /// The IANA time zone `CRON` is read in.
    const TIME_ZONE: &'static str;
    /// How many missed ticks a new leader enqueues (0: none).
    const CATCH_UP: u32;

    /// Runs the job for one tick. It runs in a task, retried on error, and
    /// may run more than once for a tick (after a crash): make it
    /// idempotent on `ctx.tick.id`.
    fn run(&self, ctx: JobContext) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// What a job gets.
#[derive(Debug, Clone)]
pub struct JobContext {
    /// The tick the job runs for.
    pub tick: Tick,
    /// The database, for jobs that read or write.
    pub pool: PgPool,
}

type BuildEvent = Box<dyn Fn(&Tick) -> Result<serde_json::Value, serde_json::Error> + Send + Sync>;
type RunJob = Arc<
    dyn Fn(JobContext) -> Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>> + Send + Sync,
>;

/// One registered schedule.
pub(crate) struct Entry {
    /// The schedule's name, unique among the service's schedules.
    pub(crate) name: &'static str,
    /// When it ticks: a cron expression.
    pub(crate) cron: &'static str,
    pub(crate) time_zone: &'static str,
    /// How many missed ticks a new leader enqueues (0: none).
    pub(crate) catch_up: u32,
    what: What,
}

enum What {
    Event {
        name: &'static str,
        build: BuildEvent,
    },
    Job(RunJob),
}

impl Entry {
    /// Whether its ticks are events, which go through the outbox.
    fn is_event(&self) -> bool {
        matches!(self.what, What::Event { .. })
    }

    /// The task type of the ticks: `event:<name>` or `job:<name>`.
    pub(crate) fn task_type(&self) -> String {
        match &self.what {
            What::Event { name, .. } => crate::outbox::relay::event_task_type(name),
            What::Job(_) => format!("{JOB_TASK_PREFIX}{}", self.name),
        }
    }
}

/// The service's schedules, registered by the service (`src/schedules/`).
#[derive(Default)]
pub struct Schedules {
    entries: Vec<Entry>,
}

impl Schedules {
    /// No schedules.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a schedule that dispatches an event.
    pub fn event<S: ScheduledEvent>(&mut self, schedule: S) {
        self.entries.push(Entry {
            name: S::NAME,
            cron: S::CRON,
            time_zone: S::TIME_ZONE,
            catch_up: S::CATCH_UP,
            what: What::Event {
                name: <S::Event as Event>::NAME,
                build: Box::new(move |tick| serde_json::to_value(schedule.build(tick))),
            },
        });
    }

    /// Registers a schedule that runs a job.
    pub fn job<S: ScheduledJob>(&mut self, schedule: S) {
        let schedule = Arc::new(schedule);
        self.entries.push(Entry {
            name: S::NAME,
            cron: S::CRON,
            time_zone: S::TIME_ZONE,
            catch_up: S::CATCH_UP,
            what: What::Job(Arc::new(move |ctx| {
                let schedule = Arc::clone(&schedule);
                Box::pin(async move { schedule.run(ctx).await })
            })),
        });
    }

    /// Every registered schedule, in registration order.
    pub(crate) fn all(&self) -> &[Entry] {
        &self.entries
    }

    /// Parses every schedule's spec and zone: the worker refuses to start
    /// on a bad one (or a name registered twice), naming it.
    pub(crate) fn specs(&self) -> anyhow::Result<Vec<Spec>> {
        let mut names = std::collections::BTreeSet::new();
        self.entries
            .iter()
            .map(|entry| {
                anyhow::ensure!(
                    names.insert(entry.name),
                    "the schedule `{}` is registered twice",
                    entry.name
                );
                Spec::parse(entry.cron, entry.time_zone)
                    .map_err(|err| anyhow::anyhow!("schedule `{}`: {err:#}", entry.name))
            })
            .collect()
    }

    /// Registers on `consumer` the handler of each job's `job:<name>` task.
    pub(crate) fn handle_jobs(&self, consumer: &mut Consumer, pool: &PgPool) {
        for entry in &self.entries {
            let What::Job(run) = &entry.what else {
                continue;
            };
            let (run, pool, name) = (Arc::clone(run), pool.clone(), entry.name);
            consumer.handle(entry.task_type(), move |task| {
                let (run, pool) = (Arc::clone(&run), pool.clone());
                async move { run_job(name, &run, pool, task).await }
            });
        }
    }
}

/// The payload of a job's task.
#[derive(Debug, Serialize, Deserialize)]
struct JobPayload {
    schedule: String,
    tick: DateTime<Utc>,
}

async fn run_job(name: &str, run: &RunJob, pool: PgPool, task: Task) -> Result<(), HandlerError> {
    let payload: JobPayload = serde_json::from_slice(&task.payload).map_err(|err| {
        HandlerError::skip_retry(anyhow::anyhow!(
            "task {} is not a tick of `{name}`: {err}",
            task.id
        ))
    })?;
    let tick = Tick {
        schedule: payload.schedule,
        id: task
            .id
            .parse()
            .unwrap_or_else(|_| Tick::id_of(name, payload.tick)),
        at: payload.tick,
    };
    let span = tracing::info_span!("job", schedule = name, tick = %tick.at, tick_id = %tick.id);
    tracing::Instrument::instrument(run(JobContext { tick, pool }), span)
        .await
        .map_err(HandlerError::from)
}

/// Where and how the leader enqueues ticks.
#[derive(Debug, Clone)]
pub(crate) struct TickOptions {
    /// The queue of job tasks.
    pub(crate) job_queue: String,
    /// How long a completed job task keeps deduplicating its id.
    pub(crate) retention: Duration,
}

/// Enqueues one tick: an event into the outbox, a job into the queue.
/// Returns whether it was new (false: already enqueued, by this replica or
/// another).
pub(crate) async fn enqueue_tick(
    entry: &Entry,
    tick: &Tick,
    pool: &PgPool,
    queue: &Client,
    options: &TickOptions,
) -> anyhow::Result<bool> {
    match &entry.what {
        What::Event { .. } => dispatch_event_tick(entry, tick, pool).await,
        What::Job(_) => {
            let payload = serde_json::to_vec(&JobPayload {
                schedule: tick.schedule.clone(),
                tick: tick.at,
            })?;
            let task = NewTask::new(entry.task_type(), tick.id.to_string(), payload)
                .queue(options.job_queue.as_str())
                .max_retry(MAX_RETRY)
                .timeout(TASK_TIMEOUT)
                .retention(options.retention);
            let outcome = queue.enqueue(&[task]).await?.pop().unwrap_or_else(|| {
                Err(crate::queue::QueueError::UnexpectedReply("no reply".into()))
            })?;
            Ok(outcome == EnqueueOutcome::Enqueued)
        }
    }
}

/// Inserts the event of `tick` into the outbox under the tick's id, unless
/// it is there already; returns whether it was new. Not an event schedule:
/// `Ok(false)`.
pub(crate) async fn dispatch_event_tick(
    entry: &Entry,
    tick: &Tick,
    pool: &PgPool,
) -> anyhow::Result<bool> {
    let What::Event { name, build } = &entry.what else {
        return Ok(false);
    };
    // Each tick starts a trace of its own.
    let span = crate::spans::create(name, &tick.id);
    let mut metadata = Metadata::new();
    crate::trace_context::start(&span, None).inject(&mut metadata);
    let envelope = Envelope {
        id: tick.id,
        name: (*name).to_string(),
        payload: build(tick)?,
        metadata,
        // The row's creation time, as for a dispatched event.
        occurred_at: Utc::now(),
    };
    let insert = Store.insert_unless_present(pool, &envelope);
    Ok(tracing::Instrument::instrument(insert, span).await?)
}

/// Runs the job of `tick` as the worker's `job:<name>` handler runs its
/// task, from the payload the leader would enqueue. Not a job schedule:
/// `Ok(())`, nothing run.
#[cfg(feature = "testing")]
pub(crate) async fn run_job_tick(
    entry: &Entry,
    tick: &Tick,
    pool: PgPool,
) -> Result<(), HandlerError> {
    let What::Job(run) = &entry.what else {
        return Ok(());
    };
    let payload = serde_json::to_vec(&JobPayload {
        schedule: tick.schedule.clone(),
        tick: tick.at,
    })?;
    let task = Task {
        task_type: entry.task_type(),
        id: tick.id.to_string(),
        payload,
        headers: Default::default(),
        queue: crate::queue::DEFAULT_QUEUE.to_string(),
        retried: 0,
        failed_before: false,
        max_retry: MAX_RETRY,
    };
    run_job(entry.name, run, pool, task).await
}

/// How long the leader waits before it tries a tick that failed to enqueue
/// (Postgres or Valkey unreachable) again.
const RETRY_PAUSE: Duration = Duration::from_secs(1);

/// While this replica leads: when its lease runs out unless renewed, by
/// this process's clock. The renewal moves it on; the ticks are enqueued
/// only before it.
type Held = watch::Receiver<Instant>;

/// Whether the lease `held` is still this replica's by its own clock.
fn holds(held: &Held) -> bool {
    Instant::now() < *held.borrow()
}

/// The scheduler of one worker replica.
pub(crate) struct Scheduler {
    schedules: Arc<Schedules>,
    specs: Vec<Spec>,
    lease: Lease,
    progress: Progress,
    pool: PgPool,
    queue: Client,
    wake: Wake,
    options: TickOptions,
    metrics: SchedulerMetrics,
}

impl Scheduler {
    /// Checks every schedule's spec (see [`Schedules::specs`]). `wake`
    /// wakes the relays when an event tick is in the outbox.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        schedules: Arc<Schedules>,
        lease: Lease,
        progress: Progress,
        pool: PgPool,
        queue: Client,
        wake: Wake,
        options: TickOptions,
        metrics: SchedulerMetrics,
    ) -> anyhow::Result<Self> {
        let specs = schedules.specs()?;
        // Each schedule's count is exported, at 0, from the start.
        for entry in schedules.all() {
            drop(metrics.ticks.get_or_create(&ScheduleLabels {
                schedule: entry.name.to_string(),
            }));
        }
        metrics.leader.set(0);
        Ok(Self {
            schedules,
            specs,
            lease,
            progress,
            pool,
            queue,
            wake,
            options,
            metrics,
        })
    }

    /// Takes part in the election and, while leading, enqueues every due
    /// tick, until `stop` is cancelled; the leader then gives the lease up.
    pub(crate) async fn run(self, stop: CancellationToken) {
        let ttl = self.lease.ttl();
        loop {
            let sent = Instant::now();
            let wait = match self.lease.acquire().await {
                Ok(Acquired::Leading) => {
                    self.lead(sent + ttl, &stop).await;
                    if stop.is_cancelled() {
                        return;
                    }
                    Duration::ZERO
                }
                // Try again the moment the lease runs out.
                Ok(Acquired::HeldFor(left)) => (left + Duration::from_millis(5)).min(ttl / 3),
                Err(err) => {
                    tracing::warn!(error = %err, "scheduler: cannot reach Valkey for the lease");
                    (ttl / 3).min(Duration::from_secs(1))
                }
            };
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Leads on the lease taken, which runs out at `until` unless renewed:
    /// renews it on its own, so that no enqueue, however long it waits
    /// (Postgres behind a lock), delays a renewal, and meanwhile enqueues
    /// the ticks. Returns when the lease is lost, or when `stop` is
    /// cancelled, after giving the lease up.
    async fn lead(&self, until: Instant, stop: &CancellationToken) {
        tracing::info!(lease_ttl = ?self.lease.ttl(), "scheduler: this replica leads");
        self.metrics.leader.set(1);
        let (moved_on, held) = watch::channel(until);
        tokio::select! {
            () = self.keep_lease(moved_on) => {}
            () = self.tick(&held, stop) => {}
        }
        self.metrics.leader.set(0);
        if stop.is_cancelled() && holds(&held) {
            if let Err(err) = self.lease.release().await {
                tracing::warn!(error = %err, "scheduler: failed to give the lease up");
            }
            history::clear_entries(&self.queue).await;
        }
    }

    /// Renews the lease every third of its TTL (sooner after a renewal
    /// failed), moving `until` on and writing the schedules for asynqmon
    /// after each renewal. Returns when the lease is lost: another replica
    /// holds it, or it ran out before a renewal got through.
    async fn keep_lease(&self, until: watch::Sender<Instant>) {
        let ttl = self.lease.ttl();
        history::write_entries(&self.queue, &self.schedules, &self.specs, ttl).await;
        let mut renew_at = *until.borrow() - ttl + ttl / 3;
        loop {
            let valid_until = *until.borrow();
            tokio::time::sleep_until(renew_at.min(valid_until)).await;
            if Instant::now() >= valid_until {
                tracing::warn!("scheduler: the lease ran out before it was renewed");
                return;
            }
            let sent = Instant::now();
            // A renewal that answers after the lease ran out keeps nothing.
            match tokio::time::timeout_at(valid_until, self.lease.renew()).await {
                Ok(Ok(true)) => {
                    until.send_replace(sent + ttl);
                    renew_at = sent + ttl / 3;
                    history::write_entries(&self.queue, &self.schedules, &self.specs, ttl).await;
                }
                Ok(Ok(false)) => {
                    tracing::warn!("scheduler: lost the lease to another replica");
                    return;
                }
                Ok(Err(err)) => {
                    tracing::warn!(error = %err, "scheduler: failed to renew the lease");
                    renew_at = Instant::now() + (ttl / 10).min(Duration::from_secs(1));
                }
                Err(_ran_out) => {}
            }
        }
    }

    /// While the lease is `held`: the catch-up, then each schedule's ticks
    /// as they fall due, until `stop` is cancelled.
    async fn tick(&self, held: &Held, stop: &CancellationToken) {
        let started = Utc::now();
        self.catch_up(held).await;
        // Each schedule on its own: one whose enqueue waits (an event tick,
        // Postgres behind a lock) holds none of the others back.
        join_all(
            self.schedules
                .all()
                .iter()
                .zip(&self.specs)
                .map(|(entry, spec)| self.tick_schedule(entry, spec, started, held, stop)),
        )
        .await;
    }

    /// `entry`'s ticks as they fall due after `handled`, until `stop` is
    /// cancelled. Once the lease is no longer `held` by this process's
    /// clock it enqueues nothing more and waits for [`Self::keep_lease`] to
    /// end the lead.
    async fn tick_schedule(
        &self,
        entry: &Entry,
        spec: &Spec,
        mut handled: DateTime<Utc>,
        held: &Held,
        stop: &CancellationToken,
    ) {
        loop {
            let wait = match spec.next_after(handled) {
                Some(tick_at) if tick_at <= Utc::now() => {
                    // Never enqueue on a lease this process cannot vouch for.
                    if !holds(held) {
                        return std::future::pending().await;
                    }
                    if self.enqueue(entry, &Tick::new(entry.name, tick_at)).await {
                        handled = tick_at;
                        continue;
                    }
                    // Tried again after a pause.
                    RETRY_PAUSE
                }
                Some(tick_at) => (tick_at - Utc::now()).to_std().unwrap_or(Duration::ZERO),
                None => self.lease.ttl(),
            };
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// A new leader's catch-up: up to `CATCH_UP` of each schedule's latest
    /// ticks, after the last one recorded and no older than their ids
    /// deduplicate. When the record cannot be read, the latest ticks are
    /// enqueued (those already enqueued are no-ops).
    async fn catch_up(&self, held: &Held) {
        if self.schedules.all().iter().all(|entry| entry.catch_up == 0) {
            return;
        }
        let now = Utc::now();
        let oldest = now - chrono::Duration::from_std(self.options.retention).unwrap_or_default();
        let recorded = match self.progress.read().await {
            Ok(recorded) => Some(recorded),
            Err(err) => {
                tracing::warn!(
                    error = %err,
                    "scheduler: cannot read the last ticks enqueued; catching up on the latest ticks"
                );
                None
            }
        };
        for (entry, spec) in self.schedules.all().iter().zip(&self.specs) {
            if entry.catch_up == 0 {
                continue;
            }
            let after = match recorded.as_ref().map(|recorded| recorded.get(entry.name)) {
                Some(Some(last)) => (*last).max(oldest),
                Some(None) => {
                    tracing::info!(
                        schedule = entry.name,
                        "scheduler: no tick enqueued before, nothing to catch up on"
                    );
                    continue;
                }
                None => oldest,
            };
            for tick_at in spec.latest(now, entry.catch_up) {
                if !holds(held) {
                    return;
                }
                if tick_at > after {
                    self.enqueue(entry, &Tick::new(entry.name, tick_at)).await;
                }
            }
        }
    }

    /// Enqueues `tick`, records it (for the next leader, and for asynqmon
    /// when new) and wakes the relays for a new event; false on failure.
    async fn enqueue(&self, entry: &Entry, tick: &Tick) -> bool {
        match enqueue_tick(entry, tick, &self.pool, &self.queue, &self.options).await {
            Ok(new) => {
                if new {
                    self.metrics
                        .ticks
                        .get_or_create(&ScheduleLabels {
                            schedule: entry.name.to_string(),
                        })
                        .inc();
                }
                if new && entry.is_event() {
                    self.wake.signal();
                }
                tracing::info!(
                    schedule = entry.name,
                    tick = %tick.at,
                    tick_id = %tick.id,
                    new,
                    "scheduler: tick enqueued"
                );
                if let Err(err) = self.progress.record(entry.name, tick.at).await {
                    tracing::warn!(
                        schedule = entry.name,
                        error = %err,
                        "scheduler: failed to record the tick; a new leader may enqueue it again (a no-op)"
                    );
                }
                if new {
                    history::record(&self.queue, entry, tick).await;
                }
                true
            }
            Err(err) => {
                tracing::warn!(
                    schedule = entry.name,
                    tick = %tick.at,
                    error = format!("{err:#}"),
                    "scheduler: failed to enqueue a tick"
                );
                false
            }
        }
    }
}
