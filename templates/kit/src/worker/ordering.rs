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
use std::time::Duration;

use sqlx::PgPool;
use sqlx::types::Json;
use uuid::Uuid;

use crate::outbox::order::Place;
use crate::outbox::relay::{MAX_RETRY, TASK_TIMEOUT};
use crate::queue::{Client, HandlerError, NewTask};

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

/// A run to queue, as the SQL functions of the migration return it: task
/// type, id, queue, payload, headers.
type Head = (
    String,
    String,
    String,
    Vec<u8>,
    Json<BTreeMap<String, String>>,
);
/// A [`Head`] after its key.
type KeyedHead = (
    String,
    String,
    String,
    String,
    Vec<u8>,
    Json<BTreeMap<String, String>>,
);

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

/// The chains of ordered listeners, in Postgres, and the queue their heads
/// go to.
#[derive(Clone)]
pub(crate) struct Ordering {
    pool: PgPool,
    queue: Client,
    /// How long a listener task is kept after it succeeds.
    retention: Duration,
}

impl std::fmt::Debug for Ordering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ordering")
            .field("retention", &self.retention)
            .finish_non_exhaustive()
    }
}

impl Ordering {
    /// Chains in `pool`'s database whose heads go to `queue`, kept
    /// `retention` after they succeed.
    pub(crate) fn new(pool: PgPool, queue: Client, retention: Duration) -> Self {
        Self {
            pool,
            queue,
            retention,
        }
    }

    /// Fans out the keyed event at `place` to its ordered listeners
    /// (`event`), in its key's sequence, in one statement (the migration's
    /// `outbox_fan_out`): added to their chains now if the event before it
    /// was fanned out, else kept in `outbox_key_waits` until it is, and then
    /// each waiting event that is next. `replay`: the task is a replay, whose
    /// runs join the end of the chains if the event was fanned out already.
    /// The heads this makes go to the queue after the commit.
    pub(crate) async fn fan_out(
        &self,
        place: &Place,
        event: &EventRuns,
        replay: bool,
    ) -> Result<(), HandlerError> {
        let column = |field: fn(&ChainRun) -> &String| -> Vec<&str> {
            event.runs.iter().map(|run| field(run).as_str()).collect()
        };
        let heads: Vec<Head> =
            sqlx::query_as("SELECT * FROM outbox_fan_out($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)")
                .bind(&place.key)
                .bind(place.seq)
                .bind(replay)
                .bind(&event.queue)
                .bind(event.event_id)
                .bind(&event.payload)
                .bind(Json(&event.headers))
                .bind(column(|run| &run.listener))
                .bind(column(|run| &run.task_type))
                .bind(column(|run| &run.task_id))
                .fetch_all(&self.pool)
                .await?;
        self.enqueue(&place.key, heads).await
    }

