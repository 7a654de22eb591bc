//! The worker's task loop: [`Consumer`] dequeues tasks by queue weight,
//! runs the handler registered for each task type, and moves each task on
//! as a Go asynq server does.
//!
//! - A dequeued task is leased for 30 s; a heartbeat extends the leases of
//!   running tasks every 5 s, so a long handler keeps its task while a
//!   crashed worker's tasks are recovered (retried) about a minute later.
//! - Success: the task is deleted, or kept in `:completed` for its
//!   retention. Failure: retried with Go's default backoff, archived once
//!   its retries are spent. A handler that exceeds the task's timeout, or
//!   panics, has failed; a task already past its deadline when its turn
//!   to run comes fails without running. Its timeout counts from then.
//! - Batches: one dequeue takes up to as many tasks as there are free
//!   takes (see "Taking ahead"; each moved exactly as Go's DEQUEUE moves
//!   one), and successes
//!   are completed in batches (see [`super::completions`]); a dequeue that
//!   finds its tasks taken by another consumer tries again at once, so only
//!   an empty (or paused) queue makes the consumer wait.
//! - Taking ahead: a task whose handler has returned keeps its slot until
//!   Valkey has its completion, but the consumer already dequeues a task
//!   for that slot, which starts the moment the slot is free. So a
//!   consumer holds at most twice `concurrency` tasks (leased, and shown
//!   in asynqmon only once they run), runs at most `concurrency` at a
//!   time, and a task taken ahead waits only for completions on their way,
//!   never for a handler still running. A killed worker has run at most
//!   `concurrency` tasks whose completion was not written (those run
//!   twice); the tasks it took ahead had not started, and run once after
//!   recovery. At shutdown they go back to pending unrun.
//! - Acknowledgements survive a Valkey blip: if the write that moves a
//!   finished task on fails, it is tried again with backoff until the
//!   task's lease runs out; the heartbeat stops extending the lease at the
//!   first failure (as Go's does once the handler returned), so a write
//!   that can never succeed frees its slot at the lease's end and leaves
//!   the task to the recoverer. A task that succeeded is completed once
//!   Valkey answers, not run again.
//! - A task whose stored message does not decode (or whose id is not
//!   UTF-8, which no valid message has) is archived as it is, with an
//!   error logged, and the tasks after it run.
//! - Cancellation: like a Go worker, the consumer listens on the pub/sub
//!   channel `asynq:cancel` (asynqmon's Cancel button, Go's
//!   `Inspector.CancelProcessing`); the handler of the task id received is
//!   dropped and the task fails with `context canceled` (retried, or
//!   archived once its retries are spent).
//! - Server state: the heartbeat also writes this worker's `ServerInfo` and
//!   one `WorkerInfo` per running task (10 s TTL), which asynqmon's Servers
//!   page and Go's `Inspector.Servers()` show; it is deleted at shutdown.
//! - Shutdown: no more dequeuing; running handlers get `shutdown_timeout`
//!   to finish, then are dropped and their tasks put back at the head of
//!   pending, so the next worker runs them at once. A Valkey call that
//!   hangs (a dequeue, the server state's removal) is dropped after half a
//!   second.
//! - Wake-ups: an idle consumer sleeps up to `poll_interval`, but a task
//!   enqueued by its own process wakes it at once, and with
//!   `wake_on_published` so does one another process enqueued (see
//!   [`super::wakeup`]).
//! - Deferral: a handler that returns [`HandlerError::defer`] (a limit on
//!   its listener is reached, `crate::worker::limits`) has not failed: its
//!   task moves from active to `:scheduled`, due at the time given, with
//!   its retry count and error unchanged, and its slot is free at once.
//!   To Go asynq it is an ordinary scheduled task, which any forwarder
//!   moves to pending once due; but the forwarder runs every
//!   `forward_interval` (5 s) on whole seconds, so the consumer that
//!   deferred the task also moves it back to pending itself when it is due
//!   (`Wakeups`), to the millisecond. Should that consumer stop first, the
//!   forwarders of the others take over. [`Client::promote`] moves a
//!   deferred task back before it is due (a limit's slot freed); one asked
//!   for while the task is still active (its deferral on its way) sends it
//!   straight back to pending when the deferral is written.
//! - In the background, as Go asynq: due retries and scheduled tasks are
//!   forwarded to pending, expired leases recovered (one task that cannot
//!   be recovered is logged and skipped, not the rest of the round; one
//!   that another worker took since its lease was read is left to it), and
//!   completed tasks past their retention deleted.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::fmt;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use futures_util::StreamExt as _;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep, sleep_until};
use tokio_util::sync::CancellationToken;

use super::broker::{Dequeued, due_score, is_leased, is_not_found};
use super::completions::Completions;
use super::message::{ServerInfo, TaskMessage, WorkerInfo};
use super::{Client, QueueError, QueueWeights, default_retry_delay, keys, wakeup};
use crate::spans;
use crate::trace_context::{self, TraceContext};

/// Recovery waits this long past a lease's expiry, to allow for clock skew
/// between workers (Go asynq's value).
const LEASE_GRACE: TimeDelta = TimeDelta::seconds(30);
/// The error recorded on a task whose worker stopped extending its lease.
const LEASE_EXPIRED: &str = "asynq: task lease expired";
/// The error recorded on a task that ran past its deadline, or was past it
/// when its turn to run came (Go's `context.DeadlineExceeded`).
const DEADLINE_EXCEEDED: &str = "context deadline exceeded";
/// The error recorded on a task cancelled through `asynq:cancel` (Go's
/// `context.Canceled`).
const CANCELED: &str = "context canceled";
/// The longest pause between two tries of a failed acknowledgement (Go
/// asynq's syncer interval).
const MAX_SETTLE_BACKOFF: Duration = Duration::from_secs(5);
/// How long a Valkey call in progress at shutdown (a dequeue, the server
/// state's removal) may go on before it is dropped.
const STOP_GRACE: Duration = Duration::from_millis(500);
/// How long to wait before subscribing to `asynq:cancel` again.
const RESUBSCRIBE_DELAY: Duration = Duration::from_secs(5);
/// The most tasks one dequeue takes (as many as there are free takes, up
/// to this).
const MAX_DEQUEUE_BATCH: usize = 32;
/// The most deferred tasks one promote moves back to pending.
const MAX_WAKE_BATCH: usize = 100;

/// A task as a handler receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    /// The task type, such as `event:orderPlaced`.
    pub task_type: String,
    /// The task id.
    pub id: String,
    /// The payload, as the producer enqueued it.
    pub payload: Vec<u8>,
    /// The task's headers (asynq's `TaskMessage.headers`), as the producer
    /// set them; a Go producer sets them with `asynq.NewTaskWithHeaders`.
    pub headers: BTreeMap<String, String>,
    /// The queue the task came from.
    pub queue: String,
    /// Failed runs before this one.
    pub retried: u32,
    /// Retries allowed after the first failed run.
    pub max_retry: u32,
    /// Whether an earlier run failed (the task carries its error): a retry,
    /// or an archived task run again.
    pub failed_before: bool,
}

