//! Ordered listeners: a listener registered with
//! [`ListenerOptions::ordered`](super::listeners::ListenerOptions::ordered)
//! runs the events that share a key ([`Event::order_key`](crate::dispatch::Event::order_key))
//! one at a time, in the order their transactions committed, on whichever
//! worker, retries included.
//!
//! - **Commit order**: dispatching a keyed event takes the key's next
//!   sequence number in its own transaction, under the lock of the key's
//!   `outbox_keys` row (`crate::outbox::order`). The outbox's row id is
//!   taken at insert, so a transaction that commits late can have a lower id
//!   than rows already published; its sequence number is still the later one.
//! - **Fan-out in sequence**: the fan-out of a keyed event adds a run per
//!   ordered listener to that listener's chain for the key (`ordered_runs`),
//!   in sequence order: an event task that reaches a worker before the one
//!   that precedes it waits in `outbox_key_waits` (its task completes) and is
//!   fanned out right after that one, by whichever worker fans it out.
//! - **One run at a time**: only a chain's head is in the queue. When it
//!   succeeds, the worker moves the head on and queues the next run; while it
//!   is retried, the runs behind it wait in Postgres, not in the queue. So a Go
//!   asynq server sharing the queue never sees them; it must not register a
//!   handler for an ordered listener's task type, since its runs would not
//!   move the chain on.
//! - **A run that keeps failing** holds its key by default: archived (and
//!   recorded in `listener_failures`), the runs behind it wait until `outbox
//!   retry-archived` runs it again and it succeeds, or `outbox skip` moves past
//!   it; nothing releases it by a timeout, and the outbox's cleanup keeps the
//!   events it holds. With [`OnFailure::MoveOn`](super::listeners::OnFailure::MoveOn),
//!   its failure is recorded, the task archived, and the key moves on.
//! - **Crashes**: every step is idempotent and healed by the rerun of the
//!   task that was interrupted: a fan-out that committed but died before
//!   queuing the heads queues them when its task runs again; a run that
//!   moved its chain on but died before queuing the next queues it when it
//!   runs again (its listener is not called twice: its run is gone).
//! - **Valkey losing a head's task** (a restart without its append-only
//!   file, a failover before replication): every 10 s the worker queues
//!   again the heads that have waited 10 s or more; the queue takes a head
//!   it has as a duplicate, and gives back one it lost.
//! - **Replays**: `outbox replay` of a keyed event that was fanned out
//!   already adds a run to the end of each ordered listener's chain: it runs
//!   after the runs of its key that wait already, and before the later ones.
//!   A replay of one that was not (its task lost with Valkey's data, as the
//!   README's recovery replays them) takes its turn as the event would.
//!   `outbox replay --listener` queues the listener's task alone, without
//!   the chain's mark: it runs at once, outside the order.
//!
//! Keys do not wait for each other: the heads of different keys run in
//! parallel, up to the workers' concurrency. Each step is one statement:
//! a fan-out calls the migration's SQL function `outbox_fan_out`, a run
//! reads its turn and, once over, calls `ordered_move_on`; so an ordered
//! run costs three round trips to Postgres more than an unordered one.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use prost::Message as _;
use redis::Script;
use sqlx::PgPool;
use sqlx::types::Json;
use uuid::Uuid;

use crate::outbox::Metadata;
use crate::outbox::order::{ORDER_KEY, Place};
use crate::outbox::relay::{MAX_RETRY, TASK_TIMEOUT};
use crate::queue::message::TaskMessage;
use crate::queue::{Client, HandlerError, NewTask, QueueError};

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

/// The names of one service's ordering keys in Valkey: all under
/// `ordered:{<database>}:`, one hash slot per service (a Valkey cluster
/// keeps a service's chains on one master, so that each step is one
/// script), apart from another service's sharing the Valkey.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Namespace {
    prefix: String,
}

impl Namespace {
    /// The namespace of the database `database` (braces, which would end
    /// the hash tag, and `%` are percent-encoded).
    pub(crate) fn of_database(database: &str) -> Self {
        let mut tag = String::with_capacity(database.len());
        for c in database.chars() {
            match c {
                '{' => tag.push_str("%7B"),
                '}' => tag.push_str("%7D"),
                '%' => tag.push_str("%25"),
                c => tag.push(c),
            }
        }
        Self {
            prefix: format!("ordered:{{{tag}}}:"),
        }
    }

