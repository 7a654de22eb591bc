//! Ordered listeners: a listener registered with
//! [`ListenerOptions::ordered`](super::listeners::ListenerOptions::ordered)
//! runs the events that share a key ([`Event::order_key`](crate::dispatch::Event::order_key))
//! one at a time, in the order their transactions committed, on whichever
//! worker, retries included. The chains live in Valkey, beside the queue
//! (template set 22; they were in Postgres before, [`from_postgres`]), each
//! step one script ([`scripts`]), under `ordered:{<database>}:` ([`keys`]).
//!
//! - **Commit order**: dispatching a keyed event takes the key's next
//!   sequence number in its own transaction, under the lock of the key's
//!   `outbox_keys` row (`crate::outbox::order`). The outbox's row id is
//!   taken at insert, so a transaction that commits late can have a lower id
//!   than rows already published; its sequence number is still the later one.
//!   A key's row goes once idle for the outbox's retention; a later event
//!   of the key numbers from 1 again, in a new epoch (the row's).
//! - **Fan-out in sequence**: the fan-out of a keyed event adds a run per
//!   ordered listener to that listener's chain for the key, in sequence
//!   order: an event task that reaches a worker before the one that
//!   precedes it waits in Valkey (its task completes) and is fanned out
//!   right after that one, by the script that fans that one out.
//! - **One run at a time**: only a chain's head is in the queue. When it
//!   succeeds, the worker moves the head on and the next run goes to the
//!   queue, in the same script on a single server; while it is retried, the
//!   runs behind it wait in their chain, not in the queue. So a Go asynq
//!   server sharing the queue never sees them; it must not register a
//!   handler for an ordered listener's task type, since its runs would not
//!   move the chain on.
//! - **A run that keeps failing** holds its key by default: archived (and
//!   recorded in `listener_failures`), the runs behind it wait until `outbox
//!   retry-archived` runs it again and it succeeds, or `outbox skip` moves past
//!   it; nothing releases it by a timeout, and the outbox's cleanup keeps its
//!   event and the later ones of its key. With
//!   [`OnFailure::MoveOn`](super::listeners::OnFailure::MoveOn), its failure
//!   is recorded, the task archived, and the key moves on.
//! - **Crashes**: every step is idempotent and healed by the rerun of the
//!   task that was interrupted: a fan-out whose heads were not queued (a
//!   cluster, where the worker queues them after the script) queues them
//!   when its task runs again; a run that moved its chain on but died before
//!   its next was queued queues it when it runs again (its listener is not
//!   called twice: its run is gone from the chain, [`Turn::Done`]).
//! - **Valkey losing writes**: with its append-only file, a restart or a
//!   failover loses the last writes, in order: a step lost with them is done
//!   again by its task, which is back in the queue (its completion came after
//!   it). Every 10 s the worker also queues again the heads that have been
//!   heads for 10 s or more; the queue takes a head it has as a duplicate.
//!   Valkey losing all its data loses the chains with the queue; see the
//!   project's README (the recovery replays the events).
//! - **Replays**: `outbox replay` of a keyed event that was fanned out
//!   already adds a run to the end of each ordered listener's chain: it runs
//!   after the runs of its key that wait already, and before the later ones.
//!   A replay of one that was not takes its turn as the event would.
//!   `outbox replay --listener` queues the listener's task alone, without
//!   the chain's mark: it runs at once, outside the order.
//!
//! Keys do not wait for each other: the heads of different keys run in
//! parallel, up to the workers' concurrency. An ordered run costs two
//! Valkey calls more than an unordered one (its turn, and the move on,
//! whose script enqueues the next run; the fan-out's script takes the place
//! of the unordered fan-out's enqueue), three on a cluster (where the
//! worker enqueues each head after its script), and nothing in Postgres.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use prost::Message as _;
use sqlx::PgPool;
use uuid::Uuid;

use crate::outbox::Metadata;
use crate::outbox::order::{ORDER_KEY, Place};
use crate::outbox::relay::{MAX_RETRY, TASK_TIMEOUT};
use crate::queue::message::TaskMessage;
use crate::queue::{Client, HandlerError, NewTask, QueueError};

