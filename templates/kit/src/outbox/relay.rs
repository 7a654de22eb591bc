//! The relay: moves committed outbox rows to the queue, at least once.
//!
//! One round, in one short transaction:
//! 1. claim up to `OUTBOX_BATCH_SIZE` unpublished rows in id order with
//!    `FOR UPDATE SKIP LOCKED`, so replicas never claim the same row, and
//!    mark them published, in one statement;
//! 2. enqueue each as an asynq task `event:<name>` whose id is the event id,
//!    into every queue of `OUTBOX_QUEUES`, all in one pipelined round trip
//!    (an id the queue already has is a duplicate, which counts as
//!    published);
//! 3. unmark the rows that did not reach every queue, if any, and commit.
//!
//! While a full batch is enqueued, the next batch is claimed in a second
//! transaction, so that draining a backlog the claim's time hides behind
//! the enqueue's (in [`Relay::run`]; [`Relay::publish_batch`] runs one
//! round alone). Rows are still published in id order within a round.
//!
//! Keyset claiming: while rounds come back full (draining a backlog), each
//! claim starts its index scan after the highest row id the previous round
//! claimed, so it never walks the entries of rows already published, which
//! pile up while any session holds an old snapshot (vacuum cannot remove
//! them). A row id is taken at insert, not at commit, so a transaction that
//! commits late can leave an unpublished row below that point: a round that
//! comes back short, and every `RESCAN_EVERY`th full round, makes the next
//! claim start from the beginning again, and such a row is published then.
//!
//! The marks belong to the round's transaction: a crash before the commit
//! rolls them back; the next round enqueues the
//! same ids again, which the queue reports as duplicates, so no event is
//! lost and none is queued twice. A full batch re-polls at once; a short one
//! waits for the poll interval or a wake-up, and a round that claimed
//! anything is followed by the next no sooner than [`GATHER`] after its
//! start (an idle relay's wake-up starts a round at once); a failed round
//! backs off exponentially with jitter, up to 30 seconds.
//!
//! Delayed events (`kit::dispatch_at`) are not in `outbox_events` until
//! they are due: the relay's mover (`super::later::mover`), on a task of
//! its own, moves them in and wakes the relay.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use super::{ClaimedEvent, Store};
use crate::config::OutboxConfig;
use crate::queue::{self, Client, EnqueueOutcome, NewTask};
use crate::trace_context::TraceContext;

/// How often a task may be retried before it is archived (Go asynq's default).
pub(crate) const MAX_RETRY: u32 = 25;
/// How long one handler run may take before asynq considers it failed.
pub(crate) const TASK_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// How a relay round's transaction begins, in the same round trip as the
/// `BEGIN`: its commit does not wait for the disk. That is safe here, and
/// only here: a mark lost in a database crash just makes the next round
/// enqueue those events again, which the queue reports as duplicates of the
/// tasks it already has. It takes about a third off every round.
const RELAY_BEGIN: &str = "BEGIN; SET LOCAL synchronous_commit = off";

/// The shortest time from one round's start to the next one's while events
/// keep coming (the last round claimed some): a wake-up within it waits for
/// its end, so that under load a round carries the events of a few
/// milliseconds, not one or two (each round costs three round trips to
/// Postgres, one to Valkey, and a claim whose cost hardly depends on how
/// many rows it takes). An idle relay's wake-up starts a round at once.
pub(crate) const GATHER: Duration = Duration::from_millis(5);

/// Full rounds in a row after which the claim starts from the beginning
/// again, so that under a backlog that never ends, a row that committed
/// late below the keyset position waits at most this many rounds.
pub(crate) const RESCAN_EVERY: u32 = 100;

/// The longest wait between failed rounds.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// What every event's task type starts with.
pub(crate) const EVENT_TASK_PREFIX: &str = "event:";

/// The asynq task type of an event: `event:<name>`.
pub(crate) fn event_task_type(event_name: &str) -> String {
    format!("{EVENT_TASK_PREFIX}{event_name}")
}

