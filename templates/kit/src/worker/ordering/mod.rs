//! Ordered listeners: a listener registered with
//! [`ListenerOptions::ordered`](super::listeners::ListenerOptions::ordered)
//! runs the events that share a key ([`Event::order_key`](crate::outbox::Event::order_key))
//! one at a time, in the order their transactions committed, on whichever
//! worker, retries included. The chains live in Valkey beside the queue the
//! events come through, under `ordered:{<queue>}:` ([`keys`]), each step one
//! script ([`scripts`]) that also moves the queue's tasks.
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

use crate::outbox::Metadata;
use crate::outbox::order::{ORDER_KEY, Place};
use crate::outbox::relay::{MAX_RETRY, TASK_TIMEOUT};
use crate::queue::message::TaskMessage;
use crate::queue::{Client, HandlerError, NewTask, QueueError, Task};

use keys::Namespace;
use scripts::{APPEND, DELIVER_HEAD, FAN_OUT, MOVE_ON, MOVE_PAST, REJOIN, TURN};
pub(crate) use waits::{RunArgs, Waiting};

mod fence;
pub(crate) mod foreign;
mod from_database_namespace;
mod from_postgres;
pub(crate) mod keys;
mod ordered;
mod orphans;
pub(crate) mod owner;
mod reconcile;
pub(crate) mod scripts;
mod stale;
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
        }
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

    /// Whether `queue` keeps the last fanned-out number of `key` in
    /// `epoch`: `false` after Valkey lost it (the recovery's replay then
    /// makes the key's events take their turns again, `outbox replay
    /// --lost`).
    pub(crate) async fn knows(
        &self,
        queue: &str,
        key: &str,
        epoch: i64,
    ) -> Result<bool, QueueError> {
        Ok(redis::cmd("EXISTS")
            .arg(Namespace::of_queue(queue).fanned(key, epoch))
            .query_async(&mut self.queue.connection())
            .await?)
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

    /// Fans out the keyed event at `place` to its ordered listeners
    /// (`event`), in its key's sequence ([`FAN_OUT`]): added to their
    /// chains now if the event before it was fanned out, else kept waiting
    /// until it is; then each waiting event that is next. `replay`: the
    /// task is a replay, whose runs join the end of the chains if the
    /// event was fanned out already.
    pub(crate) async fn fan_out(
        &self,
        place: &Place,
        event: &EventRuns,
        replay: bool,
    ) -> Result<(), HandlerError> {
        let mut headers = event.headers.clone();
        headers.insert(ORDERED_HEADER.into(), place.key.clone());
        let runs = event
            .runs
            .iter()
            .map(|run| {
                let task = NewTask::new(&run.task_type, &run.task_id, event.payload.clone())
                    .queue(&event.queue)
                    .headers(headers.clone());
                Ok(RunArgs {
                    listener: run.listener.clone(),
                    task_id: run.task_id.clone(),
                    message: self.run_task(task).to_message()?.encode_to_vec(),
                })
            })
            .collect::<Result<Vec<_>, QueueError>>()?;
        let keys = Namespace::of_queue(&event.queue);
        let next = self
            .fan_out_runs(&keys, place, &event.event_id.to_string(), &runs, replay)
            .await?;
        self.drain(&keys, place, next).await
    }

    /// Fans out `waiting`, the event at `place` in `queue` (moved from the
    /// chains of an older layout), as its own task would be.
    pub(crate) async fn fan_out_waiting(
        &self,
        queue: &str,
        place: &Place,
        waiting: &Waiting,
    ) -> Result<(), HandlerError> {
        let keys = Namespace::of_queue(queue);
        let next = self
            .fan_out_runs(&keys, place, &waiting.event_id, &waiting.runs, false)
            .await?;
        self.drain(&keys, place, next).await
    }

    /// Fans out `next`, the waiting event of `place`'s key that is next,
    /// and each one that is next after it, each with its runs' keys.
    async fn drain(
        &self,
        keys: &Namespace,
        place: &Place,
        mut next: Option<(i64, Waiting)>,
    ) -> Result<(), HandlerError> {
        while let Some((seq, waiting)) = next {
            let place = Place {
                seq,
                ..place.clone()
            };
            next = self
                .fan_out_runs(keys, &place, &waiting.event_id, &waiting.runs, false)
                .await?;
        }
        Ok(())
    }

    /// One call of [`FAN_OUT`]; the waiting event that is next now.
    async fn fan_out_runs(
        &self,
        keys: &Namespace,
        place: &Place,
        event_id: &str,
        runs: &[RunArgs],
        replay: bool,
    ) -> Result<Option<(i64, Waiting)>, HandlerError> {
        let mut script = FAN_OUT.prepare_invoke();
        self.delivery(keys, &mut script);
        script
            .key(keys.runs())
            .key(keys.heads())
            .key(keys.listeners())
            .key(keys.waiting())
            .key(keys.fanned(&place.key, place.epoch))
            .key(keys.waits(&place.key))
            .arg(place.seq)
            .arg(i32::from(replay))
            .arg(millis(self.numbers_kept))
            .arg(now_millis())
            .arg(place.epoch)
            .arg(&place.key)
            .arg(event_id);
        for run in runs {
            script
                .key(keys.chain(&run.listener, &place.key))
                .key(keys.keys_of(&run.listener))
                .key(keys.task(&run.task_id))
                .arg(&run.listener)
                .arg(&run.task_id)
                .arg(&run.message);
        }
        let (delivered, next): (i64, Option<(i64, Vec<u8>)>) = match script
            .invoke_async::<redis::Value>(&mut self.queue.connection())
            .await
            .map_err(QueueError::from)?
        {
            redis::Value::Array(values) => {
                let mut values = values.into_iter();
                let delivered: i64 = parse(values.next().unwrap_or(redis::Value::Int(0)))?;
                let next = match (values.next(), values.next()) {
                    (Some(seq), Some(entry)) => Some((parse(seq)?, parse(entry)?)),
                    _ => None,
                };
                (delivered, next)
            }
            other => {
                return Err(QueueError::UnexpectedReply(format!(
                    "the fan-out script returned {other:?}"
                ))
                .into());
            }
        };
        self.delivered(delivered);
        Ok(match next {
            Some((seq, entry)) => match Waiting::decode(&entry) {
                Some(waiting) => Some((seq, waiting)),
                None => {
                    tracing::error!(
                        key = place.key,
                        seq,
                        "a waiting event's entry in Valkey does not read; it is left where it is"
                    );
                    None
                }
            },
            None => None,
        })
    }

    /// Where the run of `task` (its task id, in its queue), of `listener`'s
    /// chain for `key`, stands as it starts ([`TURN`]); a run in no chain
    /// joins its chain's end ([`REJOIN`]).
    pub(crate) async fn turn(
        &self,
        listener: &str,
        key: &str,
        task: &Task,
    ) -> Result<Turn, HandlerError> {
        let keys = Namespace::of_queue(&task.queue);
        let reply: Vec<redis::Value> = TURN
            .key(keys.chain(listener, key))
            .key(keys.task(&task.id))
            .arg(&task.id)
            .invoke_async(&mut self.queue.connection())
            .await
            .map_err(QueueError::from)?;
        match turn_of(reply)? {
            Some(turn) => Ok(turn),
            None => {
                let message = self
                    .run_task(
                        NewTask::new(&task.task_type, &task.id, task.payload.clone())
                            .queue(&task.queue)
                            .headers(task.headers.clone()),
                    )
                    .to_message()?
                    .encode_to_vec();
                let reply: Vec<redis::Value> = REJOIN
                    .key(keys.chain(listener, key))
                    .key(keys.runs())
                    .key(keys.heads())
                    .key(keys.listeners())
                    .key(keys.keys_of(listener))
                    .key(keys.task(&task.id))
                    .arg(&task.id)
                    .arg(message)
                    .arg(now_millis())
                    .arg(listener)
                    .arg(key)
                    .invoke_async(&mut self.queue.connection())
                    .await
                    .map_err(QueueError::from)?;
                tracing::info!(
                    task = %task.id,
                    listener,
                    key,
                    "a run of an ordered listener was in no chain (sent back after it was moved past, \
                     or its chain was lost): it joins its key's order at the end"
                );
                Ok(match turn_of(reply)? {
                    Some(Turn::After(_)) | None => Turn::Rejoined,
                    Some(turn) => turn,
                })
            }
        }
    }

    /// The run of `task_id` in `queue`, of `listener`'s chain for `key`,
    /// is over ([`MOVE_ON`]) as `end` says: it leaves its chain and the next
    /// run goes to the queue. `token`: the run's ([`Turn::Now`]), or `None`
    /// for one moved past for an operator or the recoverer. `next`: the run
    /// after it as the turn saw it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn move_on(
        &self,
        queue: &str,
        listener: &str,
        key: &str,
        task_id: &str,
        token: Option<i64>,
        end: End,
        next: Option<&str>,
    ) -> Result<Moved, HandlerError> {
        let keys = Namespace::of_queue(queue);
        let mut script = MOVE_ON.prepare_invoke();
        self.delivery(&keys, &mut script);
        script
            .key(keys.chain(listener, key))
            .key(keys.runs())
            .key(keys.heads())
            .key(keys.listeners())
            .key(keys.keys_of(listener))
            .key(keys.task(task_id))
            .arg(task_id)
            .arg(token.map_or_else(String::new, |token| token.to_string()))
            .arg(end.as_str())
            .arg(now_millis())
            .arg(listener)
            .arg(key)
            .arg(next.unwrap_or_default());
        if let Some(next) = next {
            script.key(keys.task(next));
        }
        let reply: Vec<redis::Value> = script
            .invoke_async(&mut self.queue.connection())
            .await
            .map_err(QueueError::from)?;
        let mut reply = reply.into_iter();
        let int = |value: Option<redis::Value>| -> Result<i64, QueueError> {
            parse(value.unwrap_or(redis::Value::Int(0)))
        };
        match int(reply.next())? {
            0 => return Ok(Moved::Superseded),
            2 => return Ok(Moved::NotFailed),
            _ => {}
        }
        self.delivered(int(reply.next())?);
        if let Some(other) = reply.next() {
            // The next run is not the one the turn saw: delivered apart.
            let other: String = parse(other)?;
            self.deliver_head(&keys, listener, key, &other, true)
                .await?;
        }
        Ok(Moved::On)
    }

    /// Delivers the head `task_id` of `listener`'s chain for `key`
    /// ([`DELIVER_HEAD`]), promoting it from scheduled when asked.
    async fn deliver_head(
        &self,
        keys: &Namespace,
        listener: &str,
        key: &str,
        task_id: &str,
        promote: bool,
    ) -> Result<(), QueueError> {
        let mut script = DELIVER_HEAD.prepare_invoke();
        self.delivery(keys, &mut script);
        let delivered: i64 = script
            .key(keys.chain(listener, key))
            .key(keys.runs())
            .key(keys.task(task_id))
            .arg(task_id)
            .arg(i32::from(promote))
            .invoke_async(&mut self.queue.connection())
            .await?;
        self.delivered(delivered);
        Ok(())
    }

    /// Moves the last fanned-out number of `key` in `epoch`, in `queue`,
    /// on to `number` (unless it is later already) and fans out the waiting
    /// events that follow it ([`MOVE_PAST`]).
    async fn move_past(
        &self,
        queue: &str,
        key: &str,
        epoch: i64,
        number: i64,
    ) -> Result<(), HandlerError> {
        let keys = Namespace::of_queue(queue);
        let reply: Vec<redis::Value> = MOVE_PAST
            .key(keys.fanned(key, epoch))
            .key(keys.waits(key))
            .arg(number)
            .arg(millis(self.numbers_kept))
            .arg(epoch)
            .invoke_async(&mut self.queue.connection())
            .await
            .map_err(QueueError::from)?;
        let next = match reply.as_slice() {
            [seq, entry] => {
                let seq: i64 = parse(seq.clone())?;
                let entry: Vec<u8> = parse(entry.clone())?;
                Waiting::decode(&entry).map(|waiting| (seq, waiting))
            }
            _ => None,
        };
        let place = Place {
            key: key.to_string(),
            seq: number,
            epoch,
        };
        self.drain(&keys, &place, next).await
    }

    /// Appends `runs` (each with its key) to the ends of their chains in
    /// `queue`, in their order, unless there already ([`APPEND`]): runs
    /// moved from the chains of an older layout.
    async fn append(&self, queue: &str, runs: &[(String, RunArgs)]) -> Result<(), QueueError> {
        let keys = Namespace::of_queue(queue);
        for batch in runs.chunks(100) {
            let mut script = APPEND.prepare_invoke();
            self.delivery(&keys, &mut script);
            script
                .key(keys.runs())
                .key(keys.heads())
                .key(keys.listeners())
                .arg(now_millis());
            for (key, run) in batch {
                script
                    .key(keys.chain(&run.listener, key))
                    .key(keys.keys_of(&run.listener))
                    .key(keys.task(&run.task_id))
                    .arg(&run.listener)
                    .arg(key)
                    .arg(&run.task_id)
                    .arg(&run.message);
            }
            let delivered: i64 = script.invoke_async(&mut self.queue.connection()).await?;
            self.delivered(delivered);
        }
        Ok(())
    }

    /// The chain of the run of `task_id`, if it is in one.
    pub(crate) async fn run_of(&self, task_id: &str) -> Result<Option<RunOf>, QueueError> {
        for queue in self.queues.iter() {
            let keys = Namespace::of_queue(queue);
            let run: Option<Vec<u8>> = redis::cmd("HGET")
                .arg(keys.runs())
                .arg(task_id)
                .query_async(&mut self.queue.connection())
                .await?;
            if let Some(run) = run.as_deref().and_then(StoredRun::decode) {
                return Ok(Some(RunOf {
                    queue: queue.clone(),
                    listener: run.listener,
                    key: run.key,
                }));
            }
        }
        Ok(None)
    }

    /// Where the run of `task_id` in `queue`, of `listener`'s chain for
    /// `key`, stands, without taking a turn: 0 for the head, `None` for a
    /// run in no chain.
    pub(crate) async fn position(
        &self,
        queue: &str,
        listener: &str,
        key: &str,
        task_id: &str,
    ) -> Result<Option<i64>, QueueError> {
        Ok(redis::cmd("LPOS")
            .arg(Namespace::of_queue(queue).chain(listener, key))
            .arg(task_id)
            .query_async(&mut self.queue.connection())
            .await?)
    }

    /// What ordering holds back now: counts from Valkey, and the heads
    /// that failed for good from `listener_failures`.
    pub(crate) async fn held(&self) -> anyhow::Result<Held> {
        let mut held = Held::default();
        for queue in self.queues.iter() {
            let keys = Namespace::of_queue(queue);
            let failed: Vec<String> = sqlx::query_scalar(
                "SELECT task_id FROM listener_failures WHERE queue = $1 AND holds_key",
            )
            .bind(queue)
            .fetch_all(&self.pool)
            .await?;
            let mut pipe = redis::pipe();
            pipe.zcard(keys.heads())
                .hlen(keys.runs())
                .zcard(keys.waiting());
            let (heads, runs, waiting_events, failed_heads): (i64, i64, i64, Vec<Option<f64>>) =
                if failed.is_empty() {
                    let (heads, runs, waiting): (i64, i64, i64) = pipe
                        .query_async(&mut self.queue.connection())
                        .await
                        .map_err(QueueError::from)?;
                    (heads, runs, waiting, Vec::new())
                } else {
                    pipe.cmd("ZMSCORE").arg(keys.heads()).arg(&failed);
                    pipe.query_async(&mut self.queue.connection())
                        .await
                        .map_err(QueueError::from)?
                };
            let blocked = failed_heads.iter().flatten().count();
            held.blocked_keys += i64::try_from(blocked).unwrap_or(i64::MAX);
            held.waiting_runs += (runs - heads).max(0);
            held.waiting_events += waiting_events;
        }
        Ok(held)
    }

    /// The runs of the event `event_id`, of key `key`, still in their
    /// chains.
    pub(crate) async fn standing(
        &self,
        event_id: Uuid,
        key: &str,
    ) -> Result<Vec<Standing>, QueueError> {
        let mut conn = self.queue.connection();
        let mut standing = Vec::new();
        for queue in self.queues.iter() {
            let keys = Namespace::of_queue(queue);
            let listeners: Vec<String> = redis::cmd("SMEMBERS")
                .arg(keys.listeners())
                .query_async(&mut conn)
                .await?;
            for listener in listeners {
                let chain: Vec<String> = redis::cmd("LRANGE")
                    .arg(keys.chain(&listener, key))
                    .arg(0)
                    .arg(-1)
                    .query_async(&mut conn)
                    .await?;
                if chain.is_empty() {
                    continue;
                }
                let runs: Vec<Option<Vec<u8>>> = redis::cmd("HMGET")
                    .arg(keys.runs())
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

    /// The task of the run `head`: the listener tasks' retries, timeout
    /// and retention.
    fn run_task(&self, head: NewTask) -> NewTask {
        head.max_retry(MAX_RETRY)
            .timeout(TASK_TIMEOUT)
            .retention(self.retention)
    }
}

/// The [`Turn`] of a reply of [`TURN`] or [`REJOIN`]; `None` for a run in
/// no chain.
fn turn_of(reply: Vec<redis::Value>) -> Result<Option<Turn>, QueueError> {
    let mut reply = reply.into_iter();
    let at: i64 = parse(reply.next().unwrap_or(redis::Value::Int(-2)))?;
    Ok(match at {
        0 => {
            let token: i64 = parse(reply.next().unwrap_or(redis::Value::Int(0)))?;
            let next: String = reply.next().map(parse).transpose()?.unwrap_or_default();
            let rebuilt: i64 = reply.next().map(parse).transpose()?.unwrap_or(0);
            Some(Turn::Now {
                token,
                next: (!next.is_empty()).then_some(next),
                rebuilt: rebuilt == 1,
            })
        }
        -1 => Some(Turn::Done),
        -2 => None,
        before => Some(Turn::After(before)),
    })
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