use keys::Namespace;
use scripts::{FAN_OUT, MOVE_ON, MOVE_PAST, REQUEUE};

mod from_postgres;
mod keys;
mod scripts;
mod stale;

/// The header that marks a listener task as a run of a chain (its value is
/// the key). A listener task without it (queued before its listener was
/// ordered, or for an event without a key) runs as any other.
pub(crate) const ORDERED_HEADER: &str = "gpkit-ordered-key";

/// The listener tasks of one keyed event that join their chains: the
/// event's task (its queue, payload and headers, which each run's task
/// carries) and one run per ordered listener.
#[derive(Debug, Clone)]
pub(crate) struct EventRuns {
    /// The event's id.
    pub event_id: Uuid,
    /// The queue of the event's task.
    pub queue: String,
    /// The event task's payload: the envelope.
    pub payload: Vec<u8>,
    /// The event task's headers.
    pub headers: BTreeMap<String, String>,
    /// Its runs: one per ordered listener.
    pub runs: Vec<ChainRun>,
}

/// One ordered listener's run of an event.
#[derive(Debug, Clone)]
pub(crate) struct ChainRun {
    /// The chain's listener: the listener's name, shared by the listeners of
    /// that name of every event, so that they see their events in one order.
    pub listener: String,
    /// `listener:<event>:<listener>`.
    pub task_type: String,
    /// The task id (`listener_task_id`).
    pub task_id: String,
}

/// Where a run of a chain stands, when its task runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// It is the head: it runs.
    Now,
    /// It ran and its chain moved on (this is a rerun after a crash, or
    /// `outbox skip` moved past it): the listener is not called again.
    Done,
    /// Runs before it have not finished: how many.
    After(i64),
}

/// The chains of ordered listeners, in Valkey, and the queue their heads
/// go to. Its keys are named after the service's database
/// ([`Namespace`]).
#[derive(Clone)]
pub(crate) struct Ordering {
    pool: PgPool,
    queue: Client,
    keys: Arc<Namespace>,
    /// How long a listener task is kept after it succeeds.
    retention: Duration,
}

impl std::fmt::Debug for Ordering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ordering")
            .field("prefix", &self.keys.prefix)
            .field("retention", &self.retention)
            .finish_non_exhaustive()
    }
}

impl Ordering {
    /// Chains in Valkey whose heads go to `queue`, named after `pool`'s
    /// database ([`Namespace`]), kept `retention` after they succeed.
    pub(crate) fn new(pool: PgPool, queue: Client, retention: Duration) -> Self {
        let keys = Arc::new(Namespace::of_pool(&pool));
        Self {
            pool,
            queue,
            keys,
            retention,
        }
    }

    /// Fans out the keyed event at `place` to its ordered listeners
    /// (`event`), in its key's sequence, in one script ([`FAN_OUT`]): added
    /// to their chains now if the event before it was fanned out, else
    /// kept waiting until it is, and then each waiting event that is next.
    /// `replay`: the task is a replay, whose runs join the end of the
    /// chains if the event was fanned out already. The heads this makes
    /// go to the queue.
    pub(crate) async fn fan_out(
        &self,
        place: &Place,
        event: &EventRuns,
        replay: bool,
    ) -> Result<(), HandlerError> {
        let (wait_before, wait_after) = self.keys.wait_parts(&place.key, place.epoch);
        let mut script = FAN_OUT.prepare_invoke();
        self.delivery(&mut script);
        script
            .key(self.keys.runs())
            .key(self.keys.heads())
            .key(self.keys.fanned(&place.key, place.epoch))
            .key(self.keys.waiting())
            .arg(place.seq)
            .arg(i32::from(replay))
            .arg(millis(FANNED_KEPT.max(self.retention)))
            .arg(now_millis())
            .arg(wait_before)
            .arg(wait_after)
            .arg(event.event_id.to_string());
        let mut headers = event.headers.clone();
        headers.insert(ORDERED_HEADER.into(), place.key.clone());
        for run in &event.runs {
            let task = self.run_message(
                &run.task_type,
                &run.task_id,
                &event.queue,
                &event.payload,
                &headers,
            )?;
            self.run_args(
                &mut script,
                &place.key,
                &run.listener,
                &run.task_id,
                &event.queue,
                task,
            );
        }
        self.deliver(&script).await
    }