/// The event task of `envelope` in `queue`, with the id `task_id` (the
/// event id, as the relay queues it), its headers the trace context of its
/// dispatch, kept `retention` after it succeeds.
pub(crate) fn event_task(
    envelope: &super::Envelope,
    task_id: String,
    queue: &str,
    retention: Duration,
) -> NewTask {
    let payload = serde_json::to_vec(envelope).expect("an envelope serialises");
    NewTask::new(event_task_type(&envelope.name), task_id, payload)
        .queue(queue)
        .headers(crate::trace_context::task_headers(&envelope.metadata))
        .max_retry(MAX_RETRY)
        .timeout(TASK_TIMEOUT)
        .retention(retention)
}

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Round {
    /// Rows claimed.
    pub(crate) claimed: usize,
    /// Rows marked published (new tasks and duplicates).
    pub(crate) published: usize,
    /// Tasks the queues already had (with several `OUTBOX_QUEUES`, an
    /// event counts once per queue).
    pub(crate) duplicates: usize,
}

/// Why a round failed. Rows of the round that did reach the queue are
/// marked published before the error is returned.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RelayError {
    /// Claiming or marking rows failed.
    #[error("outbox database error")]
    Database(#[from] sqlx::Error),
    /// Enqueuing failed part-way through the batch.
    #[error("queue error after {published} of {claimed} events were published")]
    Queue {
        /// Events claimed in the round.
        claimed: usize,
        /// Events published before the failure.
        published: usize,
        /// The queue's error.
        #[source]
        source: queue::QueueError,
    },
}

/// A claimed batch, marked published in its still-open transaction.
struct Batch {
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    events: Vec<ClaimedEvent>,
}

/// The relay's instruments. Cloning shares them.
#[derive(Debug, Clone)]
pub(crate) struct RelayMetrics {
    /// Events marked published (including duplicates).
    pub(crate) published: Counter,
    /// Events the queue already had.
    pub(crate) duplicates: Counter,
    /// Relay rounds done, empty ones included.
    pub(crate) rounds: Counter,
    /// Failed relay rounds.
    pub(crate) errors: Counter,
    /// Unpublished events.
    pub(crate) backlog: Gauge,
    /// Age of the oldest unpublished event, in seconds.
    pub(crate) oldest_unpublished_age: Gauge<f64, AtomicU64>,
    /// When the last relay round (good or failed) finished, in Unix
    /// seconds; 0 before the first.
    pub(crate) last_round_unix: Gauge<f64, AtomicU64>,
    /// How long each round took (claim, enqueue, commit), in seconds.
    pub(crate) round_duration: Histogram,
}

impl Default for RelayMetrics {
    fn default() -> Self {
        Self {
            published: Counter::default(),
            duplicates: Counter::default(),
            rounds: Counter::default(),
            errors: Counter::default(),
            backlog: Gauge::default(),
            oldest_unpublished_age: Gauge::default(),
            last_round_unix: Gauge::default(),
            // 1 ms to about 16 s.
            round_duration: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
        }
    }
}

/// The relay for one worker process.
pub(crate) struct Relay {
    pool: PgPool,
    queue: Client,
    store: Store,
    batch_size: u32,
    poll_interval: Duration,
    task_retention: Duration,
    wake: Arc<Notify>,
    metrics: RelayMetrics,
    /// Every event goes to each of these queues (`OUTBOX_QUEUES`).
    queue_names: Vec<String>,
    /// The next claim starts after this row id (0: from the beginning).
    after: AtomicI64,
    /// Full rounds since the claim last started from the beginning.
    full_rounds: AtomicU32,
}

impl Relay {
    /// A relay that claims from `pool` and enqueues to `queue`, with the
    /// batch size, poll interval, task retention and queues of `config`.
    pub(crate) fn new(
        pool: PgPool,
        queue: Client,
        config: &OutboxConfig,
        metrics: RelayMetrics,
    ) -> Self {
        Self {
            pool,
            queue,
            store: Store,
            batch_size: config.batch_size.max(1),
            poll_interval: config.poll_interval,
            task_retention: config.task_retention,
            wake: Arc::new(Notify::new()),
            metrics,
            queue_names: config.queues.names().to_vec(),
            after: AtomicI64::new(0),
            full_rounds: AtomicU32::new(0),
        }
    }

