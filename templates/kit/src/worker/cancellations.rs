//! The listener tasks that were cancelled, kept in Postgres
//! (`listener_cancellations`, a kit migration) apart from the failures
//! (`super::failures`): a cancelled run did not fail, and "Send back"
//! (`outbox retry-archived`, the console) leaves it unless asked.
//!
//! Two writers: `outbox cancel` (and the console's Cancel, the kit call
//! `crate::operations::cancel_event`) records each task it deleted from
//! the queue before it ran again; the worker records each run it stopped
//! because its task id came on `asynq:cancel` ([`record_on_cancel`]: the
//! consumer then deletes the task, neither retried nor archived). A run
//! of an ordered listener that is cancelled moves its key on, as `outbox
//! skip` does: the key's next run goes to the queue.
//!
//! A record is forgotten when its task is sent back to the queue, and once
//! older than `WORKER_FAILURE_RETENTION` ([`delete_expired`]).

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

use super::ordering::{End, ORDERED_HEADER, Ordering};
use super::task_names::listener_of;
use crate::queue::message::TaskMessage;
use crate::queue::{CancelVerdict, Client, Consumer, keys};

/// One cancellation to record.
#[derive(Debug, Clone)]
pub(crate) struct Cancelled {
    pub(crate) task_id: String,
    pub(crate) queue: String,
    pub(crate) event_id: Option<Uuid>,
    pub(crate) event_name: String,
    pub(crate) listener: String,
    /// `pending`, `scheduled`, `retry`, `active`, `waiting`, or `before`
    /// (cancelled before the fan-out made its task, which it then does
    /// not make).
    pub(crate) state: String,
    /// Its runs that failed before.
    pub(crate) retried: i32,
}

/// The event's id in a task's payload, when it is an envelope.
#[derive(serde::Deserialize)]
struct EnvelopeId {
    id: Uuid,
}

impl Cancelled {
    /// The cancellation of the listener task `message`, which was in
    /// `state`; `None` for a task that is not a listener's.
    pub(crate) fn of_message(message: &TaskMessage, state: &str) -> Option<Self> {
        let (event_name, listener) = listener_of(&message.r#type)?;
        Some(Self {
            task_id: message.id.clone(),
            queue: message.queue.clone(),
            event_id: serde_json::from_slice::<EnvelopeId>(&message.payload)
                .ok()
                .map(|envelope| envelope.id),
            event_name: event_name.to_string(),
            listener: listener.to_string(),
            state: state.to_string(),
            retried: message.retried,
        })
    }
}

/// Records `cancelled` (a task cancelled again replaces its record), each
/// with its failure forgotten: a failure recorded earlier (archived, then
/// run again from asynqmon) would make a plain "Send back" queue the
/// cancelled task again.
pub(crate) async fn record(pool: &PgPool, cancelled: &[Cancelled]) -> Result<(), sqlx::Error> {
    for one in cancelled {
        let mut tx = pool.begin().await?;
        sqlx::query("DELETE FROM listener_failures WHERE task_id = $1")
            .bind(&one.task_id)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO listener_cancellations \
               (task_id, queue, event_id, event_name, listener, state, retried) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (task_id) DO UPDATE SET queue = EXCLUDED.queue, state = EXCLUDED.state, \
               retried = EXCLUDED.retried, cancelled_at = now()",
        )
        .bind(&one.task_id)
        .bind(&one.queue)
        .bind(one.event_id)
        .bind(&one.event_name)
        .bind(&one.listener)
        .bind(&one.state)
        .bind(one.retried)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
    }
    Ok(())
}