    /// Where the run of the task `task_id`, of `listener`'s chain for
    /// `key`, stands.
    pub(crate) async fn turn(
        &self,
        listener: &str,
        key: &str,
        task_id: &str,
    ) -> Result<Turn, QueueError> {
        let position: Option<i64> = redis::cmd("LPOS")
            .arg(self.keys.chain(listener, key))
            .arg(task_id)
            .query_async(&mut self.queue.connection())
            .await?;
        Ok(match position {
            None => Turn::Done,
            Some(0) => Turn::Now,
            Some(before) => Turn::After(before),
        })
    }

    /// The run of `task_id` is over (it succeeded, gave up under
    /// `MoveOn`, or `outbox skip` moved past it): it leaves its chain and,
    /// if it was the head, the next run of its key goes to the queue
    /// ([`MOVE_ON`]). Also for a run found done ([`Turn::Done`]): then the
    /// chain's head goes to the queue again, in case a crash kept it out.
    /// `listener` and `key` name the chain.
    pub(crate) async fn advance(
        &self,
        listener: &str,
        key: &str,
        task_id: &str,
    ) -> Result<(), HandlerError> {
        let mut script = MOVE_ON.prepare_invoke();
        self.delivery(&mut script);
        script
            .key(self.keys.chain(listener, key))
            .key(self.keys.runs())
            .key(self.keys.heads())
            .key(self.keys.listeners(key))
            .arg(task_id)
            .arg(now_millis())
            .arg(listener);
        self.deliver(&script).await
    }

    /// Moves the last fanned-out number of `key` in `epoch` on to `number`
    /// (unless it is later already) and fans out the waiting events that
    /// follow it ([`MOVE_PAST`]).
    async fn move_past(&self, key: &str, epoch: i64, number: i64) -> Result<(), HandlerError> {
        let (before, after) = self.keys.wait_parts(key, epoch);
        let mut script = MOVE_PAST.prepare_invoke();
        self.delivery(&mut script);
        script
            .key(self.keys.runs())
            .key(self.keys.heads())
            .key(self.keys.fanned(key, epoch))
            .key(self.keys.waiting())
            .arg(number)
            .arg(millis(FANNED_KEPT.max(self.retention)))
            .arg(now_millis())
            .arg(before)
            .arg(after);
        self.deliver(&script).await
    }

    /// Adds to `script` the arguments of a run that joins its chain (the
    /// scripts' `append`): of `listener` for `key`, the task `task_id` in
    /// `queue`, its message `task`.
    fn run_args(
        &self,
        script: &mut redis::ScriptInvocation<'_>,
        key: &str,
        listener: &str,
        task_id: &str,
        queue: &str,
        task: Vec<u8>,
    ) {
        script
            .arg(self.keys.chain(listener, key))
            .arg(self.keys.listeners(key))
            .arg(listener)
            .arg(task_id)
            .arg(queue)
            .arg(task);
    }

    /// Starts `script`, one that delivers heads (`scripts`' module doc):
    /// its first key and arguments.
    fn delivery(&self, script: &mut redis::ScriptInvocation<'_>) {
        script
            .key(self.keys.queues())
            .arg(i32::from(self.queue.enqueues_in_scripts()))
            .arg(chrono::Utc::now().timestamp_nanos_opt().unwrap_or_default())
            .arg(self.queue.wake_channel());
    }

    /// Runs `script`, one that delivers heads: on a single server it
    /// enqueued them (this process's consumers are woken), else the worker
    /// enqueues the task messages it returns.
    async fn deliver(&self, script: &redis::ScriptInvocation<'_>) -> Result<(), HandlerError> {
        let delivered: Vec<Vec<u8>> = script
            .invoke_async(&mut self.queue.connection())
            .await
            .map_err(QueueError::from)?;
        if self.queue.enqueues_in_scripts() {
            if !delivered.is_empty() {
                self.queue.enqueued_by_script();
            }
            return Ok(());
        }
        self.enqueue(&delivered).await
    }