    /// Publishes to `queue` alone instead of `OUTBOX_QUEUES` (the kit's
    /// tests use their own).
    #[cfg(test)]
    pub(crate) fn with_queue(self, queue: impl Into<String>) -> Self {
        self.with_queues(vec![queue.into()])
    }

    /// Publishes every event to each of `queues` instead of `OUTBOX_QUEUES`
    /// (the kit's tests).
    #[cfg(test)]
    pub(crate) fn with_queues(mut self, queues: Vec<String>) -> Self {
        assert!(!queues.is_empty(), "a relay needs a queue to publish to");
        self.queue_names = queues;
        self
    }

    /// A handle that wakes the relay at once (for example right after a
    /// commit that stored events); wake-ups are coalesced.
    pub(crate) fn waker(&self) -> Arc<Notify> {
        Arc::clone(&self.wake)
    }

    /// One round: claim, enqueue, mark, commit (the kit's tests drive the
    /// relay round by round).
    #[cfg(test)]
    pub(crate) async fn publish_batch(&self) -> Result<Round, RelayError> {
        // Until this round ends well, the next one starts from the beginning.
        let after = self.after.swap(0, Ordering::Relaxed);
        let batch = self.claim_batch(after).await?;
        let resume_after = self.resume_after(&batch.events);
        let round = self.deliver(batch).await?;
        self.after.store(resume_after, Ordering::Relaxed);
        Ok(round)
    }

    /// One round of [`run`](Self::run): claim, enqueue, mark, commit, but
    /// while a full batch is enqueued the next batch is already claimed,
    /// in a second transaction (the round after starts with it, from
    /// `next`). Draining a backlog, the claim's time then hides behind the
    /// enqueue's. A failed round drops the claim in hand, which rolls it
    /// back, and the next claim starts from the beginning.
    async fn overlapped_round(&self, next: &mut Option<Batch>) -> Result<Round, RelayError> {
        let batch = match next.take() {
            Some(batch) => batch,
            None => {
                let after = self.after.swap(0, Ordering::Relaxed);
                self.claim_batch(after).await?
            }
        };
        let resume_after = self.resume_after(&batch.events);
        // Whatever happens, the next claim made afresh starts from the
        // beginning, unless the overlapped claim below fails after a good
        // round.
        self.after.store(0, Ordering::Relaxed);
        if resume_after == 0 {
            // A short round, or a rescan from the beginning next: nothing
            // to overlap with.
            return self.deliver(batch).await;
        }
        let (round, following) = tokio::join!(self.deliver(batch), self.claim_batch(resume_after));
        // A failed round drops the following claim, which rolls it back.
        let round = round?;
        match following {
            Ok(following) => *next = Some(following),
            Err(err) => {
                tracing::warn!(error = %error_chain(&err), "claiming the next outbox batch failed");
                self.after.store(resume_after, Ordering::Relaxed);
            }
        }
        Ok(round)
    }

    /// Begins a round's transaction and claims (and marks) its batch, after
    /// row id `after`, or from the beginning when nothing is left after it.
    async fn claim_batch(&self, after: i64) -> Result<Batch, RelayError> {
        let mut tx = self.pool.begin_with(RELAY_BEGIN).await?;
        let mut events = self.claim(&mut tx, after).await?;
        if events.is_empty() && after > 0 {
            events = self.claim(&mut tx, 0).await?;
        }
        Ok(Batch { tx, events })
    }

