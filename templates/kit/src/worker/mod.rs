//! The worker chassis: one call, [`run`], starts everything a worker
//! process does and stops it cleanly.
//!
//! - the consumer, with the event fan-out and every listener registered by
//!   task type;
//! - the handlers of the schedules' jobs, and the scheduler, which enqueues
//!   their ticks while this replica leads (`SCHEDULER_ENABLED`; see
//!   `crate::scheduler`);
//! - the outbox relay (woken by published wake-ups with `OUTBOX_WAKE=valkey`)
//!   and the cleanup loops (published events, expired inbox records);
//! - the metrics endpoint with the probes `/healthz` and `/readyz`, and the
//!   backlog gauges.
//!
//! At start-up it checks that Postgres and Valkey answer and stops with an
//! error naming the server and the reason when one does not (an
//! orchestrator restarts it); it warns when Valkey persists nothing.
//!
//! On shutdown (SIGTERM or Ctrl-C in the binary) the relay stops claiming
//! and finishes or rolls back the batch in hand; running handlers get
//! `WORKER_SHUTDOWN_TIMEOUT` to finish and unfinished tasks go back to the
//! head of their queue; the database pool is closed, so no Postgres session
//! (and no lock) outlives the process. A loop stuck on a hung database or
//! Valkey call is dropped within a second.

pub(crate) mod before_archive;
pub(crate) mod cancellations;
pub(crate) mod failures;
pub(crate) mod health;
pub(crate) mod inbox;
pub(crate) mod limits;
mod listener_context;
mod listener_error;
pub(crate) mod listener_handler;
mod listener_options;
pub mod listeners;
pub(crate) mod metrics;
pub(crate) mod ordering;
#[cfg(feature = "seaorm")]
mod orm_context;
pub(crate) mod persistence;
pub(crate) mod queue_metrics;
pub(crate) mod retry_policy;
pub(crate) mod retry_settings;
pub(crate) mod task_names;

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use uuid::Uuid;

use self::health::Readiness;
use self::limits::{LimitMetrics, Limiter};
use self::listener_handler::ListenerHandler;
use self::listeners::{Listener, Listeners, OnFailure};
use self::metrics::{ListenerMetrics, Metrics};
use self::ordering::{ChainRun, EventRuns, Ordering};
use self::task_names::listener_task_id;
use crate::config::{Config, OutboxConfig, WakeMode, WorkerConfig};
use crate::database;
use crate::outbox::order::Place;
use crate::outbox::relay::{EVENT_TASK_PREFIX, Relay};
use crate::outbox::{cleanup, wake};
use crate::queue::{Client, Consumer, ConsumerOptions, HandlerError, NewTask, Task};
use crate::scheduler::lease::Lease;
use crate::scheduler::progress::Progress;
use crate::scheduler::{Scheduler, Schedules, TickOptions};