    /// Queues again the heads that have been heads longer than
    /// `older_than`, at most [`REQUEUE_BATCH`] a call, oldest first (each
    /// counts as a head from now on, so that the next call looks at
    /// others): a head whose task Valkey lost would hold its key for ever,
    /// and `outbox replay` adds runs at the chains' ends, behind it. A head
    /// the queue has (waiting, running, retried or archived) is a duplicate
    /// and left as it is. How many heads it looked at.
    pub(crate) async fn requeue_old_heads(
        &self,
        older_than: Duration,
    ) -> Result<usize, HandlerError> {
        let now = now_millis();
        let heads: Vec<Vec<u8>> = REQUEUE
            .key(self.keys.heads())
            .key(self.keys.runs())
            .arg(now - millis(older_than))
            .arg(now)
            .arg(REQUEUE_BATCH)
            .invoke_async(&mut self.queue.connection())
            .await
            .map_err(QueueError::from)?;
        let count = heads.len();
        self.enqueue(&heads).await?;
        Ok(count)
    }

    /// The chain of the run of `task_id`, if it is in one.
    pub(crate) async fn run_of(&self, task_id: &str) -> Result<Option<RunOf>, QueueError> {
        let run: Option<Vec<u8>> = redis::cmd("HGET")
            .arg(self.keys.runs())
            .arg(task_id)
            .query_async(&mut self.queue.connection())
            .await?;
        Ok(run.as_deref().and_then(StoredRun::decode).map(|run| RunOf {
            listener: run.listener,
            key: run.key,
        }))
    }

    /// What ordering holds back now: counts from Valkey, and the heads
    /// that failed for good from `listener_failures`.
    pub(crate) async fn held(&self) -> anyhow::Result<Held> {
        let failed: Vec<String> = sqlx::query_scalar("SELECT task_id FROM listener_failures")
            .fetch_all(&self.pool)
            .await?;
        let mut pipe = redis::pipe();
        pipe.zcard(self.keys.heads())
            .hlen(self.keys.runs())
            .zcard(self.keys.waiting());
        let (heads, runs, waiting_events, failed_heads): (i64, i64, i64, Vec<Option<f64>>) =
            if failed.is_empty() {
                let (heads, runs, waiting): (i64, i64, i64) = pipe
                    .query_async(&mut self.queue.connection())
                    .await
                    .map_err(QueueError::from)?;
                (heads, runs, waiting, Vec::new())
            } else {
                pipe.cmd("ZMSCORE").arg(self.keys.heads()).arg(&failed);
                pipe.query_async(&mut self.queue.connection())
                    .await
                    .map_err(QueueError::from)?
            };
        let blocked_keys = failed_heads.iter().flatten().count();
        Ok(Held {
            blocked_keys: i64::try_from(blocked_keys).unwrap_or(i64::MAX),
            waiting_runs: (runs - heads).max(0),
            waiting_events,
        })
    }

    /// The runs of the event `event_id`, of key `key`, still in their
    /// chains.
    pub(crate) async fn standing(
        &self,
        event_id: Uuid,
        key: &str,
    ) -> Result<Vec<Standing>, QueueError> {
        let mut conn = self.queue.connection();
        let listeners: Vec<String> = redis::cmd("SMEMBERS")
            .arg(self.keys.listeners(key))
            .query_async(&mut conn)
            .await?;
        let mut standing = Vec::new();
        for listener in listeners {
            let chain: Vec<String> = redis::cmd("LRANGE")
                .arg(self.keys.chain(&listener, key))
                .arg(0)
                .arg(-1)
                .query_async(&mut conn)
                .await?;
            if chain.is_empty() {
                continue;
            }
            let runs: Vec<Option<Vec<u8>>> = redis::cmd("HMGET")
                .arg(self.keys.runs())
                .arg(&chain)
                .query_async(&mut conn)
                .await?;
            for (after, (task_id, run)) in chain.iter().zip(runs).enumerate() {
                let Some(run) = run.as_deref().and_then(StoredRun::decode) else {
                    continue;
                };
                if run.event_id != Some(event_id) {
                    continue;
                }
                standing.push(Standing {
                    task_id: task_id.clone(),
                    listener: run.listener,
                    key: run.key,
                    after: i64::try_from(after).unwrap_or(i64::MAX),
                    waits_for: (after > 0).then(|| chain[0].clone()),
                });
            }
        }
        standing.sort_by(|a, b| a.listener.cmp(&b.listener));
        Ok(standing)
    }