    /// Enqueues a claimed batch, unmarks what did not reach every queue,
    /// and commits.
    async fn deliver(&self, batch: Batch) -> Result<Round, RelayError> {
        let Batch {
            mut tx,
            events: claimed,
        } = batch;
        if claimed.is_empty() {
            tx.commit().await?;
            return Ok(Round::default());
        }
        // One task per event and queue, in event order.
        let tasks: Vec<NewTask> = claimed
            .iter()
            .flat_map(|event| {
                self.queue_names
                    .iter()
                    .map(move |queue| self.task_for(event, queue))
            })
            .collect();
        let span = crate::spans::send(&self.queue_names, tasks.len());
        if crate::otlp::exporting() {
            for event in &claimed {
                if let Some(context) = TraceContext::from_metadata(&event.envelope.metadata) {
                    span.add_link(context.span_context());
                }
            }
        }
        let results = match self.queue.enqueue(&tasks).instrument(span).await {
            Ok(results) => results,
            Err(source) => {
                // Nothing is known to have reached the queue; the rows stay
                // unpublished and the next round retries them.
                tx.rollback().await?;
                return Err(RelayError::Queue {
                    claimed: claimed.len(),
                    published: 0,
                    source,
                });
            }
        };
        // An event is published once it reached every queue; if one queue
        // failed, the next round enqueues it again, and the queues that have
        // it already report duplicates.
        let mut published = Vec::with_capacity(claimed.len());
        let mut duplicates = 0;
        let mut first_error = None;
        let mut results = results.into_iter();
        for event in &claimed {
            let mut reached_all = true;
            for result in results.by_ref().take(self.queue_names.len()) {
                match result {
                    // Cancelled: only a task that asks is checked (the
                    // fan-out's); the relay's are not.
                    Ok(EnqueueOutcome::Enqueued | EnqueueOutcome::Cancelled) => {}
                    Ok(EnqueueOutcome::Duplicate) => duplicates += 1,
                    Err(err) => {
                        reached_all = false;
                        first_error.get_or_insert(err);
                    }
                }
            }
            if reached_all {
                published.push(event.row_id);
            }
        }
        if published.len() < claimed.len() {
            let undelivered: Vec<i64> = claimed
                .iter()
                .map(|event| event.row_id)
                .filter(|row_id| !published.contains(row_id))
                .collect();
            self.store
                .unmark(&mut tx, &undelivered)
                .instrument(tracing::debug_span!(
                    "outbox.unmark",
                    rows = undelivered.len()
                ))
                .await?;
        }
        tx.commit().await?;
        self.metrics.published.inc_by(published.len() as u64);
        self.metrics.duplicates.inc_by(duplicates as u64);
        let round = Round {
            claimed: claimed.len(),
            published: published.len(),
            duplicates,
        };
        match first_error {
            None => Ok(round),
            Some(source) => Err(RelayError::Queue {
                claimed: round.claimed,
                published: round.published,
                source,
            }),
        }
    }

    /// Claims the next batch, after row id `after`.
    async fn claim(
        &self,
        tx: &mut sqlx::PgConnection,
        after: i64,
    ) -> Result<Vec<ClaimedEvent>, sqlx::Error> {
        self.store
            .claim_and_mark(tx, self.batch_size, after)
            .instrument(tracing::debug_span!(
                "outbox.claim",
                limit = self.batch_size,
                after
            ))
            .await
    }

    /// Where the next claim starts if this round succeeds: after its last
    /// row when it was full, from the beginning when it was short or when
    /// [`RESCAN_EVERY`] full rounds have passed.
    fn resume_after(&self, claimed: &[ClaimedEvent]) -> i64 {
        let full = claimed.len() as u32 >= self.batch_size;
        if full && self.full_rounds.fetch_add(1, Ordering::Relaxed) + 1 < RESCAN_EVERY {
            return claimed.last().map_or(0, |event| event.row_id);
        }
        self.full_rounds.store(0, Ordering::Relaxed);
        0
    }

    fn task_for(&self, event: &ClaimedEvent, queue: &str) -> NewTask {
        event_task(
            &event.envelope,
            event.envelope.id.to_string(),
            queue,
            self.task_retention,
        )
    }

