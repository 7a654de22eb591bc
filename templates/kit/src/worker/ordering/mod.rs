//! Ordered listeners: a listener registered with
//! [`ListenerOptions::ordered`](super::listeners::ListenerOptions::ordered)
//! runs the events that share a key ([`Event::order_key`](crate::outbox::Event::order_key))
//! one at a time, in the order their transactions committed, on whichever
//! worker, retries included. The chains live in Valkey beside the queue the
//! events come through, under `ordered:{<queue>}:` ([`keys`]), each step one
//! script ([`scripts`]) that also moves the queue's tasks.
//! [`Ordering`] is the handle on them: its steps are the fan-out of an
//! event ([`fan_out`]) and a run's turn and move on ([`turns`]); what it
//! reads without changing is in [`inspection`].
//!
//! - **Commit order**: dispatching a keyed event takes the key's next
//!   sequence number in its own transaction, under the lock of the key's
//!   `outbox_keys` row (`crate::outbox::order`). A key's row goes once idle
//!   for the outbox's retention; a later event of the key numbers from 1
//!   again, in a new epoch (the row's).
//! - **Fan-out in sequence**: the fan-out of a keyed event adds a run per
//!   ordered listener to that listener's chain for the key, in sequence
//!   order: an event task that reaches a worker before the one that
//!   precedes it waits in Valkey (its task completes) and is fanned out
//!   right after that one.
//! - **One run at a time**: only a chain's head is in the queue. A run
//!   takes a fencing token as it starts ([`Turn::Now`]); its work commits
//!   (`ctx.once` checks the token first) and the chain moves on only while
//!   it holds the last token, in the script that puts the next run in the
//!   queue. So a worker that stalled past its lease while another took the
//!   run over does neither.
//! - **A run that keeps failing** holds its key by default: archived (and
//!   recorded in `listener_failures`), the runs behind it wait until `outbox
//!   retry-archived` runs it again and it succeeds, or `outbox skip` moves
//!   past it; nothing releases it by a timeout. With
//!   [`OnFailure::MoveOn`](super::listeners::OnFailure::MoveOn), its failure
//!   is recorded, the task archived, and the key moves on.
//! - **A run sent back after it was moved past** (`outbox retry-archived`,
//!   the console, asynqmon's "run"), or whose chain Valkey lost, joins its
//!   chain's end ([`Turn::Rejoined`]) and runs in its turn: after the runs
//!   that wait already, one at a time with them. A run that moved its
//!   chain on already is marked done in its task: one delivered again (a
//!   crash before its completion) does not run again.
//! - **Crashes**: every step is idempotent and healed by the rerun of the
//!   task that was interrupted, or by the worker's look at old heads every
//!   10 s ([`REQUEUE_AFTER`]): a head the queue lost is queued again, one a
//!   process other than a kit worker completed moves its chain on.
//! - **Valkey losing writes**: the chains and the queue are in one hash
//!   slot, so one server's append-only file holds both, in order: writes
//!   lost at a restart or a failover are lost from both, and the tasks back
//!   in the queue do their steps again. Events whose earlier ones do not
//!   come are looked at after a minute ([`stale`]).
//! - **Replays**: `outbox replay` of a keyed event that was fanned out
//!   already adds a run to the end of each ordered listener's chain.
//!   A replay of one that was not takes its turn as the event would.
//!   `outbox replay --listener` queues the listener's task alone, without
//!   the chain's mark: it runs at once, outside the order.
//!
//! Keys do not wait for each other: the heads of different keys run in
//! parallel, up to the workers' concurrency. An ordered run costs two
//! Valkey calls more than an unordered one (its turn, and the move on,
//! whose script enqueues the next run; the fan-out's script takes the place
//! of the unordered fan-out's enqueue), and nothing in Postgres.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use prost::Message as _;
use sqlx::PgPool;
use uuid::Uuid;

use super::retry_policy::RetryPolicy;
use crate::queue::message::TaskMessage;
use crate::queue::{Client, NewTask, QueueError};

use keys::Namespace;
pub(crate) use waits::RunArgs;

mod fan_out;
mod fence;
pub(crate) mod foreign;
mod from_database_namespace;
mod from_postgres;
mod inspection;
pub(crate) mod keys;
mod ordered;
mod orphans;
pub(crate) mod owner;
mod reconcile;
pub(crate) mod scripts;
mod stale;
mod turns;
mod waits;