/// Makes `consumer` treat a cancelled listener run as final: it is
/// recorded in `pool`'s `listener_cancellations` and, for a run of an
/// ordered listener, its key moved on (`ordering`); then the consumer
/// deletes the task. A record that fails keeps the task, retried later
/// as a failure whose record failed is; a move that fails is logged (the
/// worker's look at old heads moves the key on). Any other task
/// (`event:` fan-out, `job:` schedule) fails as in Go asynq: retried.
pub(crate) fn record_on_cancel(consumer: &mut Consumer, pool: PgPool, ordering: Ordering) {
    consumer.on_cancel(Arc::new(move |message| {
        let (pool, ordering) = (pool.clone(), ordering.clone());
        Box::pin(async move {
            let Some(cancelled) = Cancelled::of_message(&message, "active") else {
                return CancelVerdict::Failed;
            };
            let listener = cancelled.listener.clone();
            if let Err(err) = record(&pool, &[cancelled]).await {
                return CancelVerdict::Unrecorded(format!(
                    "listener_cancellations could not be written: {err}"
                ));
            }
            if let Some(key) = message.headers.get(ORDERED_HEADER) {
                let moved = ordering
                    .move_on(
                        &message.queue,
                        &listener,
                        key,
                        &message.id,
                        None,
                        End::Past,
                        None,
                    )
                    .await;
                if let Err(err) = moved {
                    tracing::error!(task = %message.id, key, error = %err, "could not move the key of a cancelled ordered run on; the worker's look at old heads does");
                }
            }
            CancelVerdict::Final
        })
    }));
}

/// Marks `task_id` cancelled before the fan-out made it, in each of
/// `queues` (the sorted set `keys::cancelled_before`, scored by the time of
/// the cancel), where the fan-out's enqueue finds it in the same step as it
/// would make the task, and leaves it out: a fan-out costs no read more,
/// and a cancel either is seen there or finds the task the fan-out made.
/// Marks older than `keep` are dropped on the way.
pub(crate) async fn mark_before(
    client: &Client,
    queues: &[String],
    task_id: &str,
    keep: Duration,
) -> redis::RedisResult<()> {
    let now = chrono::Utc::now().timestamp();
    let oldest = now.saturating_sub(i64::try_from(keep.as_secs()).unwrap_or(i64::MAX));
    let mut conn = client.connection();
    for queue in queues {
        let key = keys::cancelled_before(queue);
        redis::cmd("ZADD")
            .arg(&key)
            .arg(now)
            .arg(task_id)
            .query_async::<()>(&mut conn)
            .await?;
        redis::cmd("ZREMRANGEBYSCORE")
            .arg(&key)
            .arg("-inf")
            .arg(format!("({oldest}"))
            .query_async::<()>(&mut conn)
            .await?;
    }
    Ok(())
}

/// Those of `task_ids` marked cancelled before the fan-out in `queue`
/// ([`mark_before`]): an ordered listener's runs join their chains, not
/// the enqueue that checks the marks itself.
pub(crate) async fn cancelled_before(
    client: &Client,
    queue: &str,
    task_ids: &[String],
) -> redis::RedisResult<Vec<String>> {
    if task_ids.is_empty() {
        return Ok(Vec::new());
    }
    let scores: Vec<Option<f64>> = redis::cmd("ZMSCORE")
        .arg(keys::cancelled_before(queue))
        .arg(task_ids)
        .query_async(&mut client.connection())
        .await?;
    Ok(task_ids
        .iter()
        .zip(scores)
        .filter_map(|(id, score)| score.map(|_| id.clone()))
        .collect())
}

/// Forgets the records of `task_ids` (sent back to the queue); how many
/// there were.
pub(crate) async fn forget(pool: &PgPool, task_ids: &[String]) -> Result<u64, sqlx::Error> {
    if task_ids.is_empty() {
        return Ok(0);
    }
    let done = sqlx::query("DELETE FROM listener_cancellations WHERE task_id = ANY($1)")
        .bind(task_ids)
        .execute(pool)
        .await?;
    Ok(done.rows_affected())
}

/// Deletes the records older than `retention`, batch by batch; how many.
pub(crate) async fn delete_expired(pool: &PgPool, retention: Duration) -> Result<u64, sqlx::Error> {
    crate::outbox::cleanup::in_batches(|| async {
        let deleted = sqlx::query(
            "DELETE FROM listener_cancellations WHERE task_id IN ( \
               SELECT task_id FROM listener_cancellations \
               WHERE cancelled_at < now() - make_interval(secs => $1) \
               LIMIT $2 FOR UPDATE SKIP LOCKED)",
        )
        .bind(retention.as_secs_f64())
        .bind(i64::from(crate::outbox::cleanup::CLEANUP_BATCH))
        .execute(pool)
        .await?;
        Ok(deleted.rows_affected())
    })
    .await
}