    /// Runs rounds until `shutdown` is cancelled. The round in hand gets
    /// `SHUTDOWN_GRACE` to finish; one still waiting on the database or
    /// the queue then is dropped, which rolls it back (its events go out in
    /// the next round, the queue reporting any it already has as
    /// duplicates). No transaction is held while it waits.
    ///
    /// Beside it, on a task of its own, the mover of delayed events
    /// (`super::later::mover`) moves due events into the outbox every
    /// second and wakes the relay: the claim never reads a waiting event.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let mover = tokio::spawn(super::later::mover::run(
            self.pool.clone(),
            self.waker(),
            shutdown.clone(),
        ));
        let mut backoff = Backoff::new(self.poll_interval, MAX_BACKOFF);
        // The batch claimed while the previous one was enqueued, if any.
        let mut next = None;
        while !shutdown.is_cancelled() {
            let started = std::time::Instant::now();
            let round = tokio::select! {
                round = self.overlapped_round(&mut next) => round,
                () = grace_after(&shutdown) => {
                    tracing::warn!("relay round abandoned at shutdown; its events stay unpublished");
                    break;
                }
            };
            self.metrics.rounds.inc();
            self.metrics
                .round_duration
                .observe(started.elapsed().as_secs_f64());
            self.metrics.last_round_unix.set(unix_now());
            let mut busy = false;
            let wait = match round {
                Ok(round) => {
                    backoff.reset();
                    busy = round.claimed > 0;
                    if round.claimed > 0 {
                        tracing::debug!(
                            published = round.published,
                            duplicates = round.duplicates,
                            "outbox round"
                        );
                    }
                    if round.claimed as u32 >= self.batch_size {
                        continue;
                    }
                    self.poll_interval
                }
                Err(err) => {
                    self.metrics.errors.inc();
                    let wait = backoff.next_delay();
                    tracing::warn!(error = %error_chain(&err), retry_in = ?wait, "outbox round failed");
                    wait
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(wait) => {}
                () = self.wake.notified() => {}
            }
            if busy {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep_until((started + GATHER).into()) => {}
                }
            }
        }
        if let Err(err) = mover.await {
            tracing::error!(error = %err, "the mover of delayed events panicked");
        }
        tracing::info!("outbox relay stopped");
    }
}

/// How long the round in hand may go on after shutdown began.
pub(crate) const SHUTDOWN_GRACE: Duration = Duration::from_millis(500);

/// Completes [`SHUTDOWN_GRACE`] after `shutdown` is cancelled.
async fn grace_after(shutdown: &CancellationToken) {
    shutdown.cancelled().await;
    tokio::time::sleep(SHUTDOWN_GRACE).await;
}

/// The time now, in Unix seconds.
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// An error and its causes on one line.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Exponential backoff with jitter: the ceiling doubles from `base` with
/// every failure up to `cap`; each delay is drawn between 3/4 of the ceiling
/// and the ceiling, so replicas that failed together do not retry together.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    base: Duration,
    cap: Duration,
    failures: u32,
}

impl Backoff {
    pub(crate) fn new(base: Duration, cap: Duration) -> Self {
        Self {
            base: base.max(Duration::from_millis(10)).min(cap),
            cap,
            failures: 0,
        }
    }

    /// The ceiling of the next delay, without jitter.
    pub(crate) fn ceiling(&self) -> Duration {
        self.base
            .saturating_mul(1 << self.failures.min(20))
            .min(self.cap)
    }

    /// The delay before the next attempt, and one more failure counted.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let ceiling = self.ceiling();
        self.failures = self.failures.saturating_add(1);
        ceiling.mul_f64(0.75 + 0.25 * fastrand::f64())
    }

    /// Back to the normal cadence after a good round.
    pub(crate) fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_with_bounded_jitter() {
        let mut backoff = Backoff::new(Duration::from_secs(1), MAX_BACKOFF);
        let mut ceilings = Vec::new();
        for _ in 0..8 {
            let ceiling = backoff.ceiling();
            let delay = backoff.next_delay();
            assert!(
                delay <= ceiling && delay >= ceiling.mul_f64(0.75),
                "{delay:?} vs {ceiling:?}"
            );
            ceilings.push(ceiling.as_secs());
        }
        assert_eq!(ceilings, [1, 2, 4, 8, 16, 30, 30, 30]);
        backoff.reset();
        assert_eq!(backoff.ceiling(), Duration::from_secs(1));
    }

    #[test]
    fn event_tasks_are_typed_by_event_name() {
        assert_eq!(event_task_type("orderPlaced"), "event:orderPlaced");
    }
}