impl From<&TaskMessage> for Task {
    fn from(message: &TaskMessage) -> Self {
        Self {
            task_type: message.r#type.clone(),
            id: message.id.clone(),
            payload: message.payload.clone(),
            headers: message.headers.clone(),
            queue: message.queue.clone(),
            retried: u32::try_from(message.retried).unwrap_or(0),
            max_retry: u32::try_from(message.retry).unwrap_or(0),
            failed_before: !message.error_msg.is_empty(),
        }
    }
}

/// Why a handler failed. Any error converts into it with `?`; the task is
/// retried, unless [`SkipRetry`] is in the error's chain (or the error was
/// made with [`HandlerError::skip_retry`]): then it is archived at once.
/// One made with `HandlerError::defer` is no failure: the task runs again
/// later.
pub struct HandlerError {
    error: anyhow::Error,
    skip_retry: bool,
    /// Set by [`HandlerError::defer`]: run again at this time, no retry
    /// counted.
    defer_until: Option<DateTime<Utc>>,
    /// Set by [`HandlerError::superseded`]: the task is another run's.
    superseded: bool,
}

impl HandlerError {
    /// A failure that retrying cannot fix (Go's `asynq.SkipRetry`): the
    /// task is archived at once.
    pub fn skip_retry(error: impl Into<anyhow::Error>) -> Self {
        Self {
            error: error.into(),
            skip_retry: true,
            defer_until: None,
            superseded: false,
        }
    }

    /// Not a failure: the task waits in `:scheduled` until `until` (or
    /// until [`Client::promote`] moves it back) and runs again then, with
    /// no retry counted and its error and retry count unchanged; its slot
    /// is free at once. What a listener's limit returns when it is reached
    /// (`crate::worker::limits`).
    pub(crate) fn defer(until: DateTime<Utc>) -> Self {
        Self {
            error: anyhow::anyhow!("deferred until {}", until.to_rfc3339()),
            skip_retry: false,
            defer_until: Some(until),
            superseded: false,
        }
    }

    /// Not this run's to settle: another run of the task took it over (its
    /// lease ran out while this one still ran). The task is left as it is,
    /// as after a lost lease.
    pub(crate) fn superseded(error: impl Into<anyhow::Error>) -> Self {
        Self {
            error: error.into(),
            skip_retry: false,
            defer_until: None,
            superseded: true,
        }
    }

    /// Whether it was made with [`HandlerError::superseded`].
    pub(crate) fn is_superseded(&self) -> bool {
        self.superseded
    }

    /// When a deferred task runs again: `Some` for an error made with
    /// `HandlerError::defer`.
    pub(crate) fn deferred_until(&self) -> Option<DateTime<Utc>> {
        self.defer_until
    }

    /// Whether the task is archived at once rather than retried.
    #[cfg(feature = "testing")]
    pub(crate) fn skips_retry(&self) -> bool {
        self.skip_retry
    }
}

impl<E: Into<anyhow::Error>> From<E> for HandlerError {
    fn from(error: E) -> Self {
        let error = error.into();
        let skip_retry = error.chain().any(|cause| cause.is::<SkipRetry>());
        Self {
            error,
            skip_retry,
            defer_until: None,
            superseded: false,
        }
    }
}

/// A failure that retrying cannot fix: return it from a listener or a
/// scheduled job (`Err(SkipRetry("...".into()).into())`, also wrapped in
/// `anyhow`'s context) and its task is archived at once instead of retried,
/// as Go's `asynq.SkipRetry` does. `outbox retry-archived` runs it again
/// later.
#[derive(Debug, thiserror::Error)]
#[error("{0} (not retried)")]
pub struct SkipRetry(pub String);

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#}", self.error)
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerError")
            .field("error", &self.error)
            .field("skip_retry", &self.skip_retry)
            .field("defer_until", &self.defer_until)
            .finish()
    }
}

/// How a [`Consumer`] runs. `Default` gives Go asynq's values; the worker
/// sets `queues` and `concurrency` from `WORKER_QUEUES` and
/// `WORKER_CONCURRENCY`. Tests shorten the intervals.
#[derive(Debug, Clone)]
pub struct ConsumerOptions {
    /// The queues served, with their weights. Default `default=1`.
    pub queues: QueueWeights,
    /// Tasks run at the same time. Default: the number of CPUs.
    pub concurrency: usize,
    /// How long running handlers may take to finish at shutdown before
    /// their tasks are put back to pending. Default 8 s.
    pub shutdown_timeout: Duration,
    /// Pause between dequeues while every queue is empty (jittered ±50%).
    /// Default 1 s.
    pub poll_interval: Duration,
    /// How long a dequeued task stays leased without a heartbeat. Default 30 s.
    pub lease_duration: Duration,
    /// How often leases of running tasks are extended and the server state
    /// is written (it expires after twice this). Default 5 s.
    pub heartbeat_interval: Duration,
    /// How often due retries and scheduled tasks move to pending. Default 5 s.
    pub forward_interval: Duration,
    /// How often expired leases are looked for. Default 10 s (Go asynq's
    /// recoverer looks once a minute): a task whose worker died is retried
    /// within 70 s of its last heartbeat instead of 2 min, which matters
    /// most to an ordered listener's run, whose key waits for it.
    pub recover_interval: Duration,
    /// How often completed tasks past their retention are deleted. Default 8 s.
    pub cleanup_interval: Duration,
    /// Delay before retry n + 1, given n failures so far.
    /// Default `default_retry_delay`, Go asynq's.
    pub retry_delay: fn(u32) -> Duration,
    /// Also wake when another process publishes an enqueue on
    /// `wakeup::CHANNEL`. Default off; the worker sets it from
    /// `OUTBOX_WAKE` (`valkey` unless set).
    pub wake_on_published: bool,
}

impl Default for ConsumerOptions {
    fn default() -> Self {
        Self {
            queues: QueueWeights::default(),
            concurrency: std::thread::available_parallelism().map_or(1, |n| n.get()),
            shutdown_timeout: Duration::from_secs(8),
            poll_interval: Duration::from_secs(1),
            lease_duration: Duration::from_secs(30),
            heartbeat_interval: Duration::from_secs(5),
            forward_interval: Duration::from_secs(5),
            recover_interval: Duration::from_secs(10),
            cleanup_interval: Duration::from_secs(8),
            retry_delay: default_retry_delay,
            wake_on_published: false,
        }
    }
}

type HandlerFuture = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send>>;
type BoxedHandler = Arc<dyn Fn(Task) -> HandlerFuture + Send + Sync>;