    /// The namespace of `pool`'s database (its user's name when the URL
    /// names none, as Postgres does).
    pub(crate) fn of_pool(pool: &PgPool) -> Self {
        let options = pool.connect_options();
        Self::of_database(
            options
                .get_database()
                .unwrap_or_else(|| options.get_username()),
        )
    }

    /// The runs not done yet, by task id: each run's task message.
    fn runs(&self) -> String {
        format!("{}runs", self.prefix)
    }

    /// The chains' heads, by task id, scored by when each became its
    /// chain's head (Unix milliseconds).
    fn heads(&self) -> String {
        format!("{}heads", self.prefix)
    }

    /// The events waiting for the fan-out of an earlier event of their key,
    /// by their lists' names, scored by when they began to wait.
    fn waiting(&self) -> String {
        format!("{}waiting", self.prefix)
    }

    /// The chain of `listener` for `key`: a list of task ids, the head
    /// first. (The listener's name is length-prefixed: no listener and key
    /// make another's name.)
    fn chain(&self, listener: &str, key: &str) -> String {
        format!("{}chain:{}:{listener}:{key}", self.prefix, listener.len())
    }

    /// The listeners with a chain for `key`.
    fn listeners(&self, key: &str) -> String {
        format!("{}listeners:{key}", self.prefix)
    }

    /// The last sequence number of `key` fanned out, in its numbering
    /// `epoch`.
    fn fanned(&self, key: &str, epoch: i64) -> String {
        format!("{}fan:{epoch}:{key}", self.prefix)
    }

    /// The name of the list of the event `seq` of `key` in `epoch` that
    /// waits, as `<before><seq><after>`.
    fn wait_parts(&self, key: &str, epoch: i64) -> (String, String) {
        (format!("{}wait:{epoch}:", self.prefix), format!(":{key}"))
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
        script
            .key(self.keys.runs())
            .key(self.keys.heads())
            .key(self.keys.fanned(&place.key, place.epoch))
            .key(self.keys.waiting())
            .arg(&self.keys.prefix)
            .arg(&place.key)
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
            let task = run_message(
                &run.task_type,
                &run.task_id,
                &event.queue,
                &event.payload,
                &headers,
            );
            script
                .arg(self.keys.chain(&run.listener, &place.key))
                .arg(self.keys.listeners(&place.key))
                .arg(&run.listener)
                .arg(&run.task_id)
                .arg(task.encode_to_vec());
        }
        let heads: Vec<Vec<u8>> = script
            .invoke_async(&mut self.queue.connection())
            .await
            .map_err(QueueError::from)?;
        self.enqueue(&heads).await
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
        let heads: Vec<Vec<u8>> = MOVE_ON
            .key(self.keys.chain(listener, key))
            .key(self.keys.runs())
            .key(self.keys.heads())
            .key(self.keys.listeners(key))
            .arg(task_id)
            .arg(now_millis())
            .arg(listener)
            .invoke_async(&mut self.queue.connection())
            .await
            .map_err(QueueError::from)?;
        self.enqueue(&heads).await
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

