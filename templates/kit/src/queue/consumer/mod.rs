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
//!   archived once its retries are spent). With a hook given
//!   ([`Consumer::on_cancel`], as the kit's worker gives one), the hook
//!   says which cancelled runs are final (the kit's: a listener's run):
//!   their tasks are deleted, not retried; the others fail as in Go.
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
//!
//! Here: [`Consumer`], which gathers handlers and starts, and
//! `RunningConsumer`, the state its loop, its tasks and its background
//! loops share once it runs. Each part in a file of its own:
//! - [`task`]: what a handler receives and returns ([`Task`],
//!   [`HandlerError`], [`SkipRetry`]); [`options`]: [`ConsumerOptions`];
//! - [`run`]: the loop, from start to shutdown, and the dequeue;
//!   [`capacity`]: the takes and slots that bound it;
//! - [`execute`]: one run of a handler and how it ended; [`settle`]: the
//!   write that moves the task on;
//! - [`active`]: the tasks held, their leases and cancellations;
//!   [`wakeups`]: the tasks deferred, by when they are due;
//! - background loops: [`heartbeat`] (leases, server state),
//!   [`subscriptions`] (`asynq:cancel`, enqueue wake-ups) and
//!   [`maintenance`] (forwarding, deferred tasks woken, lease recovery,
//!   cleanup).

mod active;
mod capacity;
mod execute;
mod heartbeat;
mod maintenance;
mod options;
mod run;
mod settle;
mod subscriptions;
mod task;
mod wakeups;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::Client;
use super::completions::Completions;
use super::message::{ServerInfo, TaskMessage};
use active::ActiveTasks;
pub(crate) use options::ConsumerOptions;
pub use task::SkipRetry;
pub(crate) use task::{HandlerError, SNOOZES_HEADER, Task};
use wakeups::Wakeups;

type HandlerFuture = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send>>;
/// The wait before retry n + 1 of a task, n failed runs so far.
pub(crate) type RetryDelay = Arc<dyn Fn(u32) -> std::time::Duration + Send + Sync>;
type BoxedHandler = Arc<dyn Fn(Task) -> HandlerFuture + Send + Sync>;

/// Called with a task and its error before the task is archived (see
/// [`Consumer::before_archive`]); an `Err` (why) keeps the task out of
/// the archive.
pub(crate) type ArchiveHook = Arc<
    dyn Fn(Arc<TaskMessage>, String) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>>
        + Send
        + Sync,
>;

/// Called with a task whose run was cancelled (see
/// [`Consumer::on_cancel`]); says what becomes of the task.
pub(crate) type CancelHook = Arc<
    dyn Fn(Arc<TaskMessage>) -> Pin<Box<dyn Future<Output = CancelVerdict> + Send>> + Send + Sync,
>;

/// What a [`CancelHook`] makes of a cancelled run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CancelVerdict {
    /// The cancel is not final for this task: it fails as in Go asynq
    /// (`context canceled`, retried or archived).
    Failed,
    /// Final and recorded: the task is deleted, neither retried nor
    /// archived.
    Final,
    /// Final, but its record failed (why): the task is kept and retried
    /// later, as a failure whose record failed is.
    Unrecorded(String),
}

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
pub(crate) struct Consumer {
    client: Client,
    options: ConsumerOptions,
    handlers: HashMap<String, BoxedHandler>,
    before_archive: Option<ArchiveHook>,
    retry_delays: HashMap<String, RetryDelay>,
    on_cancel: Option<CancelHook>,
}

impl RunningConsumer {
    /// The wait before the retry of `message`'s task after its
    /// `message.retried`-th failed run: its type's own delay, else the
    /// options'.
    fn retry_delay(&self, message: &TaskMessage) -> std::time::Duration {
        let retried = u32::try_from(message.retried).unwrap_or(0);
        match self.retry_delays.get(&message.r#type) {
            Some(delay) => delay(retried),
            None => (self.options.retry_delay)(retried),
        }
    }
}

impl Consumer {
    /// A consumer that takes tasks through `client`, run as `options` say, with
    /// no handlers yet.
    pub(crate) fn new(client: Client, options: ConsumerOptions) -> Self {
        Self {
            client,
            options,
            handlers: HashMap::new(),
            before_archive: None,
            retry_delays: HashMap::new(),
            on_cancel: None,
        }
    }

    /// Lets `hook` make a run cancelled through `asynq:cancel` final: it
    /// is called with the task (the worker records the cancellation of a
    /// listener's run) and says what becomes of it: deleted
    /// ([`CancelVerdict::Final`]) or failed as in Go asynq. Without a
    /// hook, every cancelled run fails as in Go asynq (retried).
    pub(crate) fn on_cancel(&mut self, hook: CancelHook) -> &mut Self {
        self.on_cancel = Some(hook);
        self
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
    pub(crate) fn handle<F, Fut>(&mut self, task_type: impl Into<String>, handler: F) -> &mut Self
    where
        F: Fn(Task) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
    {
        let boxed: BoxedHandler = Arc::new(move |task| Box::pin(handler(task)));
        self.handlers.insert(task_type.into(), boxed);
        self
    }

    /// Retries the failed runs of the tasks of type `task_type` (exactly)
    /// after `delay` rather than the options' `retry_delay`: whatever the
    /// failure (an error, a panic, the timeout, a cancel, an expired
    /// lease). A listener's backoff.
    pub(crate) fn retry_delay_of(
        &mut self,
        task_type: impl Into<String>,
        delay: RetryDelay,
    ) -> &mut Self {
        self.retry_delays.insert(task_type.into(), delay);
        self
    }
}

/// A [`Consumer`] once it runs: the state shared by its loop, its running
/// tasks and its background loops.
struct RunningConsumer {
    client: Client,
    completions: Completions,
    handlers: HashMap<String, BoxedHandler>,
    before_archive: Option<ArchiveHook>,
    /// The retry delays of task types of their own
    /// ([`Consumer::retry_delay_of`]).
    retry_delays: HashMap<String, RetryDelay>,
    on_cancel: Option<CancelHook>,
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
}