/// Called with a task and its error before the task is archived (see
/// [`Consumer::before_archive`]); an `Err` (why) keeps the task out of
/// the archive.
pub(crate) type ArchiveHook = Arc<
    dyn Fn(Arc<TaskMessage>, String) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>>
        + Send
        + Sync,
>;

/// When the hook before an archive fails, the task is retried this much
/// later instead of archived.
const UNARCHIVED_RETRY: TimeDelta = TimeDelta::seconds(60);

/// Runs handlers for the tasks of its queues until shut down:
///
/// ```text
/// let mut consumer = Consumer::new(client, ConsumerOptions::default());
/// consumer.handle("event:orderPlaced", |task: Task| async move {
///     let envelope: Envelope = serde_json::from_slice(&task.payload)?;
///     tracing::info!(id = %envelope.id, "orderPlaced");
///     Ok(())
/// });
/// consumer.run(shutdown.cancelled_owned()).await?;
/// ```
///
/// (The module is the kit's own, so the example is compiled by a unit test,
/// `tests::the_documented_example_compiles`, not as a doc test.)
pub struct Consumer {
    client: Client,
    options: ConsumerOptions,
    handlers: HashMap<String, BoxedHandler>,
    before_archive: Option<ArchiveHook>,
}

impl Consumer {
    /// A consumer that takes tasks through `client`, run as `options` say, with
    /// no handlers yet.
    pub fn new(client: Client, options: ConsumerOptions) -> Self {
        Self {
            client,
            options,
            handlers: HashMap::new(),
            before_archive: None,
        }
    }

    /// Calls `hook` with each task about to be archived (its retries
    /// spent, a `SkipRetry`, or its lease expired with no retry left) and
    /// the error it is archived with, and archives the task only once the
    /// hook returns `Ok`. On `Err` the task is retried a minute later
    /// instead, its error saying why, and the hook is called again when
    /// that run fails too. (The worker records listener failures in
    /// Postgres this way.)
    pub(crate) fn before_archive(&mut self, hook: ArchiveHook) -> &mut Self {
        self.before_archive = Some(hook);
        self
    }

    /// Registers the handler of a task type pattern, replacing any earlier
    /// one. As with Go asynq's `ServeMux`, a pattern matches every task type
    /// it is a prefix of, and the longest matching pattern wins: `event:`
    /// handles every event, `event:orderPlaced` only that one. A task no
    /// pattern matches fails (and is retried), as in Go.
    pub fn handle<F, Fut>(&mut self, task_type: impl Into<String>, handler: F) -> &mut Self
    where
        F: Fn(Task) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
    {
        let boxed: BoxedHandler = Arc::new(move |task| Box::pin(handler(task)));
        self.handlers.insert(task_type.into(), boxed);
        self
    }

    /// Processes tasks until `shutdown` completes, then stops as described
    /// in the module docs and returns. Valkey errors while running are
    /// logged and retried; only invalid options are an error.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<(), QueueError> {
        let options = &self.options;
        if options.concurrency == 0 {
            return Err(QueueError::Options("concurrency must be at least 1".into()));
        }
        if options.heartbeat_interval >= options.lease_duration {
            return Err(QueueError::Options(
                "the heartbeat interval must be shorter than the lease".into(),
            ));
        }
        let worker = Arc::new(Worker {
            server: server_info(&self.options),
            completions: Completions::start(self.client.clone()),
            client: self.client,
            handlers: self.handlers,
            before_archive: self.before_archive,
            options: self.options,
            active: ActiveTasks::default(),
            wakeups: Wakeups::default(),
            abort: CancellationToken::new(),
        });
        let options = &worker.options;
        tracing::info!(
            queues = %options.queues,
            concurrency = options.concurrency,
            server_id = %worker.server.server_id,
            "consumer started"
        );

        let maintenance = CancellationToken::new();
        let heartbeat = CancellationToken::new();
        let mut background = JoinSet::new();
        background.spawn(worker.clone().heartbeat(heartbeat.clone()));
        background.spawn(worker.clone().maintain(maintenance.clone()));
        background.spawn(worker.clone().listen_for_cancellations(heartbeat.clone()));
        // Until the last handler has returned: a task deferred during the
        // shutdown's drain still wakes on time.
        background.spawn(worker.clone().wake_deferred(heartbeat.clone()));
        if options.wake_on_published {
            background.spawn(worker.clone().listen_for_enqueues(heartbeat.clone()));
        }

        let mut running = JoinSet::new();
        let capacity = Capacity::new(options.concurrency);
        let mut shutdown = pin!(shutdown);
        loop {
            let take = tokio::select! {
                biased;
                () = &mut shutdown => break,
                take = capacity.take() => take,
            };
            // Every take free now, up to a batch: one dequeue uses them.
            // Tasks whose handlers are returning at this moment free theirs
            // first.
            tokio::task::yield_now().await;
            let mut takes = vec![take];
            while takes.len() < MAX_DEQUEUE_BATCH {
                match capacity.try_take() {
                    Some(take) => takes.push(take),
                    None => break,
                }
            }
            while running.try_join_next().is_some() {}
            // Listening before looking: an enqueue during the dequeue still wakes.
            let mut enqueued = pin!(worker.client.enqueued().next());
            enqueued.as_mut().enable();
            // A dequeue stuck on a hung Valkey must not hold up shutdown; a
            // task it took meanwhile is recovered when its lease expires.
            let dequeued = tokio::select! {
                biased;
                dequeued = worker.dequeue(takes, &capacity, &mut running) => dequeued,
                () = async {
                    (&mut shutdown).await;
                    sleep(STOP_GRACE).await;
                } => break,
            };
            let pause = match dequeued {
                Ok(true) => continue,
                Ok(false) => jittered(options.poll_interval),
                Err(err) => {
                    tracing::error!(error = %err, "dequeue failed; retrying in 1s");
                    Duration::from_secs(1)
                }
            };
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                () = enqueued => {}
                () = sleep(pause) => {}
            }
        }

        tracing::info!(running = running.len(), "consumer stopping");
        capacity.stop();
        maintenance.cancel();
        let drain = async { while running.join_next().await.is_some() {} };
        if tokio::time::timeout(options.shutdown_timeout, drain)
            .await
            .is_err()
        {
            tracing::warn!(
                running = running.len(),
                "shutdown timeout reached; putting unfinished tasks back to pending"
            );
            worker.abort.cancel();
            while running.join_next().await.is_some() {}
        }
        heartbeat.cancel();
        let background_stopped = async { while background.join_next().await.is_some() {} };
        if tokio::time::timeout(STOP_GRACE, background_stopped)
            .await
            .is_err()
        {
            tracing::warn!("Valkey did not answer at shutdown; the server state expires by itself");
            background.abort_all();
        }
        tracing::info!("consumer stopped");
        Ok(())
    }
}