/// Runs the worker until `shutdown` completes: it wires the parts (the
/// relay, the consumer and its listeners, the chains of ordered listeners,
/// the scheduler, the cleanups, the metrics endpoint), each built from its
/// own section of `config`.
pub async fn run(
    config: &Config,
    listeners: Listeners,
    schedules: Schedules,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let metrics = Metrics::new();
    schedules
        .specs()
        .context("a schedule in src/schedules/ is invalid")?;
    let (pool, queue) = connect(config).await?;
    persistence::warn_if_off(&queue).await;
    let readiness = Readiness::new(
        pool.clone(),
        queue.clone(),
        metrics.relay.clone(),
        &config.outbox,
    );
    let stop = CancellationToken::new();
    let relay = Relay::new(
        pool.clone(),
        queue.clone(),
        &config.outbox,
        metrics.relay.clone(),
    );
    let wake = relay_wake(&config.outbox, &queue, &relay);
    let transactor = database::Transactor::new(pool.clone()).after_events({
        let wake = wake.clone();
        move || wake.signal()
    });

    let mut listeners = listeners;
    listeners
        .override_limits(&limits::overrides_from_env().context("WORKER_LIMITS cannot be read")?)?;
    listeners.override_policies(
        &retry_settings::overrides_from_env().context("WORKER_RETRIES cannot be read")?,
    )?;
    let chains = Ordering::of_service(pool.clone(), queue.clone(), config)
        .with_policies(listeners.task_policies());
    let ordered = listeners.ordered();
    let service = prepare_chains(&chains, &pool, &config.worker, &ordered).await?;
    let mut consumer = consumer(config, &chains, transactor, Arc::new(listeners), &metrics);
    schedules.handle_jobs(&mut consumer, &pool);
    let scheduler = scheduler(config, schedules, &pool, &queue, wake, &metrics)?;
    let metrics_listener = tokio::net::TcpListener::bind(config.worker.metrics_addr)
        .await
        .with_context(|| format!("failed to listen on {}", config.worker.metrics_addr))?;
    tracing::info!(
        metrics = %metrics_listener.local_addr()?,
        queues = %config.worker.queues,
        outbox_queues = %config.outbox.queues,
        concurrency = config.worker.concurrency,
        "worker started"
    );
    warn_if_events_unserved(config);

    let mut tasks = JoinSet::new();
    if let Some(scheduler) = scheduler {
        tasks.spawn(scheduler.run(stop.clone()));
    }
    if config.outbox.wake == WakeMode::Valkey {
        tasks.spawn(wake::forward_published(
            queue.clone(),
            relay.waker(),
            stop.clone(),
        ));
    }
    tasks.spawn(relay.run(stop.clone()));
    spawn_cleanups(&mut tasks, config, &pool, &chains, &stop);
    tasks.spawn(ordering::look_after_chains(
        chains.clone(),
        ordered,
        service,
        stop.clone(),
    ));
    tasks.spawn(inbox::run_cleanup(
        pool.clone(),
        config.worker.inbox_retention,
        config.outbox.cleanup_interval,
        stop.clone(),
    ));
    tasks.spawn(metrics::watch_backlog(
        pool.clone(),
        queue.clone(),
        chains,
        watched_queues(config),
        metrics.clone(),
        stop.clone(),
    ));
    let metrics_server = axum::serve(metrics_listener, metrics.router().merge(readiness.router()))
        .with_graceful_shutdown(stop.clone().cancelled_owned());
    tasks.spawn(async move {
        if let Err(err) = metrics_server.await {
            tracing::error!(error = %err, "metrics endpoint failed");
        }
    });
    let consuming = tokio::spawn(consumer.run(stop.clone().cancelled_owned()));

    shutdown.await;
    tracing::info!("shutting down");
    stop.cancel();
    let (consumed, ()) = tokio::join!(consuming, stop_loops(&mut tasks));
    if tokio::time::timeout(CLOSE_GRACE, pool.close())
        .await
        .is_err()
    {
        tracing::warn!("Postgres did not answer at shutdown; its sessions end with the process");
    }
    consumed.context("the consumer panicked")??;
    tracing::info!("worker stopped");
    Ok(())
}

/// Postgres (checked reachable, then a lazy pool) and Valkey, as the worker
/// needs them at start-up; with `OUTBOX_WAKE=valkey`, the consumers of
/// other processes wake at once for what this one enqueues.
async fn connect(config: &Config) -> anyhow::Result<(sqlx::PgPool, Client)> {
    database::check_reachable(&config.database)
        .await
        .context("the worker needs Postgres at start-up")?;
    let pool = database::connect_lazy(&config.database);
    let queue = Client::from_config(&config.valkey)
        .await
        .context("the worker needs Valkey at start-up")?;
    queue
        .enqueued()
        .set_publish(config.outbox.wake == WakeMode::Valkey);
    Ok((pool, queue))
}

/// What the events listeners store in `ctx.once` wake: this worker's relay
/// at once, and with `OUTBOX_WAKE=valkey` the relays of the other workers
/// too (a commit that stored none wakes nothing).
fn relay_wake(outbox: &OutboxConfig, queue: &Client, relay: &Relay) -> wake::Wake {
    match outbox.wake {
        WakeMode::Off => wake::Wake::local(relay.waker()),
        WakeMode::Valkey => wake::Wake::publishing(queue.clone()).and_local(relay.waker()),
    }
}