pub(crate) use fence::{Fence, Superseded};
pub(crate) use ordered::Ordered;
pub(crate) use reconcile::look_after_chains;
pub(crate) use stale::{RECOVERED_HEADER, recovery_task};

/// The header that marks a listener task as a run of a chain.
pub(crate) use super::task_names::ORDERED_HEADER;

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Turn {
    /// It is the head: it runs, holding `token` ([`Fence`]); `next` is the
    /// run after it, if any; `rebuilt` when the worker made its task again
    /// from the chain (the queue had lost it; a failure recorded for it is
    /// forgotten when it succeeds).
    Now {
        token: i64,
        next: Option<String>,
        rebuilt: bool,
    },
    /// It ran and moved its chain on (this is a delivery again after a
    /// crash): the listener is not called again.
    Done,
    /// It was in no chain (sent back after it was moved past, or its chain
    /// lost), and joined its chain's end behind other runs: it waits for
    /// its turn (a run that joins an empty chain is its head: `Now`).
    Rejoined,
    /// Runs before it have not finished: how many.
    After(i64),
}

/// Why a run leaves its chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// It succeeded: a delivery of it again does not run it.
    Done,
    /// It failed for good, and its listener moves on (or the recoverer
    /// archived it): sent back, it runs.
    Past,
    /// An operator moves past it (`outbox skip`): only once its task is
    /// archived (or lost).
    Skip,
}

impl End {
    fn as_str(self) -> &'static str {
        match self {
            End::Done => "done",
            End::Past => "past",
            End::Skip => "skip",
        }
    }
}

/// How a move on ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Moved {
    /// The chain moved on.
    On,
    /// Nothing changed: the run is not its chain's head, or another run of
    /// it holds the turn.
    Superseded,
    /// Nothing changed: a run to skip has not failed for good (its task
    /// waits, runs or is retried).
    NotFailed,
}

/// The chains of ordered listeners in Valkey, of the queues a worker
/// consumes (or a command looks at), and the queue their heads go to.
#[derive(Clone)]
pub(crate) struct Ordering {
    pool: PgPool,
    queue: Client,
    queues: Arc<Vec<String>>,
    /// How long a listener task is kept after it succeeds.
    retention: Duration,
    /// How long a key's last fanned-out number is kept after its last
    /// fan-out, in case nothing deletes it ([`FANNED_KEPT`], or longer).
    numbers_kept: Duration,
    /// The retries and timeouts of the runs' tasks, by task type; the
    /// default policy for a type it does not have.
    policies: Arc<BTreeMap<String, RetryPolicy>>,
}

impl std::fmt::Debug for Ordering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ordering")
            .field("queues", &self.queues)
            .field("retention", &self.retention)
            .finish_non_exhaustive()
    }
}

impl Ordering {
    /// The chains of `queues`, in Valkey through `queue`, whose events'
    /// rows are in `pool`'s outbox; runs are kept `retention` after they
    /// succeed.
    pub(crate) fn new(
        pool: PgPool,
        queue: Client,
        queues: Vec<String>,
        retention: Duration,
    ) -> Self {
        Self {
            pool,
            queue,
            queues: Arc::new(queues),
            retention,
            numbers_kept: FANNED_KEPT.max(retention),
            policies: Arc::default(),
        }
    }

    /// The same chains, whose runs' tasks take the retries and timeout of
    /// `policies` (by task type), the default policy's for other types.
    pub(crate) fn with_policies(mut self, policies: BTreeMap<String, RetryPolicy>) -> Self {
        self.policies = Arc::new(policies);
        self
    }

    /// The chains of the queues a service's workers consume
    /// (`WORKER_QUEUES`), as its worker and its operations commands see
    /// them: runs kept `OUTBOX_TASK_RETENTION` after they succeed, and
    /// numbers past `OUTBOX_RETENTION` ([`Ordering::keeping_numbers_past`]).
    pub(crate) fn of_service(pool: PgPool, queue: Client, config: &crate::config::Config) -> Self {
        Self::new(
            pool,
            queue,
            config.worker.queues.names().map(str::to_string).collect(),
            config.outbox.task_retention,
        )
        .keeping_numbers_past(config.outbox.retention)
    }