/// How many tasks a consumer holds and runs: a task holds a *take* from
/// its dequeue until its handler returns, and a *slot* from its start until
/// its final write, `concurrency` of each. So the consumer runs at most
/// `concurrency` tasks, and takes a task ahead only for a slot whose
/// handler has returned and whose completion is on its way.
#[derive(Clone)]
struct Capacity {
    takes: Arc<Semaphore>,
    slots: Arc<Semaphore>,
    /// Cancelled at shutdown: tasks taken ahead stop waiting for a slot.
    stopping: CancellationToken,
}

impl Capacity {
    fn new(concurrency: usize) -> Self {
        Self {
            takes: Arc::new(Semaphore::new(concurrency)),
            slots: Arc::new(Semaphore::new(concurrency)),
            stopping: CancellationToken::new(),
        }
    }

    /// Waits for a free take.
    async fn take(&self) -> OwnedSemaphorePermit {
        Arc::clone(&self.takes)
            .acquire_owned()
            .await
            .expect("never closed")
    }

    /// A free take, if there is one now.
    fn try_take(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.takes).try_acquire_owned().ok()
    }

    /// Waits for a free slot; `None` once the consumer is stopping.
    async fn slot(&self) -> Option<OwnedSemaphorePermit> {
        if let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() {
            return Some(slot);
        }
        tokio::select! {
            biased;
            () = self.stopping.cancelled() => None,
            slot = Arc::clone(&self.slots).acquire_owned() => Some(slot.expect("never closed")),
        }
    }

    /// Tasks waiting for a slot give up: they go back to pending.
    fn stop(&self) {
        self.stopping.cancel();
    }
}

/// The state shared by the loop, the running tasks and the background jobs.
struct Worker {
    client: Client,
    completions: Completions,
    handlers: HashMap<String, BoxedHandler>,
    before_archive: Option<ArchiveHook>,
    options: ConsumerOptions,
    active: ActiveTasks,
    /// The tasks this consumer deferred, to move back to pending when due.
    wakeups: Wakeups,
    /// Cancelled when the shutdown timeout is reached.
    abort: CancellationToken,
    /// This worker as asynqmon shows it; `active_worker_count` is filled
    /// in at each heartbeat.
    server: ServerInfo,
}

/// How one run of a task ended.
enum Outcome {
    Succeeded,
    Failed {
        error: String,
        skip_retry: bool,
    },
    /// The handler deferred the task to `until` (not a failure).
    Deferred {
        until: DateTime<Utc>,
    },
    /// The lease ran out (Valkey unreachable): the recoverer owns the task.
    LeaseLost,
    /// Another run of the task holds it (this one's lease ran out while it
    /// ran, and another worker took it over): left to that run.
    Superseded {
        error: String,
    },
    /// Cut short by shutdown.
    Interrupted,
}

/// The write that moves a finished task on, decided once so that a retried
/// write is the same write.
enum Settlement {
    Complete,
    Retry {
        retry_at: DateTime<Utc>,
        error: String,
    },
    Archive {
        error: String,
    },
    Defer {
        until: DateTime<Utc>,
    },
    Requeue,
}

impl Worker {
    /// Dequeues up to one task per take in `takes` and puts each on
    /// `running`, where it waits for a slot of `capacity`, runs, and is
    /// settled (the takes left over are freed). Returns whether there was
    /// a task.
    async fn dequeue(
        self: &Arc<Self>,
        mut takes: Vec<OwnedSemaphorePermit>,
        capacity: &Capacity,
        running: &mut JoinSet<()>,
    ) -> Result<bool, QueueError> {
        let order = self.options.queues.dequeue_order();
        let lease_until = Instant::now() + self.options.lease_duration;
        let lease_until_utc = Utc::now() + self.options.lease_duration;
        let dequeued = self
            .client
            .dequeue(&order, lease_until_utc, takes.len())
            .await?;
        let any = !dequeued.is_empty();
        for taken in dequeued {
            let message = match taken {
                Dequeued::Task(message) => Arc::new(message),
                Dequeued::Undecodable {
                    queue,
                    id,
                    encoded,
                    error,
                } => {
                    self.archive_undecodable(&queue, &id, &encoded, &error)
                        .await;
                    continue;
                }
            };
            let take = takes.pop().expect("no more tasks than takes");
            let (lease, cancel) = self.active.hold(&message, lease_until);
            let worker = self.clone();
            let capacity = capacity.clone();
            running.spawn(async move {
                // Taken ahead: waits for the slot of a completion on its
                // way, or goes back to pending unrun at shutdown.
                let slot = capacity.slot().await;
                let outcome = match slot {
                    Some(_) => {
                        let deadline = deadline(&message, Utc::now());
                        worker.active.run(&message, deadline);
                        worker
                            .execute(&message, deadline, lease.clone(), cancel)
                            .await
                    }
                    None => Outcome::Interrupted,
                };
                // The handler has returned: the next task may be taken
                // while this one's completion is written.
                drop(take);
                worker.settle(&message, outcome, lease).await;
                worker.active.finish(&message);
                drop(slot);
            });
        }
        Ok(any)
    }

    /// Archives a dequeued task whose message does not decode: no handler
    /// can run it, and left active it would only expire and fail again.
    async fn archive_undecodable(
        &self,
        queue: &str,
        id: &[u8],
        encoded: &[u8],
        error: &prost::DecodeError,
    ) {
        let id_text = String::from_utf8_lossy(id);
        tracing::error!(
            %queue,
            id = %id_text,
            error = %error,
            "a task's message is not a valid asynq TaskMessage; archived as it is"
        );
        if let Err(err) = self.client.archive_undecodable(queue, id, encoded).await {
            tracing::error!(%queue, id = %id_text, error = %err, "could not archive the undecodable task; its lease will expire");
        }
    }