    /// The runs of the event `event_id`, with `metadata`, still in their
    /// chains: none for an event without a key.
    pub(crate) async fn standing_of(
        &self,
        event_id: Uuid,
        metadata: &Metadata,
    ) -> Result<Vec<Standing>, QueueError> {
        match metadata.get(ORDER_KEY) {
            Some(key) => self.standing(event_id, key).await,
            None => Ok(Vec::new()),
        }
    }

    /// Queues `heads`, the task messages of runs (none: no call); a task
    /// the queue has already is left as it is.
    async fn enqueue(&self, heads: &[Vec<u8>]) -> Result<(), HandlerError> {
        let tasks: Vec<NewTask> = heads
            .iter()
            .filter_map(|head| TaskMessage::decode(head.as_slice()).ok())
            .map(|head| {
                self.run_task(
                    NewTask::new(head.r#type, head.id, head.payload)
                        .queue(head.queue)
                        .headers(head.headers),
                )
            })
            .collect();
        if tasks.is_empty() {
            return Ok(());
        }
        for result in self.queue.enqueue(&tasks).await? {
            result?;
        }
        Ok(())
    }

    /// The task message of a run, as its chain keeps it and as the queue
    /// writes it (`headers` with the key, [`ORDERED_HEADER`]).
    fn run_message(
        &self,
        task_type: &str,
        task_id: &str,
        queue: &str,
        payload: &[u8],
        headers: &BTreeMap<String, String>,
    ) -> Result<Vec<u8>, QueueError> {
        let task = NewTask::new(task_type, task_id, payload.to_vec())
            .queue(queue)
            .headers(headers.clone());
        Ok(self.run_task(task).to_message()?.encode_to_vec())
    }

    /// The task of the run `head`, marked as a run of its chain.
    fn run_task(&self, head: NewTask) -> NewTask {
        head.max_retry(MAX_RETRY)
            .timeout(TASK_TIMEOUT)
            .retention(self.retention)
    }
}

/// A run as the chains keep it: its task's message, whose headers carry
/// the key ([`ORDERED_HEADER`]).
struct StoredRun {
    listener: String,
    key: String,
    /// The event's id, read from the envelope (`None` if it is not one).
    event_id: Option<Uuid>,
}

impl StoredRun {
    fn decode(bytes: &[u8]) -> Option<Self> {
        #[derive(serde::Deserialize)]
        struct EnvelopeId {
            id: Uuid,
        }
        let task = TaskMessage::decode(bytes).ok()?;
        let (_, listener) = task.r#type.strip_prefix("listener:")?.split_once(':')?;
        Some(Self {
            listener: listener.to_string(),
            key: task.headers.get(ORDERED_HEADER)?.clone(),
            event_id: serde_json::from_slice::<EnvelopeId>(&task.payload)
                .ok()
                .map(|envelope| envelope.id),
        })
    }
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

fn now_millis() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// The most heads [`Ordering::requeue_old_heads`] queues again a call.
pub(crate) const REQUEUE_BATCH: i64 = 1_000;
/// How long a head waits before the worker queues it again, in case Valkey
/// lost its task, and how often it looks. A head the queue has is a
/// duplicate: one cheap round trip for all of them.
pub(crate) const REQUEUE_AFTER: Duration = Duration::from_secs(10);
/// How long an event waits for the fan-out of the event before it before
/// the worker asks the outbox about the earlier events of its key, and
/// again after each look (module `stale`).
pub(crate) const STALE_AFTER: Duration = Duration::from_secs(60);
/// How long a key's last fanned-out number is kept after its last fan-out
/// (or the listener tasks' retention, if longer), in case nothing deletes
/// it: [`Ordering::delete_idle`] deletes it with the key's row in
/// Postgres, once the key has been idle for the outbox's retention. (Kept
/// shorter than that, a key's next event would wait a minute, and then
/// have the key's earlier events in the outbox published again, module
/// `stale`.)
const FANNED_KEPT: Duration = Duration::from_secs(90 * 24 * 3600);

/// Every [`REQUEUE_AFTER`] until `stop`: queues again the heads that have
/// waited longer than that ([`Ordering::requeue_old_heads`]), after moving
/// what a worker of template set 21 or older left in Postgres
/// ([`Ordering::move_from_postgres`]).
pub(crate) async fn requeue_old_heads(
    ordering: Ordering,
    stop: tokio_util::sync::CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(REQUEUE_AFTER) => {}
        }
        let moved = tokio::select! {
            () = stop.cancelled() => break,
            moved = ordering.move_from_postgres() => moved,
        };
        if let Err(err) = moved {
            tracing::warn!(error = %err, "could not move the chains of ordered listeners from Postgres to Valkey");
        }
        let healed = tokio::select! {
            () = stop.cancelled() => break,
            healed = ordering.heal_stale_waits(STALE_AFTER) => healed,
        };
        if let Err(err) = healed {
            tracing::warn!(error = %err, "could not look at the events of ordered keys that waited long");
        }
        let requeued = tokio::select! {
            () = stop.cancelled() => break,
            requeued = ordering.requeue_old_heads(REQUEUE_AFTER) => requeued,
        };
        match requeued {
            Ok(0) => {}
            Ok(heads) => tracing::debug!(heads, "queued old heads of ordered keys again"),
            Err(err) => {
                tracing::warn!(error = %err, "could not queue the old heads of ordered keys again")
            }
        }
    }
}