/// Readies the chains of ordered listeners before the consumer runs: the
/// worker's queues owned by its service, its listeners' chains claimed,
/// no foreign consumer on its queues, the chains of older layouts moved
/// (a head in the queue must find its chain), and the chains of listeners
/// it does not order reported. Returns the service's id.
async fn prepare_chains(
    chains: &Ordering,
    pool: &sqlx::PgPool,
    worker: &WorkerConfig,
    ordered: &ordering::Ordered,
) -> anyhow::Result<String> {
    let service = ordering::owner::service_id(pool, worker.service_id.as_deref())
        .await
        .context("the worker needs its service's id")?;
    if !ordered.names.is_empty() {
        // A queue of another service's would mix their events and chains.
        chains.own_queues(&service).await?;
        // Its listeners' chains are not another worker's to release.
        chains.claim_listeners(ordered).await?;
        ordering::foreign::refuse_foreign_consumers(&chains.queue_client(), chains.queues())
            .await?;
    }
    chains
        .move_from_postgres()
        .await
        .context("cannot move the chains of ordered listeners from Postgres to Valkey")?;
    chains
        .move_from_database_namespace()
        .await
        .context("cannot move the chains of ordered listeners of template set 22")?;
    for (queue, listener, keys) in chains.orphans(ordered).await? {
        tracing::warn!(
            queue,
            listener,
            keys,
            "a listener that this worker does not order has chains of ordered runs: they are \
             released (their runs queued at once) an hour after a worker first saw this, unless a \
             worker that orders it runs"
        );
    }
    Ok(service)
}

/// The scheduler of `schedules`, if it is enabled and there are any: its
/// jobs go to the worker's first queue, and its event ticks wake the
/// relays as committed events do.
fn scheduler(
    config: &Config,
    schedules: Schedules,
    pool: &sqlx::PgPool,
    queue: &Client,
    wake: wake::Wake,
    metrics: &Metrics,
) -> anyhow::Result<Option<Scheduler>> {
    if !config.scheduler.enabled || schedules.all().is_empty() {
        return Ok(None);
    }
    let lease = Lease::new(
        queue.connection(),
        env!("CARGO_PKG_NAME"),
        config.scheduler.lease_ttl,
    );
    let options = TickOptions {
        job_queue: config
            .worker
            .queues
            .names()
            .next()
            .unwrap_or(crate::queue::DEFAULT_QUEUE)
            .to_string(),
        retention: config.outbox.task_retention,
    };
    Ok(Some(Scheduler::new(
        Arc::new(schedules),
        lease,
        Progress::new(queue.connection(), env!("CARGO_PKG_NAME")),
        pool.clone(),
        queue.clone(),
        wake,
        options,
        metrics.scheduler.clone(),
    )?))
}

/// Warns when the worker consumes none of the queues its events go to
/// (`OUTBOX_QUEUES`): its listeners then run only if another process of
/// the service consumes them.
fn warn_if_events_unserved(config: &Config) {
    let own_queues: Vec<&str> = config.worker.queues.names().collect();
    if !config
        .outbox
        .queues
        .names()
        .iter()
        .any(|queue| own_queues.contains(&queue.as_str()))
    {
        tracing::warn!(
            outbox_queues = %config.outbox.queues,
            worker_queues = %config.worker.queues,
            "this worker consumes none of the queues its events go to (OUTBOX_QUEUES): \
             its listeners run only if another process of this service consumes them"
        );
    }
}

/// Spawns the cleanups of the outbox, of idle order keys and of expired
/// listener failures, every `OUTBOX_CLEANUP_INTERVAL` until `stop`.
fn spawn_cleanups(
    tasks: &mut JoinSet<()>,
    config: &Config,
    pool: &sqlx::PgPool,
    chains: &Ordering,
    stop: &CancellationToken,
) {
    tasks.spawn(cleanup::run(
        pool.clone(),
        config.outbox.retention,
        config.outbox.cleanup_interval,
        stop.clone(),
    ));
    tasks.spawn({
        let (chains, retention) = (chains.clone(), config.outbox.retention);
        cleanup::every(
            "idle order keys",
            config.outbox.cleanup_interval,
            stop.clone(),
            move || {
                let chains = chains.clone();
                async move { chains.delete_idle(retention).await }
            },
        )
    });
    tasks.spawn({
        let (pool, retention) = (
            pool.clone(),
            config.worker.failure_retention(&config.outbox),
        );
        cleanup::every(
            "expired listener failures",
            config.outbox.cleanup_interval,
            stop.clone(),
            move || {
                let pool = pool.clone();
                async move {
                    let failures = failures::delete_expired(&pool, retention).await?;
                    Ok(failures + cancellations::delete_expired(&pool, retention).await?)
                }
            },
        )
    });
}

/// The queues this worker serves or publishes to, for the asynq gauges.
fn watched_queues(config: &Config) -> Vec<String> {
    let mut watched: Vec<String> = config.worker.queues.names().map(str::to_string).collect();
    for queue in config.outbox.queues.names() {
        if !watched.contains(queue) {
            watched.push(queue.clone());
        }
    }
    watched
}