    /// Runs the handler, bounded by the task's deadline, its lease, a
    /// cancellation and the shutdown timeout.
    async fn execute(
        &self,
        message: &TaskMessage,
        deadline: DateTime<Utc>,
        lease: watch::Receiver<Instant>,
        cancel: CancellationToken,
    ) -> Outcome {
        // As Go: a task already past its deadline is not started.
        if deadline <= Utc::now() {
            return Outcome::Failed {
                error: DEADLINE_EXCEEDED.into(),
                skip_retry: false,
            };
        }
        let Some(handler) = handler_for(&self.handlers, &message.r#type) else {
            return Outcome::Failed {
                error: format!("handler not found for task {:?}", message.r#type),
                skip_retry: false,
            };
        };
        // The run continues the trace of the task's headers (as a Go
        // producer's middleware writes them), or starts one.
        let span = spans::process(
            &message.id,
            &message.r#type,
            &message.queue,
            message.retried,
        );
        let context = trace_context::start(
            &span,
            TraceContext::from_metadata(&message.headers).as_ref(),
        );
        let mut run = tokio::spawn(trace_context::within(
            context,
            tracing::Instrument::instrument(handler(Task::from(message)), span.clone()),
        ));
        let outcome = tokio::select! {
            joined = &mut run => match joined {
                Ok(Ok(())) => Outcome::Succeeded,
                Ok(Err(err)) if err.is_superseded() => Outcome::Superseded { error: err.to_string() },
                Ok(Err(err)) => match err.deferred_until() {
                    Some(until) => Outcome::Deferred { until },
                    None => Outcome::Failed {
                        error: err.to_string(),
                        skip_retry: err.skip_retry,
                    },
                },
                Err(err) => Outcome::Failed { error: panic_message(err), skip_retry: false },
            },
            () = sleep_until(instant_at(deadline)) => Outcome::Failed {
                error: DEADLINE_EXCEEDED.into(),
                skip_retry: false,
            },
            () = cancel.cancelled() => {
                tracing::info!(id = %message.id, task_type = %message.r#type, "task cancelled");
                Outcome::Failed { error: CANCELED.into(), skip_retry: false }
            }
            () = lease_lost(lease.clone()) => Outcome::LeaseLost,
            () = self.abort.cancelled() => Outcome::Interrupted,
        };
        // A no-op for a run that has ended.
        run.abort();
        match &outcome {
            Outcome::Succeeded => spans::record_outcome(&span, "succeeded", None),
            Outcome::Failed { error, .. } => spans::record_outcome(&span, "failed", Some(error)),
            Outcome::Deferred { .. } => spans::record_outcome(&span, "deferred", None),
            Outcome::LeaseLost => spans::record_outcome(&span, "lease_lost", Some("lease lost")),
            Outcome::Superseded { error } => {
                spans::record_outcome(&span, "superseded", Some(error));
            }
            Outcome::Interrupted => {
                spans::record_outcome(&span, "interrupted", Some("interrupted by shutdown"));
            }
        }
        outcome
    }

    /// Moves the task on according to the outcome of its run. A write that
    /// fails is tried again with backoff while the lease holds; from the
    /// first failure on the heartbeat no longer extends it, so a write that
    /// keeps failing gives up at the lease's end and the task is left to
    /// the recoverer, as in Go.
    async fn settle(
        &self,
        message: &Arc<TaskMessage>,
        outcome: Outcome,
        lease: watch::Receiver<Instant>,
    ) {
        let (id, task_type) = (&message.id, &message.r#type);
        let settlement = match outcome {
            Outcome::Succeeded => {
                tracing::debug!(%id, %task_type, "task succeeded");
                Settlement::Complete
            }
            Outcome::Failed { error, skip_retry } => {
                if skip_retry || message.retried >= message.retry {
                    self.archive_or_retry(message, error).await
                } else {
                    let retried = u32::try_from(message.retried).unwrap_or(0);
                    let delay = (self.options.retry_delay)(retried);
                    tracing::warn!(%id, %task_type, %error, retry_in = ?delay, "task failed");
                    let retry_at =
                        Utc::now() + TimeDelta::from_std(delay).unwrap_or(TimeDelta::MAX);
                    Settlement::Retry { retry_at, error }
                }
            }
            Outcome::Deferred { until } => {
                tracing::debug!(%id, %task_type, %until, "task deferred");
                Settlement::Defer { until }
            }
            Outcome::LeaseLost => {
                tracing::warn!(%id, %task_type, "lease lost; the recoverer will retry the task");
                return;
            }
            Outcome::Superseded { error } => {
                tracing::warn!(%id, %task_type, %error, "another run of the task holds it; left to that run");
                return;
            }
            Outcome::Interrupted => {
                tracing::info!(%id, %task_type, "task interrupted by shutdown; back to pending");
                Settlement::Requeue
            }
        };

        let mut backoff = Duration::from_millis(100);
        for attempt in 1.. {
            let lease_until = *lease.borrow();
            if lease_until <= Instant::now() {
                tracing::error!(
                    %id,
                    %task_type,
                    "lease lost before the task could be updated; the recoverer will retry it"
                );
                return;
            }
            let err = match self.write(message, &settlement).await {
                Ok(true) => return,
                Ok(false) if attempt > 1 => {
                    // An earlier try reached Valkey although its reply was lost.
                    tracing::info!(%id, %task_type, "task updated by an earlier try");
                    return;
                }
                Ok(false) => {
                    tracing::error!(%id, %task_type, "task is no longer active; left as it is");
                    return;
                }
                Err(err) => err,
            };
            if attempt == 1 {
                self.active.stop_extending(message);
            }
            if self.abort.is_cancelled() {
                tracing::error!(%id, %task_type, error = %err, "could not update the task in Valkey before shutdown; the recoverer will retry it");
                return;
            }
            tracing::warn!(%id, %task_type, error = %err, attempt, retry_in = ?backoff, "could not update the task in Valkey; will retry");
            let pause = backoff.min(lease_until.saturating_duration_since(Instant::now()));
            tokio::select! {
                () = sleep(pause) => {}
                // One last try before shutdown completes.
                () = self.abort.cancelled() => {}
            }
            backoff = (backoff * 2).min(MAX_SETTLE_BACKOFF);
        }
    }

    /// The archive of `message` failed with `error`, once the hook before
    /// an archive let it; else a retry a minute later, saying why.
    async fn archive_or_retry(&self, message: &Arc<TaskMessage>, error: String) -> Settlement {
        let (id, task_type) = (&message.id, &message.r#type);
        let refused = match &self.before_archive {
            Some(hook) => hook(Arc::clone(message), error.clone()).await.err(),
            None => None,
        };
        match refused {
            None => {
                tracing::warn!(%id, %task_type, %error, "task failed; retries spent, archived");
                Settlement::Archive { error }
            }
            Some(why) => {
                tracing::error!(%id, %task_type, %error, reason = %why, retry_in = ?UNARCHIVED_RETRY, "task failed for good, but not archived: its failure could not be recorded");
                Settlement::Retry {
                    retry_at: Utc::now() + UNARCHIVED_RETRY,
                    error: format!("{error} (not archived: {why})"),
                }
            }
        }
    }

    /// One try of the write of `settlement`. `Ok(false)`: the task was no
    /// longer active (Go's `NOT FOUND`), and was left as it is.
    async fn write(
        &self,
        message: &Arc<TaskMessage>,
        settlement: &Settlement,
    ) -> Result<bool, QueueError> {
        let written = match settlement {
            Settlement::Complete => return self.completions.complete(message).await,
            Settlement::Retry { retry_at, error } => {
                self.client.retry(message, *retry_at, error, None).await
            }
            Settlement::Archive { error } => self.client.archive(message, error, None).await,
            Settlement::Defer { until } => match self.client.defer(message, *until).await {
                // Woken meanwhile: back in pending already.
                Ok(true) => Ok(()),
                Ok(false) => {
                    let due = due_score(*until);
                    let wakeup = Wakeup {
                        queue: message.queue.clone(),
                        id: message.id.clone(),
                        due,
                    };
                    self.wakeups.add(instant_at(*until), wakeup);
                    Ok(())
                }
                Err(err) => Err(err),
            },
            Settlement::Requeue => self.client.requeue(message).await,
        };
        match written {
            Ok(()) => Ok(true),
            Err(err) if is_not_found(&err) => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// Every heartbeat interval until `stop`: writes the server state and
    /// extends the leases of running tasks. Deletes the server state when
    /// stopped.
    async fn heartbeat(self: Arc<Self>, stop: CancellationToken) {
        loop {
            self.beat().await;
            tokio::select! {
                () = stop.cancelled() => break,
                () = sleep(self.options.heartbeat_interval) => {}
            }
        }
        if let Err(err) = self.client.clear_server_state(&self.server).await {
            tracing::warn!(error = %err, "could not clear the server state");
        }
    }

    /// One heartbeat, as Go asynq's `heartbeater.beat`.
    async fn beat(&self) {
        let workers = self.active.worker_infos(&self.server);
        let server = ServerInfo {
            active_worker_count: i32::try_from(workers.len()).unwrap_or(i32::MAX),
            ..self.server.clone()
        };
        let ttl = self.options.heartbeat_interval * 2;
        if let Err(err) = self.client.write_server_state(&server, &workers, ttl).await {
            tracing::warn!(error = %err, "could not write the server state");
        }

        let leased = self.active.leased_by_queue();
        if leased.is_empty() {
            return;
        }
        let until = Instant::now() + self.options.lease_duration;
        let until_utc = Utc::now() + self.options.lease_duration;
        match self.client.extend_leases(&leased, until_utc).await {
            Ok(()) => self.active.extend(&leased, until),
            Err(err) => tracing::warn!(error = %err, "could not extend task leases"),
        }
    }

    /// Moves the tasks this consumer deferred back to pending as they come
    /// due (ahead of the forwarder, which works on whole seconds every
    /// `forward_interval`), until `stop`. A task no longer in `:scheduled`
    /// (woken by a limit, run by asynqmon, deleted) is left as it is. A
    /// failed move is logged: the forwarder moves the task anyway.
    async fn wake_deferred(self: Arc<Self>, stop: CancellationToken) {
        loop {
            for (queue, tasks) in self.wakeups.take_due(Instant::now()) {
                for chunk in tasks.chunks(MAX_WAKE_BATCH) {
                    if let Err(err) = self.client.wake_due(&queue, chunk).await {
                        tracing::warn!(%queue, tasks = chunk.len(), error = %err, "could not wake deferred tasks; the forwarder will");
                    }
                }
            }
            let next = self.wakeups.next();
            tokio::select! {
                () = stop.cancelled() => return,
                () = self.wakeups.changed.notified() => {}
                () = async {
                    match next {
                        Some(at) => sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => {}
            }
        }
    }

    /// Cancels the running tasks whose ids are published on `asynq:cancel`,
    /// until `stop`.
    async fn listen_for_cancellations(self: Arc<Self>, stop: CancellationToken) {
        let worker = Arc::clone(&self);
        self.listen(
            keys::CANCEL_CHANNEL,
            "task cancellations",
            stop,
            move |id| worker.active.cancel(&id),
        )
        .await;
    }

    /// Wakes this process's idle consumers when another process publishes
    /// an enqueue (see [`super::wakeup`]), until `stop`.
    async fn listen_for_enqueues(self: Arc<Self>, stop: CancellationToken) {
        let enqueued = self.client.enqueued().clone();
        self.listen(wakeup::CHANNEL, "enqueue wake-ups", stop, move |_queues| {
            enqueued.signal()
        })
        .await;
    }

    /// Calls `on_message` with each message published on `channel` until
    /// `stop`; subscribes again after a lost connection. `what` names the
    /// messages in logs.
    async fn listen(
        &self,
        channel: &str,
        what: &str,
        stop: CancellationToken,
        on_message: impl Fn(String),
    ) {
        loop {
            let subscribed = tokio::select! {
                () = stop.cancelled() => return,
                subscribed = tokio::time::timeout(
                    RESUBSCRIBE_DELAY,
                    self.client.subscribe(channel),
                ) => subscribed,
            };
            match subscribed {
                Ok(Ok(subscription)) => {
                    let mut messages = subscription.into_on_message();
                    loop {
                        let message = tokio::select! {
                            () = stop.cancelled() => return,
                            message = messages.next() => message,
                        };
                        let Some(message) = message else { break };
                        match message.get_payload::<String>() {
                            Ok(payload) => on_message(payload),
                            Err(err) => {
                                tracing::warn!(error = %err, "unreadable message on {channel}")
                            }
                        }
                    }
                    tracing::warn!("the subscription to {what} was lost; subscribing again");
                }
                Ok(Err(err)) => {
                    tracing::warn!(error = %err, "cannot subscribe to {what}");
                }
                Err(_) => tracing::warn!("subscribing to {what} timed out"),
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = sleep(RESUBSCRIBE_DELAY) => {}
            }
        }
    }

    /// Forwards due tasks, recovers expired leases and deletes expired
    /// completed tasks, each at its own interval, until `stop`.
    async fn maintain(self: Arc<Self>, stop: CancellationToken) {
        let options = &self.options;
        let start = Instant::now();
        let (mut forward, mut recover, mut cleanup) = (start, start, start);
        loop {
            let now = Instant::now();
            for queue in options.queues.names() {
                if now >= forward {
                    log_failure(queue, "forward", self.client.forward_due(queue).await);
                }
                if now >= recover {
                    log_failure(queue, "recover", self.recover(queue).await);
                }
                if now >= cleanup {
                    let result = self.client.delete_expired_completed(queue).await;
                    log_failure(queue, "cleanup", result);
                }
            }
            for (next, interval) in [
                (&mut forward, options.forward_interval),
                (&mut recover, options.recover_interval),
                (&mut cleanup, options.cleanup_interval),
            ] {
                if now >= *next {
                    *next = now + interval;
                }
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = sleep_until(forward.min(recover).min(cleanup)) => {}
            }
        }
    }

    /// Go asynq's recoverer: a task whose lease expired (its worker died)
    /// is retried, or archived if its retries are spent. A task that cannot
    /// be moved is logged and skipped, as in Go; the next round tries again.
    async fn recover(&self, queue: &str) -> Result<(), QueueError> {
        let cutoff = Utc::now() - LEASE_GRACE;
        for message in self.client.lease_expired(queue, cutoff).await? {
            let message = Arc::new(message);
            let (id, task_type) = (&message.id, &message.r#type);
            tracing::warn!(%id, %task_type, "recovering a task whose lease expired");
            // Only if the lease is still the expired one read above: a
            // task another worker took since is its own.
            let result = if message.retried >= message.retry {
                // An archive, or the retry that replaces it.
                match self.archive_or_retry(&message, LEASE_EXPIRED.into()).await {
                    Settlement::Retry { retry_at, error } => {
                        self.client
                            .retry(&message, retry_at, &error, Some(cutoff))
                            .await
                    }
                    _ => {
                        self.client
                            .archive(&message, LEASE_EXPIRED, Some(cutoff))
                            .await
                    }
                }
            } else {
                let retried = u32::try_from(message.retried).unwrap_or(0);
                let delay = TimeDelta::from_std((self.options.retry_delay)(retried))
                    .unwrap_or(TimeDelta::MAX);
                self.client
                    .retry(&message, Utc::now() + delay, LEASE_EXPIRED, Some(cutoff))
                    .await
            };
            match result {
                Ok(()) => {}
                Err(err) if is_leased(&err) || is_not_found(&err) => {
                    tracing::info!(%id, %task_type, "the task was taken by another worker meanwhile; left to it");
                }
                Err(err) => {
                    tracing::warn!(%id, %task_type, error = %err, "could not recover the task; skipped")
                }
            }
        }
        Ok(())
    }
}

/// One task this consumer holds: its lease, what asynqmon shows of it once
/// it runs, and how to cancel it.
struct ActiveTask {
    message: Arc<TaskMessage>,
    /// When it started and its deadline; `None` while it waits for a slot.
    running: Option<(DateTime<Utc>, DateTime<Utc>)>,
    /// The local instant the lease is valid until.
    lease: watch::Sender<Instant>,
    cancel: CancellationToken,
    /// Set when its final write first failed: the lease is no longer
    /// extended.
    settling: bool,
}

/// The tasks this consumer holds, by (queue, id), from dequeue until their
/// final write.
#[derive(Default)]
struct ActiveTasks(Mutex<HashMap<(String, String), ActiveTask>>);

impl ActiveTasks {
    /// A task just dequeued, leased until `lease_until`.
    fn hold(
        &self,
        message: &Arc<TaskMessage>,
        lease_until: Instant,
    ) -> (watch::Receiver<Instant>, CancellationToken) {
        let (lease, receiver) = watch::channel(lease_until);
        let cancel = CancellationToken::new();
        let task = ActiveTask {
            message: Arc::clone(message),
            running: None,
            lease,
            cancel: cancel.clone(),
            settling: false,
        };
        let key = (message.queue.clone(), message.id.clone());
        self.0.lock().expect("active tasks").insert(key, task);
        (receiver, cancel)
    }

    /// The task has a slot and starts now, with `deadline`.
    fn run(&self, message: &TaskMessage, deadline: DateTime<Utc>) {
        let key = (message.queue.clone(), message.id.clone());
        if let Some(task) = self.0.lock().expect("active tasks").get_mut(&key) {
            task.running = Some((Utc::now(), deadline));
        }
    }

    fn finish(&self, message: &TaskMessage) {
        let key = (message.queue.clone(), message.id.clone());
        self.0.lock().expect("active tasks").remove(&key);
    }

    /// Stops extending the lease of `message`'s task (its final write
    /// failed: it gets until the lease's end).
    fn stop_extending(&self, message: &TaskMessage) {
        let key = (message.queue.clone(), message.id.clone());
        if let Some(task) = self.0.lock().expect("active tasks").get_mut(&key) {
            task.settling = true;
        }
    }

    /// The ids whose lease still holds, grouped by queue, but for tasks
    /// whose final write failed. An expired lease is not extended (Go: the
    /// task belongs to the recoverer by then).
    fn leased_by_queue(&self) -> Vec<(String, Vec<String>)> {
        let now = Instant::now();
        let mut grouped: HashMap<String, Vec<String>> = HashMap::new();
        for ((queue, id), task) in self.0.lock().expect("active tasks").iter() {
            if !task.settling && *task.lease.borrow() > now {
                grouped.entry(queue.clone()).or_default().push(id.clone());
            }
        }
        grouped.into_iter().collect()
    }

    fn extend(&self, leased: &[(String, Vec<String>)], until: Instant) {
        let map = self.0.lock().expect("active tasks");
        for (queue, ids) in leased {
            for id in ids {
                if let Some(task) = map.get(&(queue.clone(), id.clone())) {
                    task.lease.send_replace(until);
                }
            }
        }
    }

    /// One `WorkerInfo` per task that has started (not those waiting for
    /// a slot), for the server state.
    fn worker_infos(&self, server: &ServerInfo) -> Vec<WorkerInfo> {
        self.0
            .lock()
            .expect("active tasks")
            .values()
            .filter_map(|task| Some((task, task.running?)))
            .map(|(task, (started, deadline))| WorkerInfo {
                host: server.host.clone(),
                pid: server.pid,
                server_id: server.server_id.clone(),
                task_id: task.message.id.clone(),
                task_type: task.message.r#type.clone(),
                task_payload: task.message.payload.clone(),
                queue: task.message.queue.clone(),
                start_time: Some(started.into()),
                deadline: Some(deadline.into()),
            })
            .collect()
    }

    /// Cancels the task `id` (in whichever queue), running or waiting for
    /// a slot, if this consumer holds it.
    fn cancel(&self, id: &str) {
        for ((_, task_id), task) in self.0.lock().expect("active tasks").iter() {
            if task_id == id {
                task.cancel.cancel();
            }
        }
    }
}

/// The tasks a consumer deferred, by when they are due: each is moved back
/// to pending at its time by `Worker::wake_deferred`.
#[derive(Default)]
struct Wakeups {
    due: Mutex<BinaryHeap<Reverse<(Instant, Wakeup)>>>,
    /// Notified when a task due before the others is added.
    changed: Notify,
}

/// One deferred task: its queue, its id, and its score in `:scheduled`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Wakeup {
    queue: String,
    id: String,
    due: i64,
}

impl Wakeups {
    /// Wakes `task` at `at`.
    fn add(&self, at: Instant, task: Wakeup) {
        let mut due = self.due.lock().expect("wake-ups");
        let earliest = due.peek().is_none_or(|Reverse((next, _))| at < *next);
        due.push(Reverse((at, task)));
        drop(due);
        if earliest {
            // Stored when the loop is not waiting: it looks again anyway.
            self.changed.notify_one();
        }
    }

    /// Removes the tasks due by `now`, as (id, score) grouped by queue.
    fn take_due(&self, now: Instant) -> Vec<(String, Vec<(String, i64)>)> {
        let mut due = self.due.lock().expect("wake-ups");
        let mut grouped: BTreeMap<String, Vec<(String, i64)>> = BTreeMap::new();
        while due.peek().is_some_and(|Reverse((at, _))| *at <= now) {
            let Reverse((_, task)) = due.pop().expect("peeked");
            grouped
                .entry(task.queue)
                .or_default()
                .push((task.id, task.due));
        }
        grouped.into_iter().collect()
    }

    /// When the next task is due.
    fn next(&self) -> Option<Instant> {
        let due = self.due.lock().expect("wake-ups");
        due.peek().map(|Reverse((at, _))| *at)
    }
}

/// Completes once the lease is past its (possibly extended) expiry.
async fn lease_lost(mut lease: watch::Receiver<Instant>) {
    loop {
        let until = *lease.borrow_and_update();
        tokio::select! {
            () = sleep_until(until) => {
                if *lease.borrow() <= Instant::now() {
                    return;
                }
            }
            changed = lease.changed() => {
                if changed.is_err() {
                    // The lease was dropped: the task is being settled.
                    std::future::pending::<()>().await;
                }
            }
        }
    }
}

/// When the current run must end: `now` + timeout, or the task's deadline,
/// whichever is first (Go asynq's `computeDeadline`).
fn deadline(message: &TaskMessage, now: DateTime<Utc>) -> DateTime<Utc> {
    let by_timeout = (message.timeout > 0).then(|| {
        TimeDelta::try_seconds(message.timeout)
            .and_then(|timeout| now.checked_add_signed(timeout))
            .unwrap_or(DateTime::<Utc>::MAX_UTC)
    });
    let by_deadline = (message.deadline > 0)
        .then(|| DateTime::from_timestamp(message.deadline, 0).unwrap_or(DateTime::<Utc>::MAX_UTC));
    match (by_timeout, by_deadline) {
        (Some(a), Some(b)) => a.min(b),
        (Some(at), None) | (None, Some(at)) => at,
        (None, None) => {
            tracing::error!(id = %message.id, "task has no timeout nor deadline; using 30 min");
            now + super::DEFAULT_TIMEOUT
        }
    }
}

/// The local instant at which the wall-clock `time` comes.
fn instant_at(time: DateTime<Utc>) -> Instant {
    let left = (time - Utc::now()).to_std().unwrap_or(Duration::ZERO);
    Instant::now() + left.min(Duration::from_secs(100 * 365 * 24 * 3600))
}

/// This worker's identity and configuration, as Go asynq's heartbeater
/// reports them: host, pid, a new server id, concurrency, and the queues
/// with their weights as priorities.
fn server_info(options: &ConsumerOptions) -> ServerInfo {
    let host = hostname::get()
        .ok()
        .and_then(|host| host.into_string().ok())
        .unwrap_or_else(|| "unknown-host".into());
    ServerInfo {
        host,
        pid: i32::try_from(std::process::id()).unwrap_or(0),
        server_id: uuid::Uuid::new_v4().to_string(),
        concurrency: i32::try_from(options.concurrency).unwrap_or(i32::MAX),
        queues: options
            .queues
            .weights()
            .map(|(name, weight)| (name.to_string(), i32::try_from(weight).unwrap_or(i32::MAX)))
            .collect(),
        strict_priority: false,
        status: "active".into(),
        start_time: Some(Utc::now().into()),
        active_worker_count: 0,
        kit_chains: super::message::CHAINS_LAYOUT,
    }
}

fn log_failure(queue: &str, job: &str, result: Result<(), QueueError>) {
    if let Err(err) = result {
        tracing::warn!(%queue, job, error = %err, "queue maintenance failed");
    }
}

fn panic_message(err: tokio::task::JoinError) -> String {
    match err.try_into_panic() {
        Ok(panic) => {
            let text = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string payload".into());
            format!("panic: {text}")
        }
        Err(err) => format!("handler task failed: {err}"),
    }
}

/// `interval` ± 50 %, so that idle workers do not poll in step.
fn jittered(interval: Duration) -> Duration {
    interval / 2 + interval.mul_f64(fastrand::f64())
}

/// The entry whose pattern is the longest prefix of `task_type` (the
/// handler of a task, as Go asynq's `ServeMux` picks it).
fn handler_for<'a, H>(handlers: &'a HashMap<String, H>, task_type: &str) -> Option<&'a H> {
    handlers
        .iter()
        .filter(|(pattern, _)| task_type.starts_with(pattern.as_str()))
        .max_by_key(|(pattern, _)| pattern.len())
        .map(|(_, handler)| handler)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of [`Consumer`]'s documentation, compiled.
    #[allow(dead_code)]
    async fn the_documented_example_compiles(
        client: Client,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> anyhow::Result<()> {
        let mut consumer = Consumer::new(client, ConsumerOptions::default());
        consumer.handle("event:orderPlaced", |task: Task| async move {
            let envelope: crate::outbox::Envelope = serde_json::from_slice(&task.payload)?;
            tracing::info!(id = %envelope.id, "orderPlaced");
            Ok(())
        });
        consumer.run(shutdown.cancelled_owned()).await?;
        Ok(())
    }

    #[test]
    fn wake_ups_come_due_in_time_order_grouped_by_queue() {
        let wakeups = Wakeups::default();
        let now = Instant::now();
        let task = |queue: &str, id: &str| Wakeup {
            queue: queue.into(),
            id: id.into(),
            due: 7,
        };
        wakeups.add(now + Duration::from_millis(30), task("b", "3"));
        wakeups.add(now + Duration::from_millis(10), task("a", "1"));
        wakeups.add(now + Duration::from_millis(20), task("a", "2"));
        wakeups.add(now + Duration::from_secs(60), task("a", "later"));
        assert_eq!(wakeups.next(), Some(now + Duration::from_millis(10)));
        assert!(wakeups.take_due(now).is_empty());
        assert_eq!(
            wakeups.take_due(now + Duration::from_millis(30)),
            vec![
                (
                    "a".to_string(),
                    vec![("1".to_string(), 7), ("2".to_string(), 7)]
                ),
                ("b".to_string(), vec![("3".to_string(), 7)]),
            ]
        );
        assert_eq!(wakeups.next(), Some(now + Duration::from_secs(60)));
    }

    #[test]
    fn a_deferral_is_no_failure() {
        let until = Utc::now() + TimeDelta::seconds(1);
        let deferred = HandlerError::defer(until);
        assert_eq!(deferred.deferred_until(), Some(until));
        assert!(!deferred.skip_retry);
        let failed = HandlerError::from(anyhow::anyhow!("boom"));
        assert_eq!(failed.deferred_until(), None);
    }

    #[test]
    fn the_longest_matching_pattern_handles_a_task() {
        let handlers: HashMap<String, &str> =
            [("event:", "fan-out"), ("event:orderPlaced", "special")]
                .into_iter()
                .map(|(pattern, name)| (pattern.to_string(), name))
                .collect();
        assert_eq!(
            handler_for(&handlers, "event:orderPlaced"),
            Some(&"special")
        );
        assert_eq!(
            handler_for(&handlers, "event:orderShipped"),
            Some(&"fan-out")
        );
        assert_eq!(handler_for(&handlers, "listener:orderPlaced:audit"), None);
    }
}