    /// Moves what the chains in Postgres still hold (template sets 19-21
    /// kept them there: `outbox_keys.fanned_out`, `outbox_key_waits`,
    /// `ordered_runs`) into Valkey, under a lock of the database's, in
    /// their order; the rows go once Valkey has them. A run already in
    /// Valkey is not added twice. Returns how many rows it moved. The
    /// worker calls it before it consumes (a head in the queue must find
    /// its chain) and with its loop of old heads.
    pub(crate) async fn move_from_postgres(&self) -> anyhow::Result<u64> {
        type Wait = (String, i64, String, Uuid, Vec<u8>, Json<BTreeMap<String, String>>, Vec<String>, Vec<String>, Vec<String>);
        type Run = (String, String, String, String, String, Vec<u8>, Json<BTreeMap<String, String>>);
        let mut tx = self.pool.begin().await?;
        let held: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM outbox_keys WHERE fanned_out > 0) \
             OR EXISTS (SELECT 1 FROM outbox_key_waits) OR EXISTS (SELECT 1 FROM ordered_runs)",
        )
        .fetch_one(&mut *tx)
        .await?;
        if !held {
            return Ok(0);
        }
        sqlx::query("SELECT pg_advisory_xact_lock(hashtext('gpkit ordered chains to Valkey'))")
            .execute(&mut *tx)
            .await?;
        let fanned: Vec<(String, i64)> =
            sqlx::query_as("SELECT key, fanned_out FROM outbox_keys WHERE fanned_out > 0 FOR UPDATE")
                .fetch_all(&mut *tx)
                .await?;
        let waits: Vec<Wait> = sqlx::query_as(
            "DELETE FROM outbox_key_waits RETURNING key, seq, queue, event_id, payload, headers, \
             listeners, task_types, task_ids",
        )
        .fetch_all(&mut *tx)
        .await?;
        let runs: Vec<Run> = sqlx::query_as(
            "WITH gone AS (DELETE FROM ordered_runs RETURNING *) \
             SELECT listener, key, task_id, task_type, queue, payload, headers FROM gone \
             ORDER BY listener, key, position",
        )
        .fetch_all(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM ordered_keys").execute(&mut *tx).await?;
        sqlx::query("UPDATE outbox_keys SET fanned_out = 0 WHERE fanned_out > 0")
            .execute(&mut *tx)
            .await?;
        let mut conn = self.queue.connection();
        let kept = millis(FANNED_KEPT.max(self.retention));
        for (key, number) in &fanned {
            let () = KEEP_LATER
                .key(self.keys.fanned(key, 0))
                .arg(number)
                .arg(kept)
                .invoke_async(&mut conn)
                .await
                .map_err(QueueError::from)?;
        }
        for (key, seq, queue, event_id, payload, Json(headers), listeners, task_types, task_ids) in &waits {
            let (before, after) = self.keys.wait_parts(key, 0);
            let mut headers = headers.clone();
            headers.insert(ORDERED_HEADER.into(), key.clone());
            let mut script = WAIT.prepare_invoke();
            script
                .key(format!("{before}{seq}{after}"))
                .key(self.keys.waiting())
                .arg(now_millis())
                .arg(event_id.to_string());
            for ((listener, task_type), task_id) in listeners.iter().zip(task_types).zip(task_ids) {
                let task = run_message(task_type, task_id, queue, payload, &headers);
                script
                    .arg(self.keys.chain(listener, key))
                    .arg(self.keys.listeners(key))
                    .arg(listener)
                    .arg(task_id)
                    .arg(task.encode_to_vec());
            }
            let () = script.invoke_async(&mut conn).await.map_err(QueueError::from)?;
        }
        for (listener, key, task_id, task_type, queue, payload, Json(headers)) in &runs {
            let mut headers = headers.clone();
            headers.insert(ORDERED_HEADER.into(), key.clone());
            let task = run_message(task_type, task_id, queue, payload, &headers);
            let _: Vec<Vec<u8>> = APPEND
                .key(self.keys.runs())
                .key(self.keys.heads())
                .arg(now_millis())
                .arg(self.keys.chain(listener, key))
                .arg(self.keys.listeners(key))
                .arg(listener)
                .arg(task_id)
                .arg(task.encode_to_vec())
                .invoke_async(&mut conn)
                .await
                .map_err(QueueError::from)?;
        }
        tx.commit().await?;
        let moved = fanned.len() + waits.len() + runs.len();
        tracing::info!(keys = fanned.len(), waiting_events = waits.len(), runs = runs.len(), "moved the chains of ordered listeners from Postgres to Valkey");
        Ok(u64::try_from(moved).unwrap_or(u64::MAX))
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
        let (heads, runs, waiting_events): (Vec<String>, i64, i64) = redis::pipe()
            .cmd("ZRANGE")
            .arg(self.keys.heads())
            .arg(0)
            .arg(-1)
            .cmd("HLEN")
            .arg(self.keys.runs())
            .cmd("ZCARD")
            .arg(self.keys.waiting())
            .query_async(&mut self.queue.connection())
            .await
            .map_err(QueueError::from)?;
        let blocked_keys: i64 = if heads.is_empty() {
            0
        } else {
            sqlx::query_scalar("SELECT count(*) FROM listener_failures WHERE task_id = ANY($1)")
                .bind(&heads)
                .fetch_one(&self.pool)
                .await?
        };
        let heads = i64::try_from(heads.len()).unwrap_or(i64::MAX);
        Ok(Held {
            blocked_keys,
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
            .map(|head| self.run_task(head))
            .collect();
        if tasks.is_empty() {
            return Ok(());
        }
        for result in self.queue.enqueue(&tasks).await? {
            result?;
        }
        Ok(())
    }

    /// The task of the run `head`, marked as a run of its chain.
    fn run_task(&self, head: TaskMessage) -> NewTask {
        NewTask::new(head.r#type, head.id, head.payload)
            .queue(head.queue)
            .headers(head.headers)
            .max_retry(MAX_RETRY)
            .timeout(TASK_TIMEOUT)
            .retention(self.retention)
    }
}

/// The task message of a run, as its chain keeps it (`headers` with the
/// key, [`ORDERED_HEADER`]).
fn run_message(
    task_type: &str,
    task_id: &str,
    queue: &str,
    payload: &[u8],
    headers: &BTreeMap<String, String>,
) -> TaskMessage {
    TaskMessage {
        r#type: task_type.to_string(),
        payload: payload.to_vec(),
        headers: headers.clone(),
        id: task_id.to_string(),
        queue: queue.to_string(),
        ..TaskMessage::default()
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
/// How long a key's last fanned-out number is kept at least after its last
/// fan-out (the outbox's retention if longer): the key's row in Postgres,
/// which gives the numbers, is deleted once idle that long, and a new row
/// starts a new numbering (its epoch).
const FANNED_KEPT: Duration = Duration::from_secs(7 * 24 * 3600);

/// The fan-out of a keyed event. KEYS: runs, heads, the key's fanned-out
/// number, waiting. ARGV: prefix, key, seq, replay (0/1), how long the
/// number is kept (ms), now (ms), the waiting list's name before and after
/// the seq, the event id, then per run: its chain, the key's listeners
/// set, listener, task id, task message. Returns the task messages of the
/// runs that became heads (or, for a retried fan-out, of the chains'
/// heads).
static FAN_OUT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local runs, heads, fanned_key, waiting = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local seq, replay = tonumber(ARGV[3]), ARGV[4] == '1'
local kept, now = tonumber(ARGV[5]), tonumber(ARGV[6])
local wait_before, wait_after = ARGV[7], ARGV[8]
local made = {}
-- Appends the runs of `args` from `from` on (5 values each) to their
-- chains, unless a run of that task is there already.
local function append(args, from)
  for i = from, #args, 5 do
    local chain, listeners, listener, id, task = args[i], args[i + 1], args[i + 2], args[i + 3], args[i + 4]
    if redis.call('HSETNX', runs, id, task) == 1 then
      if redis.call('RPUSH', chain, id) == 1 then
        redis.call('ZADD', heads, now, id)
        redis.call('SADD', listeners, listener)
        made[#made + 1] = task
      end
    end
  end
end
local fanned = tonumber(redis.call('GET', fanned_key) or '0')
if seq <= fanned then
  if replay then
    append(ARGV, 10)
  else
    for i = 10, #ARGV, 5 do
      local head = redis.call('LINDEX', ARGV[i], 0)
      if head then made[#made + 1] = redis.call('HGET', runs, head) end
    end
  end
  return made
end
if seq > fanned + 1 then
  local wait = wait_before .. seq .. wait_after
  if redis.call('EXISTS', wait) == 0 then
    redis.call('RPUSH', wait, ARGV[9], unpack(ARGV, 10))
    redis.call('ZADD', waiting, now, wait)
  end
  return made
end
append(ARGV, 10)
while true do
  local wait = wait_before .. (fanned + 2) .. wait_after
  local args = redis.call('LRANGE', wait, 0, -1)
  if #args == 0 then break end
  append(args, 2)
  redis.call('DEL', wait)
  redis.call('ZREM', waiting, wait)
  fanned = fanned + 1
end
redis.call('SET', fanned_key, fanned + 1, 'PX', kept)
return made
",
    )
});

/// Appends runs to their chains, unless there already (moved from
/// Postgres). KEYS: runs, heads. ARGV: now (ms), then per run: its chain,
/// the key's listeners set, listener, task id, task message. Returns the
/// task messages of the runs that became heads.
static APPEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local made = {}
for i = 2, #ARGV, 5 do
  local chain, listeners, listener, id, task = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  if redis.call('HSETNX', KEYS[1], id, task) == 1 then
    if redis.call('RPUSH', chain, id) == 1 then
      redis.call('ZADD', KEYS[2], ARGV[1], id)
      redis.call('SADD', listeners, listener)
      made[#made + 1] = task
    end
  end
end
return made
",
    )
});

/// Keeps an event waiting (moved from Postgres), as [`FAN_OUT`] does.
/// KEYS: its list, waiting. ARGV: now (ms), the event id, then its runs
/// as [`APPEND`]'s.
static WAIT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('RPUSH', KEYS[1], unpack(ARGV, 2))
  redis.call('ZADD', KEYS[2], ARGV[1], KEYS[1])
end
",
    )
});