    /// Where the run of the task `task_id` stands.
    pub(crate) async fn turn(&self, task_id: &str) -> Result<Turn, sqlx::Error> {
        let stands: Option<(i64, Option<i64>)> = sqlx::query_as(
            "SELECT r.position, k.head FROM ordered_runs r \
             LEFT JOIN ordered_keys k ON k.listener = r.listener AND k.key = r.key \
             WHERE r.task_id = $1",
        )
        .bind(task_id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(match stands {
            None => Turn::Done,
            Some((position, Some(head))) if position > head => Turn::After(position - head),
            Some((position, Some(head))) if position == head => Turn::Now,
            // Behind the head, or without a chain: left over from a crash.
            Some(_) => Turn::Done,
        })
    }

    /// The run of `task_id` is over (it succeeded, gave up under
    /// `MoveOn`, or `outbox skip` moved past it): its chain moves on and the
    /// next run of its key goes to the queue (the migration's
    /// `ordered_move_on`). Also for a run found done ([`Turn::Done`]): then
    /// the chain's head goes to the queue again, in case a crash kept it
    /// out. `listener` and `key` name the chain.
    pub(crate) async fn advance(
        &self,
        listener: &str,
        key: &str,
        task_id: &str,
    ) -> Result<(), HandlerError> {
        let heads: Vec<Head> = sqlx::query_as("SELECT * FROM ordered_move_on($1, $2, $3)")
            .bind(task_id)
            .bind(listener)
            .bind(key)
            .fetch_all(&self.pool)
            .await?;
        self.enqueue(key, heads).await
    }

    /// Queues again the heads that have waited longer than `older_than`
    /// since they joined their chain, at most [`REQUEUE_BATCH`] a call: a
    /// head whose task Valkey lost (a restart without its append-only file,
    /// a failover before replication) would hold its key for ever, and
    /// `outbox replay` adds runs at the chains' ends, behind it. A head the
    /// queue has (waiting, running, retried or archived) is a duplicate and
    /// left as it is. How many heads it looked at.
    pub(crate) async fn requeue_old_heads(
        &self,
        older_than: Duration,
    ) -> Result<usize, HandlerError> {
        let heads: Vec<KeyedHead> = sqlx::query_as(
            "SELECT r.key, r.task_type, r.task_id, r.queue, r.payload, r.headers \
                 FROM ordered_keys k JOIN ordered_runs r \
                   ON r.listener = k.listener AND r.key = k.key AND r.position = k.head \
                 WHERE r.added_at < now() - make_interval(secs => $1) \
                 ORDER BY r.added_at LIMIT $2",
        )
        .bind(older_than.as_secs_f64())
        .bind(REQUEUE_BATCH)
        .fetch_all(&self.pool)
        .await?;
        let count = heads.len();
        let tasks: Vec<NewTask> = heads
            .into_iter()
            .map(|(key, task_type, task_id, queue, payload, headers)| {
                self.run_task(&key, (task_type, task_id, queue, payload, headers))
            })
            .collect();
        self.send(&tasks).await?;
        Ok(count)
    }

    /// Queues `heads`, runs of `key`.
    async fn enqueue(&self, key: &str, heads: Vec<Head>) -> Result<(), HandlerError> {
        let tasks: Vec<NewTask> = heads
            .into_iter()
            .map(|head| self.run_task(key, head))
            .collect();
        self.send(&tasks).await
    }

    /// Queues `tasks` (none: no call); a task the queue has already is left
    /// as it is.
    async fn send(&self, tasks: &[NewTask]) -> Result<(), HandlerError> {
        if tasks.is_empty() {
            return Ok(());
        }
        for result in self.queue.enqueue(tasks).await? {
            result?;
        }
        Ok(())
    }

    /// The task of `head`, a run of `key`, marked as a run of its chain.
    fn run_task(&self, key: &str, head: Head) -> NewTask {
        let (task_type, task_id, queue, payload, Json(mut headers)) = head;
        headers.insert(ORDERED_HEADER.into(), key.to_string());
        NewTask::new(task_type, task_id, payload)
            .queue(queue)
            .headers(headers)
            .max_retry(MAX_RETRY)
            .timeout(TASK_TIMEOUT)
            .retention(self.retention)
    }
}

/// The most heads [`Ordering::requeue_old_heads`] queues again a call.
pub(crate) const REQUEUE_BATCH: i64 = 1_000;
/// How long a head waits before the worker queues it again, in case Valkey
/// lost its task, and how often it looks. A head the queue has is a
/// duplicate: one cheap round trip for all of them.
pub(crate) const REQUEUE_AFTER: Duration = Duration::from_secs(10);

/// Every [`REQUEUE_AFTER`] until `stop`: queues again the heads that have
/// waited longer than that ([`Ordering::requeue_old_heads`]).
pub(crate) async fn requeue_old_heads(
    ordering: Ordering,
    stop: tokio_util::sync::CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(REQUEUE_AFTER) => {}
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

/// Deletes what ordering keeps of idle keys: chains with no run left, and
/// keys whose events were all fanned out and none dispatched for
/// `retention` (a later event of the key starts its numbers again at 1).
pub(crate) async fn delete_idle(pool: &PgPool, retention: Duration) -> Result<u64, sqlx::Error> {
    let chains = sqlx::query("DELETE FROM ordered_keys WHERE head > tail")
        .execute(pool)
        .await?
        .rows_affected();
    let keys = sqlx::query(
        "DELETE FROM outbox_keys WHERE seq = fanned_out \
         AND updated_at < now() - make_interval(secs => $1)",
    )
    .bind(retention.as_secs_f64())
    .execute(pool)
    .await?
    .rows_affected();
    Ok(chains + keys)
}

/// The chain a run is in: its listener and key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunOf {
    /// The chain's listener.
    pub listener: String,
    /// The key.
    pub key: String,
}

/// The chain of the run of `task_id`, if it is in one.
pub(crate) async fn run_of(pool: &PgPool, task_id: &str) -> Result<Option<RunOf>, sqlx::Error> {
    let run: Option<(String, String)> =
        sqlx::query_as("SELECT listener, key FROM ordered_runs WHERE task_id = $1")
            .bind(task_id)
            .fetch_optional(pool)
            .await?;
    Ok(run.map(|(listener, key)| RunOf { listener, key }))
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

/// What ordering holds back now.
pub(crate) async fn held(pool: &PgPool) -> Result<Held, sqlx::Error> {
    let (blocked_keys, waiting_runs, waiting_events): (i64, i64, i64) = sqlx::query_as(
        "SELECT \
           (SELECT count(*) FROM ordered_keys k \
              JOIN ordered_runs r ON r.listener = k.listener AND r.key = k.key \
                AND r.position = k.head \
              JOIN listener_failures f ON f.task_id = r.task_id), \
           (SELECT count(*) FROM ordered_runs r JOIN ordered_keys k \
              ON k.listener = r.listener AND k.key = r.key WHERE r.position > k.head), \
           (SELECT count(*) FROM outbox_key_waits)",
    )
    .fetch_one(pool)
    .await?;
    Ok(Held {
        blocked_keys,
        waiting_runs,
        waiting_events,
    })
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

/// The runs of event `event_id` still in their chains.
pub(crate) async fn standing(pool: &PgPool, event_id: Uuid) -> Result<Vec<Standing>, sqlx::Error> {
    let rows: Vec<(String, String, String, i64, Option<String>)> = sqlx::query_as(
        "SELECT r.task_id, r.listener, r.key, r.position - k.head, h.task_id \
         FROM ordered_runs r \
         JOIN ordered_keys k ON k.listener = r.listener AND k.key = r.key \
         LEFT JOIN ordered_runs h ON h.listener = r.listener AND h.key = r.key \
           AND h.position = k.head AND h.task_id <> r.task_id \
         WHERE r.event_id = $1 ORDER BY r.listener",
    )
    .bind(event_id)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(task_id, listener, key, after, waits_for)| Standing {
            task_id,
            listener,
            key,
            after,
            waits_for,
        })
        .collect())
}