/// How long the loops may take to stop once shutdown began before
/// whatever still waits on a hung call is dropped.
pub(crate) const LOOPS_STOP_GRACE: Duration = Duration::from_millis(800);
/// How long closing the pool may take: it waits for the connections in
/// use, which a hung Postgres never gives back.
pub(crate) const CLOSE_GRACE: Duration = Duration::from_millis(300);

/// Waits for `tasks` to stop, at most [`LOOPS_STOP_GRACE`]; then aborts the rest.
async fn stop_loops(tasks: &mut JoinSet<()>) {
    let stopped = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(LOOPS_STOP_GRACE, stopped)
        .await
        .is_err()
    {
        tracing::warn!(
            loops = tasks.len(),
            "stopping loops stuck on a hung database or Valkey call"
        );
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
}

/// The consumer with the fan-out handler for every `event:` task and a
/// handler per listener.
fn consumer(
    config: &Config,
    ordering: &Ordering,
    transactor: database::Transactor,
    listeners: Arc<Listeners>,
    metrics: &Metrics,
) -> Consumer {
    let options = ConsumerOptions {
        queues: config.worker.queues.clone(),
        concurrency: config.worker.concurrency,
        shutdown_timeout: config.worker.shutdown_timeout,
        wake_on_published: config.outbox.wake == WakeMode::Valkey,
        ..ConsumerOptions::default()
    };
    let mut consumer = Consumer::new(ordering.queue_client(), options);
    // A listener task is archived only once its failure is recorded.
    before_archive::record_before_archive(
        &mut consumer,
        transactor.pool().clone(),
        listeners.failure_hook(),
        Some(ordered_failures(&listeners, ordering)),
    );
    // A cancelled listener run is recorded, not retried.
    cancellations::record_on_cancel(&mut consumer, transactor.pool().clone(), ordering.clone());
    handle_events(
        &mut consumer,
        ordering,
        transactor,
        listeners,
        metrics.listeners.clone(),
        metrics.limits.clone(),
    );
    consumer
}

/// What a run of an ordered listener that failed for good does to its key,
/// by task type (`before_archive::OrderedFailures`).
pub(crate) fn ordered_failures(
    listeners: &Listeners,
    ordering: &Ordering,
) -> before_archive::OrderedFailures {
    let of = |policy: fn(OnFailure) -> bool| {
        listeners
            .all()
            .filter(|listener| listener.ordered().is_some_and(policy))
            .map(Listener::task_type)
            .collect::<HashSet<String>>()
    };
    before_archive::OrderedFailures {
        ordered: of(|_| true),
        moving_on: of(|policy| policy == OnFailure::MoveOn),
        ordering: ordering.clone(),
    }
}

/// Registers on `consumer` the fan-out handler for every `event:` task and
/// a handler per listener ([`ListenerHandler`]); the chains of ordered
/// listeners are `ordering`'s. Each listener run is counted in `metrics`;
/// `ctx.once` runs in `transactor`'s transactions.
pub(crate) fn handle_events(
    consumer: &mut Consumer,
    ordering: &Ordering,
    transactor: database::Transactor,
    listeners: Arc<Listeners>,
    metrics: ListenerMetrics,
    limit_metrics: LimitMetrics,
) {
    // The chains make the runs' tasks with their listeners' policies.
    let ordering = &ordering.clone().with_policies(listeners.task_policies());
    // Every event, with listeners or not, is fanned out (to none, for an
    // event nobody listens to), so no event task is left to fail.
    consumer.handle(EVENT_TASK_PREFIX, {
        let (listeners, ordering) = (Arc::clone(&listeners), ordering.clone());
        move |task| {
            let (listeners, ordering) = (Arc::clone(&listeners), ordering.clone());
            async move { fan_out(&ordering, &listeners, task).await }
        }
    });
    for listener in listeners.all() {
        metrics.register(listener.event(), listener.name());
        // Listeners without limits ask no limiter (and Valkey nothing).
        let limiter = (!listener.limits().is_none()).then(|| {
            limit_metrics.register_listener(listener.event(), listener.name(), listener.limits());
            Limiter::new(
                ordering.queue_client(),
                listener.event(),
                listener.name(),
                listener.limits(),
            )
            .with_metrics(limit_metrics.clone())
        });
        // Go asynq's backoff is the consumer's own.
        let backoff = listener.policy().backoff;
        if !backoff.is_asynq() {
            consumer.retry_delay_of(
                listener.task_type(),
                Arc::new(move |retried| backoff.delay(retried)),
            );
        }
        let handler = ListenerHandler::new(
            listener.clone(),
            transactor.clone(),
            metrics.clone(),
            ordering.clone(),
            limiter,
        );
        consumer.handle(listener.task_type(), move |task| {
            let handler = handler.clone();
            async move { handler.handle(task).await }
        });
    }
}

/// What the fan-out reads of an [`Envelope`]: its id, name and metadata,
/// with the other fields checked for presence (and the time for its form)
/// but not built, since each listener task decodes the envelope again.
#[derive(serde::Deserialize)]
struct EnvelopeHead {
    id: Uuid,
    name: String,
    #[serde(rename = "payload")]
    _payload: serde::de::IgnoredAny,
    #[serde(rename = "occurred_at")]
    _occurred_at: chrono::DateTime<chrono::Utc>,
    #[serde(default)]
    metadata: crate::outbox::Metadata,
}

/// The `event:<name>` handler: one `listener:<name>:<listener>` task per
/// listener, in the event task's queue, with ids derived from the event
/// task's id, so a retried fan-out queues nothing twice (duplicates count as
/// done). The relay's event task has the event id as its id; a replay
/// (`outbox replay`) queues the same envelope under a new task id, and so
/// gets new listener tasks. Each listener task carries the event task's
/// headers, and its listener's retries and timeout. The runs of ordered
/// listeners of a keyed event join their chains instead, in the key's
/// order (module `ordering`).
pub(crate) async fn fan_out(
    ordering: &Ordering,
    listeners: &Listeners,
    mut task: Task,
) -> Result<(), HandlerError> {
    let envelope: EnvelopeHead = serde_json::from_slice(&task.payload).map_err(|err| {
        HandlerError::skip_retry(anyhow::anyhow!(
            "task {} is not an event envelope: {err}",
            task.id
        ))
    })?;
    // A task id that is not a UUID (a foreign producer's) falls back to the
    // event id.
    let namespace = task.id.parse::<Uuid>().unwrap_or(envelope.id);
    let place = Place::of(&envelope.metadata);
    // A recovery of an event the queue ran without it being fanned out
    // here takes the event's turn (`ordering`'s module `stale`).
    let recovered = task.headers.remove(ordering::RECOVERED_HEADER).is_some();
    // The unordered listeners ran a recovered event already. Listeners
    // cancelled before this fan-out (`outbox cancel`) get no task: the
    // enqueue leaves out an id marked so (`cancellations::mark_before`),
    // in the same step as it would make the task.
    let tasks: Vec<NewTask> = listeners
        .of(&envelope.name)
        .iter()
        .filter(|_| !recovered)
        .filter(|listener| place.is_none() || listener.ordered().is_none())
        .map(|listener| {
            let listener_task = NewTask::new(
                listener.task_type(),
                listener_task_id(namespace, listener.name()).to_string(),
                task.payload.clone(),
            );
            listener
                .policy()
                .apply(listener_task)
                .queue(task.queue.as_str())
                .headers(task.headers.clone())
                .retention(ordering.retention())
                .unless_cancelled_before()
        })
        .collect();
    for result in ordering.queue_client().enqueue(&tasks).await? {
        result?;
    }
    let Some(place) = place else {
        return Ok(());
    };
    // Every keyed event takes its turn, with ordered listeners or not, so
    // that the next event of its key does not wait for it.
    let replay = task.id != envelope.id.to_string() && !recovered;
    let mut runs: Vec<ChainRun> = listeners
        .of(&envelope.name)
        .iter()
        .filter(|listener| listener.ordered().is_some())
        .map(|listener| ChainRun {
            listener: listener.name().to_string(),
            task_type: listener.task_type(),
            task_id: listener_task_id(namespace, listener.name()).to_string(),
        })
        .collect();
    // An ordered listener's run joins its chain, not the enqueue that
    // checks the marks: they are read first.
    let ids: Vec<String> = runs.iter().map(|run| run.task_id.clone()).collect();
    let cancelled =
        cancellations::cancelled_before(&ordering.queue_client(), &task.queue, &ids).await?;
    runs.retain(|run| !cancelled.contains(&run.task_id));
    let event = EventRuns {
        event_id: envelope.id,
        queue: task.queue,
        payload: task.payload,
        headers: task.headers,
        runs,
    };
    ordering.fan_out(&place, &event, replay).await
}