/// Sets a key's last fanned-out number, unless it is later already
/// (moved from Postgres). KEYS: the number. ARGV: the number, how long it
/// is kept (ms).
static KEEP_LATER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if tonumber(redis.call('GET', KEYS[1]) or '0') < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
",
    )
});

/// A run is over. KEYS: its chain, runs, heads, the key's listeners.
/// ARGV: task id, now (ms), listener. Returns the task message of the
/// chain's head to queue (none if the chain is empty, or the run was not
/// the head but in the chain).
static MOVE_ON: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local chain, runs, heads, listeners = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id = ARGV[1]
local head = redis.call('LINDEX', chain, 0)
if not head then return {} end
if head ~= id then
  if redis.call('LREM', chain, 1, id) == 1 then
    redis.call('HDEL', runs, id)
    return {}
  end
  return {redis.call('HGET', runs, head)}
end
redis.call('LPOP', chain)
redis.call('HDEL', runs, id)
redis.call('ZREM', heads, id)
local next = redis.call('LINDEX', chain, 0)
if not next then
  redis.call('SREM', listeners, ARGV[3])
  return {}
end
redis.call('ZADD', heads, ARGV[2], next)
return {redis.call('HGET', runs, next)}
",
    )
});

/// The heads older than a time. KEYS: heads, runs. ARGV: the time (ms),
/// now (ms), how many at most. Returns their task messages, and counts
/// them as heads from now on.
static REQUEUE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
local tasks = {}
for _, id in ipairs(ids) do
  local task = redis.call('HGET', KEYS[2], id)
  if task then tasks[#tasks + 1] = task end
  redis.call('ZADD', KEYS[1], ARGV[2], id)
end
return tasks
",
    )
});

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

