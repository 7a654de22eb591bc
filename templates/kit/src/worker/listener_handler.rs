//! The handler of one listener's tasks ([`ListenerHandler`]), step by
//! step: the turn of an ordered listener's run in its key's chain, the
//! listener's limits, the run itself ([`run_listener`], which the test
//! drain uses too; it turns a [`Snooze`] into a deferral, which the drain
//! reports as snoozed), and what follows
//! it (the failure it no longer has, the metrics, the chain moved on).

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;

use super::failures;
use super::limits::{Acquired, Limiter, Permit};
use super::listeners::Listener;
use super::metrics::ListenerMetrics;
use super::ordering::{End, Fence, Moved, ORDERED_HEADER, Ordering, Superseded, Turn};
use super::retry_policy::Snooze;
use crate::database::Transactor;
use crate::outbox::Envelope;
use crate::queue::{HandlerError, Task};
use crate::trace_context::{self, TraceContext};

/// How long a run that is not its chain's head waits in the queue's
/// schedule before it looks again; the run before it sends it to pending
/// as soon as it moves its chain on.
const WAIT_FOR_TURN: Duration = Duration::from_secs(30);

/// The handler of `listener:<event>:<listener>` tasks.
#[derive(Clone)]
pub(crate) struct ListenerHandler {
    listener: Listener,
    transactor: Transactor,
    metrics: ListenerMetrics,
    /// Counts the deliveries the listener's inbox skipped.
    duplicates: Counter,
    ordering: Ordering,
    /// `None` for a listener without limits (it asks Valkey nothing).
    limiter: Option<Limiter>,
}

/// The turn a run of a chain holds while it runs.
struct Held {
    key: String,
    token: i64,
    /// The run after it, as its turn saw it.
    next: Option<String>,
    /// Its task was made again from the chain (a failure of it may be
    /// recorded).
    rebuilt: bool,
}

impl ListenerHandler {
    pub(crate) fn new(
        listener: Listener,
        transactor: Transactor,
        metrics: ListenerMetrics,
        ordering: Ordering,
        limiter: Option<Limiter>,
    ) -> Self {
        let duplicates = metrics.inbox_duplicates_of(listener.event(), listener.name());
        Self {
            listener,
            transactor,
            metrics,
            duplicates,
            ordering,
            limiter,
        }
    }

    /// Runs the listener on `task`, in its turn for an ordered listener:
    /// the turn, the limits, the run, the failure it no longer has, the
    /// metrics, and the chain moved on.
    pub(crate) async fn handle(&self, task: Task) -> Result<(), HandlerError> {
        let held = match self.take_turn(&task).await? {
            Step::Run(held) => held,
            Step::Return(result) => return result,
        };
        let permit = self.acquire_limit(&task).await?;
        let (queue, task_id) = (task.queue.clone(), task.id.clone());
        let failed_before = task.failed_before || held.as_ref().is_some_and(|held| held.rebuilt);
        let fence = held
            .as_ref()
            .map(|held| Fence::new(self.ordering.queue_client(), &queue, &task_id, held.token));
        let started = std::time::Instant::now();
        let result = self.run(task, fence.clone()).await;
        if let Some(permit) = permit {
            permit.release().await;
        }
        if result.is_ok() && failed_before {
            self.forget_failure(task_id.clone());
        }
        self.record(&result, started.elapsed());
        match (held, fence) {
            (Some(held), Some(fence)) => {
                self.after_turn(&queue, &task_id, held, &fence, result)
                    .await
            }
            _ => result,
        }
    }

    /// The turn of `task` if it is a run of an ordered listener's chain:
    /// run it (holding the turn), or return at once (done already, or
    /// waiting for its turn).
    async fn take_turn(&self, task: &Task) -> Result<Step, HandlerError> {
        let key = self
            .listener
            .ordered()
            .and_then(|_| task.headers.get(ORDERED_HEADER));
        let Some(key) = key else {
            return Ok(Step::Run(None));
        };
        Ok(
            match self.ordering.turn(self.listener.name(), key, task).await? {
                Turn::Now {
                    token,
                    next,
                    rebuilt,
                } => Step::Run(Some(Held {
                    key: key.clone(),
                    token,
                    next,
                    rebuilt,
                })),
                Turn::Done => Step::Return(Ok(())),
                Turn::After(_) | Turn::Rejoined => Step::Return(Err(HandlerError::defer(
                    chrono::Utc::now()
                        + chrono::TimeDelta::from_std(WAIT_FOR_TURN).unwrap_or_default(),
                ))),
            },
        )
    }

    /// A permit of the listener's limits, or the task deferred until one
    /// may come: its worker slot is freed meanwhile (module `limits`).
    async fn acquire_limit(&self, task: &Task) -> Result<Option<Permit>, HandlerError> {
        let Some(limiter) = &self.limiter else {
            return Ok(None);
        };
        let partition = self.listener.partition_of(&task.payload);
        match limiter.acquire(&partition, task).await? {
            Acquired::Granted(permit) => Ok(Some(permit)),
            Acquired::Wait { until, limit } => {
                tracing::debug!(task = %task.id, limit = limit.as_str(), %until, "listener run waits for its limit");
                Err(HandlerError::defer(until))
            }
        }
    }

    /// The run itself ([`run_listener`]), holding `fence` when it holds its
    /// chain's turn.
    async fn run(&self, task: Task, fence: Option<Fence>) -> Result<(), HandlerError> {
        run_listener(
            &self.listener,
            self.transactor.clone(),
            task,
            self.duplicates.clone(),
            fence,
        )
        .await
    }