    /// Keeps a key's last fanned-out number a day longer than the outbox
    /// keeps its row (`outbox_retention`, after which [`Ordering::delete_idle`]
    /// deletes both), when that is longer than [`FANNED_KEPT`]: an idle key
    /// whose number expired first would have its next event wait, and its
    /// earlier events taken again.
    pub(crate) fn keeping_numbers_past(mut self, outbox_retention: Duration) -> Self {
        self.numbers_kept = self
            .numbers_kept
            .max(outbox_retention + Duration::from_secs(24 * 3600));
        self
    }

    /// The queues whose chains it looks after.
    pub(crate) fn queues(&self) -> &[String] {
        &self.queues
    }

    /// The queue's client.
    pub(crate) fn queue_client(&self) -> Client {
        self.queue.clone()
    }

    /// How long a listener task is kept after it succeeds.
    pub(crate) fn retention(&self) -> Duration {
        self.retention
    }

    /// The delivery's keys and arguments, which scripts that deliver runs
    /// begin with (`scripts`' `DELIVER`).
    fn delivery(&self, keys: &Namespace, script: &mut redis::ScriptInvocation<'_>) {
        script
            .key(keys.pending())
            .key(keys.scheduled())
            .key(keys.woken())
            .arg(chrono::Utc::now().timestamp_nanos_opt().unwrap_or_default())
            .arg(self.queue.wake_channel())
            .arg(&keys.queue);
    }

    /// Wakes this process's idle consumers when a script put `delivered`
    /// tasks in the queue (other processes' are woken by its publish).
    fn delivered(&self, delivered: i64) {
        if delivered > 0 {
            self.queue.enqueued_by_script();
        }
    }

    /// The task of the run `head`: its listener's retries and timeout
    /// (the default policy's for a listener it does not know), and the
    /// listener tasks' retention.
    fn run_task(&self, head: NewTask) -> NewTask {
        self.policies
            .get(&head.task_type)
            .copied()
            .unwrap_or_default()
            .apply(head)
            .retention(self.retention)
    }
}

/// A run as the chains keep it: its task's message, whose headers carry
/// the key ([`ORDERED_HEADER`]).
pub(crate) struct StoredRun {
    pub listener: String,
    pub key: String,
    /// The event's id, read from the envelope (`None` if it is not one).
    pub event_id: Option<Uuid>,
}

impl StoredRun {
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
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

/// A value of a script's reply.
pub(crate) fn parse<T: redis::FromRedisValue>(value: redis::Value) -> Result<T, QueueError> {
    T::from_redis_value(value)
        .map_err(|err| QueueError::UnexpectedReply(format!("a script's reply: {err}")))
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

fn now_millis() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// How long a head waits before the worker looks at it again (queues it
/// again if the queue lost it), and how often it looks.
pub(crate) const REQUEUE_AFTER: Duration = Duration::from_secs(10);
/// How long an event waits for the fan-out of the event before it before
/// the worker asks the outbox about the earlier events of its key, and
/// again after each look (module `stale`).
pub(crate) const STALE_AFTER: Duration = Duration::from_secs(60);
/// How long a key's last fanned-out number is kept after its last fan-out
/// (or the listener tasks' retention, if longer), in case nothing deletes
/// it: [`Ordering::delete_idle`] deletes it with the key's row in
/// Postgres, once the key has been idle for the outbox's retention.
const FANNED_KEPT: Duration = Duration::from_secs(90 * 24 * 3600);

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
        'queues: for queue in self.queues.iter() {
            let keys = Namespace::of_queue(queue);
            for chunk in idle.chunks(500) {
                let names: Vec<String> = chunk
                    .iter()
                    .map(|(key, epoch)| keys.fanned(key, *epoch))
                    .collect();
                let deleted: Result<(), _> =
                    redis::cmd("DEL").arg(&names).query_async(&mut conn).await;
                if let Err(err) = deleted {
                    tracing::warn!(error = %QueueError::from(err), "could not delete the numbers of idle order keys in Valkey; they expire");
                    break 'queues;
                }
            }
        }
        Ok(u64::try_from(idle.len()).unwrap_or(u64::MAX))
    }
}

/// The chain a run is in: its queue, listener and key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunOf {
    /// The queue the chain is in.
    pub queue: String,
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