impl Ordering {
    /// Deletes the keys that have been idle for `retention`: no event
    /// dispatched in that time and none left unpublished; their rows in
    /// Postgres, then their last fanned-out numbers in Valkey. A later
    /// event of the key starts a new numbering (a new epoch) at 1. How
    /// many keys it deleted. A number Valkey did not delete (logged) goes
    /// when it expires ([`FANNED_KEPT`]).
    pub(crate) async fn delete_idle(&self, retention: Duration) -> Result<u64, sqlx::Error> {
        let idle: Vec<(String, i64)> = sqlx::query_as(
            "DELETE FROM outbox_keys k WHERE updated_at < now() - make_interval(secs => $1) \
             AND NOT EXISTS (SELECT 1 FROM outbox_events e WHERE e.published_at IS NULL \
               AND e.metadata ->> 'order_key' = k.key) \
             RETURNING key, epoch",
        )
        .bind(retention.as_secs_f64())
        .fetch_all(&self.pool)
        .await?;
        let mut conn = self.queue.connection();
        for keys in idle.chunks(500) {
            let names: Vec<String> = keys
                .iter()
                .map(|(key, epoch)| self.keys.fanned(key, *epoch))
                .collect();
            let deleted: Result<(), _> = redis::cmd("DEL").arg(&names).query_async(&mut conn).await;
            if let Err(err) = deleted {
                tracing::warn!(error = %QueueError::from(err), "could not delete the numbers of idle order keys in Valkey; they expire");
                break;
            }
        }
        Ok(u64::try_from(idle.len()).unwrap_or(u64::MAX))
    }
}

/// The chain a run is in: its listener and key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunOf {
    /// The chain's listener.
    pub listener: String,
    /// The key.
    pub key: String,
}

/// What ordering holds back, for `outbox status` and the metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Held {
    /// Chains whose head failed for good (recorded in `listener_failures`):
    /// their keys wait for `outbox retry-archived` or `outbox skip`.
    pub blocked_keys: i64,
    /// Runs waiting for an earlier run of their key.
    pub waiting_runs: i64,
    /// Event tasks waiting for the fan-out of an earlier event of their key.
    pub waiting_events: i64,
}

/// How the runs of an event stand in their chains, for `outbox show`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Standing {
    /// The listener's task id.
    pub task_id: String,
    /// The chain's listener.
    pub listener: String,
    /// The key.
    pub key: String,
    /// Runs of the key before it that have not finished (0: it is the head).
    pub after: i64,
    /// The task id of the head it waits for, when it waits.
    pub waits_for: Option<String>,
}