    /// A task that failed before and now succeeds has no failure left to
    /// keep (asynqmon's "run" of an archived task): forgotten beside the
    /// task's completion, not before it.
    fn forget_failure(&self, task_id: String) {
        let pool = self.transactor.pool().clone();
        tokio::spawn(async move {
            if let Err(err) = failures::forget(&pool, &[task_id]).await {
                tracing::warn!(error = %err, "could not forget the failure of a listener task that succeeded");
            }
        });
    }

    /// Counts the run, its outcome and how long it took; a snooze apart.
    fn record(&self, result: &Result<(), HandlerError>, took: Duration) {
        if result.as_ref().is_err_and(HandlerError::is_snooze) {
            self.metrics
                .record_snooze(self.listener.event(), self.listener.name());
            return;
        }
        self.metrics.record(
            self.listener.event(),
            self.listener.name(),
            result.is_ok(),
            took,
        );
    }

    /// After a run that held its chain's turn: a success moves the chain on
    /// (if the run still holds the turn); a run that no longer holds it
    /// leaves its task to the run that does.
    async fn after_turn(
        &self,
        queue: &str,
        task_id: &str,
        held: Held,
        fence: &Fence,
        result: Result<(), HandlerError>,
    ) -> Result<(), HandlerError> {
        match result {
            Ok(()) => {
                let moved = self
                    .ordering
                    .move_on(
                        queue,
                        self.listener.name(),
                        &held.key,
                        task_id,
                        Some(held.token),
                        End::Done,
                        held.next.as_deref(),
                    )
                    .await?;
                match moved {
                    Moved::On => Ok(()),
                    Moved::Superseded | Moved::NotFailed => {
                        Err(HandlerError::superseded(Superseded))
                    }
                }
            }
            Err(err) if err.is_superseded() => Err(err),
            // A failure is the task's only while the run holds its turn; one
            // that cannot tell (Valkey unreachable) leaves its task to the
            // recoverer rather than to the archive's move past.
            Err(err) => match fence.check().await {
                Ok(()) => Err(err),
                Err(check) => {
                    if !Superseded::is_in(&check) {
                        tracing::warn!(error = %check, "could not tell whether a failed run of an ordered listener still holds its turn; its task is left to the recoverer");
                    }
                    Err(HandlerError::superseded(Superseded))
                }
            },
        }
    }
}

/// What the turn says to do.
enum Step {
    /// Run the listener, holding the turn when it is a run of a chain.
    Run(Option<Held>),
    /// Return this at once.
    Return(Result<(), HandlerError>),
}

/// A `listener:<event>:<listener>` run: decodes the event and runs the
/// listener, inside the trace context of the task's headers or, without
/// one, of the dispatch (so events it dispatches in turn continue the same
/// trace).
///
/// A payload that is not an envelope at all is archived at once (retrying
/// cannot fix it), and so is a run that fails with a
/// [`SkipRetry`](crate::queue::SkipRetry); one that returns a
/// [`Snooze`] is deferred (a snooze the task counts), unless the task
/// snoozed as many times as its listener allows: then it is a failure. An
/// event
/// whose payload does not decode into the listener's type is retried, see
/// [`Listeners::listen`](super::listeners::Listeners::listen).
/// A run that holds a chain's turn carries its `fence`: its `ctx.once`
/// commits only while it holds it, and a run that no longer does is
/// [`HandlerError::superseded`].
pub(crate) async fn run_listener(
    listener: &Listener,
    transactor: Transactor,
    task: Task,
    duplicates: Counter,
    fence: Option<Fence>,
) -> Result<(), HandlerError> {
    let envelope: Envelope = serde_json::from_slice(&task.payload).map_err(|err| {
        HandlerError::skip_retry(anyhow::anyhow!(
            "task {} is not an event envelope: {err}",
            task.id
        ))
    })?;
    let span = tracing::info_span!(
        "listener",
        event = listener.event(),
        listener = listener.name(),
        event_id = %envelope.id,
        retried = task.retried,
    );
    // The consumer runs the task in the trace of its headers (the relay
    // writes them; a Go producer's middleware may have continued the trace
    // there). A task without them (enqueued by a relay that wrote none)
    // continues the trace of the dispatch, from the envelope.
    let fallback = TraceContext::from_metadata(&task.headers)
        .is_none()
        .then(|| TraceContext::from_metadata(&envelope.metadata))
        .flatten();
    let snoozed = crate::queue::snoozes_of(&task.headers);
    let run = listener.call_counted(envelope, task.headers, transactor, duplicates, fence);
    let run = tracing::Instrument::instrument(run, span);
    let result = match fallback {
        Some(parent) => trace_context::scope(parent.child(), run).await,
        None => run.await,
    };
    result.map_err(|err| {
        if Superseded::is_in(&err) {
            return HandlerError::superseded(err);
        }
        let bound = listener.policy().max_snoozes;
        match Snooze::find(&err) {
            Some(snooze) if snoozed < bound => HandlerError::snooze(later_by(snooze.duration())),
            Some(_) => HandlerError::from(err.context(format!(
                "snoozed {} times, past its bound of {bound}",
                u64::from(snoozed) + 1
            ))),
            None => HandlerError::from(err),
        }
    })
}

/// Now and `after`, or the latest time there is.
fn later_by(after: Duration) -> chrono::DateTime<chrono::Utc> {
    chrono::TimeDelta::from_std(after)
        .ok()
        .and_then(|after| chrono::Utc::now().checked_add_signed(after))
        .unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC)
}