/// Deletes the keys that have been idle for `retention`: no event
/// dispatched in that time and none left unpublished. A later event of the
/// key starts a new numbering (a new epoch) at 1.
pub(crate) async fn delete_idle(pool: &PgPool, retention: Duration) -> Result<u64, sqlx::Error> {
    let keys = sqlx::query(
        "DELETE FROM outbox_keys k WHERE updated_at < now() - make_interval(secs => $1) \
         AND NOT EXISTS (SELECT 1 FROM outbox_events e WHERE e.published_at IS NULL \
           AND e.metadata ->> 'order_key' = k.key)",
    )
    .bind(retention.as_secs_f64())
    .execute(pool)
    .await?
    .rows_affected();
    Ok(keys)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_is_one_hash_slot_per_database_whatever_its_name() {
        assert_eq!(
            Namespace::of_database("shop").chain("email", "order:7"),
            "ordered:{shop}:chain:5:email:order:7"
        );
        assert_eq!(
            Namespace::of_database("a}b{c%").runs(),
            "ordered:{a%7Db%7Bc%25}:runs"
        );
    }

    #[test]
    fn no_listener_and_key_name_another_pairs_chain() {
        let keys = Namespace::of_database("shop");
        assert_ne!(keys.chain("a", "b:c"), keys.chain("a:b", "c"));
    }
}
