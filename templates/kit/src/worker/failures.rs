//! The listener tasks that failed for good, kept in Postgres
//! (`listener_failures`, a kit migration) so that nothing falls off: the
//! queue keeps at most 10,000 archived tasks a queue and drops the oldest
//! (as Go asynq does, asynq #803).
//!
//! The worker records a listener task's failure before the queue archives
//! it, and archives it only once the record is committed: a record that
//! cannot be written (Postgres down) keeps the task out of the archive,
//! retried a minute later (see the consumer's `before_archive`). Then it
//! calls the service's hook, [`Listeners::on_failure`](super::listeners::Listeners::on_failure)
//! (asynq #1078). A record is forgotten when its task is sent back to the
//! queue (`outbox retry-archived`, the console) or when the task, run
//! again after a failure (asynqmon's "run"), succeeds, and once older than
//! `WORKER_FAILURE_RETENTION` ([`delete_expired`]), unless it holds its key.
//!
//! A record *holds its key* (`holds_key`) while its task is the first run
//! of an ordered listener's key that keeps the key (`OnFailure::HoldKey`):
//! the outbox's cleanup keeps that event and the later ones of its key,
//! and the record does not expire. It stops holding once the key moves past
//! it (`outbox skip`, or the worker finding it no longer first).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use super::task_names::{ORDERED_HEADER, listener_of};
use crate::queue::message::TaskMessage;

/// One listener task that failed for good, as the hook of
/// [`Listeners::on_failure`](super::listeners::Listeners::on_failure) gets
/// it, once it is recorded.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ListenerFailure {
    /// The task's id in the queue.
    pub task_id: String,
    /// The queue it is archived in.
    pub queue: String,
    /// The event's id; `None` when the task's payload is not an event
    /// envelope.
    pub event_id: Option<Uuid>,
    /// The event's name.
    pub event_name: String,
    /// The listener's name.
    pub listener: String,
    /// The error of its last run.
    pub error: String,
    /// How many times it ran.
    pub attempts: u32,
    /// When it was recorded.
    pub failed_at: DateTime<Utc>,
}

/// The service's hook on each failure recorded.
pub(crate) type FailureHook =
    Arc<dyn Fn(ListenerFailure) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// The event's id in a task's payload, when it is an envelope.
#[derive(serde::Deserialize)]
struct EnvelopeId {
    id: Uuid,
}

/// Records the failure of `message`, archived with `error` (holding its
/// key when `holds_key`), and calls `hook` with it. Any other task than a
/// listener's is let through. `Err` says why it could not be recorded.
pub(crate) async fn record(
    pool: &PgPool,
    hook: Option<&FailureHook>,
    message: &TaskMessage,
    error: &str,
    holds_key: bool,
) -> Result<(), String> {
    let Some((event_name, listener)) = listener_of(&message.r#type) else {
        return Ok(());
    };
    let event_id = serde_json::from_slice::<EnvelopeId>(&message.payload)
        .ok()
        .map(|envelope| envelope.id);
    let attempts = u32::try_from(message.retried).unwrap_or(0) + 1;
    let failed_at: DateTime<Utc> = sqlx::query_scalar(
        "INSERT INTO listener_failures \
           (task_id, queue, event_id, event_name, listener, error, attempts, holds_key) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
         ON CONFLICT (task_id) DO UPDATE SET queue = EXCLUDED.queue, error = EXCLUDED.error, \
           attempts = EXCLUDED.attempts, holds_key = EXCLUDED.holds_key, failed_at = now() \
         RETURNING failed_at",
    )
    .bind(&message.id)
    .bind(&message.queue)
    .bind(event_id)
    .bind(event_name)
    .bind(listener)
    .bind(error)
    .bind(i32::try_from(attempts).unwrap_or(i32::MAX))
    .bind(holds_key)
    .fetch_one(pool)
    .await
    .map_err(|err| format!("cannot record the failure in listener_failures: {err}"))?;
    if let Some(hook) = hook {
        hook(ListenerFailure {
            task_id: message.id.clone(),
            queue: message.queue.clone(),
            event_id,
            event_name: event_name.to_string(),
            listener: listener.to_string(),
            error: error.to_string(),
            attempts,
            failed_at,
        })
        .await;
    }
    Ok(())
}

/// Stops the records of `task_ids` from holding their keys (moved past);
/// how many did.
pub(crate) async fn release<S: AsRef<str>>(
    pool: &PgPool,
    task_ids: &[S],
) -> Result<u64, sqlx::Error> {
    let ids: Vec<&str> = task_ids.iter().map(AsRef::as_ref).collect();
    let done = sqlx::query(
        "UPDATE listener_failures SET holds_key = false WHERE task_id = ANY($1) AND holds_key",
    )
    .bind(&ids)
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}

/// Deletes the records older than `retention` that hold no key, batch by
/// batch; how many.
pub(crate) async fn delete_expired(pool: &PgPool, retention: Duration) -> Result<u64, sqlx::Error> {
    crate::outbox::cleanup::in_batches(|| async {
        let deleted = sqlx::query(
            "DELETE FROM listener_failures WHERE task_id IN ( \
               SELECT task_id FROM listener_failures \
               WHERE NOT holds_key AND failed_at < now() - make_interval(secs => $1) \
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

/// The task of a failure recorded whose task the queue no longer has,
/// sent back: `task_id` of `task_type` in `queue`, its event's `envelope`
/// (from the outbox), the trace context of its dispatch, and, for an event
/// with a key, the mark of a run of its key's order (an ordered listener's
/// run joins its key's order at the end). Kept `retention` after it
/// succeeds; the retries and timeout of `policy`, its listener's (the
/// default one's for a listener the service no longer has).
pub(crate) fn sent_back_task(
    envelope: &crate::outbox::Envelope,
    task_type: String,
    task_id: String,
    queue: &str,
    retention: Duration,
    policy: Option<super::retry_policy::RetryPolicy>,
) -> crate::queue::NewTask {
    let payload = serde_json::to_vec(envelope).expect("an envelope serialises");
    let mut headers = crate::trace_context::task_headers(&envelope.metadata);
    if let Some(key) = envelope.metadata.get(crate::outbox::order::ORDER_KEY) {
        headers.insert(ORDERED_HEADER.into(), key.clone());
    }
    let task = crate::queue::NewTask::new(task_type, task_id, payload)
        .queue(queue)
        .headers(headers)
        .retention(retention);
    policy.unwrap_or_default().apply(task)
}

/// asynq's "run" of the task `id` of `queue` as the kit sends a listener
/// task back (`outbox retry-archived`, the console's Retry): moved to
/// pending with its id and its count of failed runs, and, in the same step,
/// its count of snoozes reset and the retries and timeout of its
/// listener's policy now, in `listeners` (code and `WORKER_RETRIES`); a
/// listener the service no longer has keeps the task's own. Any other
/// task moves as it is.
pub(crate) async fn run_again(
    client: &crate::queue::Client,
    listeners: &super::listeners::Listeners,
    queue: &str,
    id: &str,
) -> Result<crate::queue::RunOutcome, crate::queue::QueueError> {
    client
        .run_task_rewritten(queue, id, |message| {
            let Some((event, listener)) = listener_of(&message.r#type) else {
                return;
            };
            message.headers.remove(crate::queue::SNOOZES_HEADER);
            if let Some(policy) = listeners.policy_of(event, listener) {
                with_policy(message, policy);
            }
        })
        .await
}

/// `message` with the retries and timeout of `policy`, as a new task of
/// it stores them (asynq's `retry`, and `timeout` in whole seconds).
fn with_policy(message: &mut TaskMessage, policy: super::retry_policy::RetryPolicy) {
    message.retry = i32::try_from(policy.retries).unwrap_or(i32::MAX);
    message.timeout = i64::try_from(policy.run_timeout().as_secs()).unwrap_or(i64::MAX);
}

/// Forgets the records of `task_ids` written before `before` (sent back
/// to the queue at `before`: a record written since is of a run that failed
/// again since); how many there were.
pub(crate) async fn forget_before(
    pool: &PgPool,
    task_ids: &[String],
    before: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    if task_ids.is_empty() {
        return Ok(0);
    }
    let done =
        sqlx::query("DELETE FROM listener_failures WHERE task_id = ANY($1) AND failed_at < $2")
            .bind(task_ids)
            .bind(before)
            .execute(pool)
            .await?;
    Ok(done.rows_affected())
}

/// Forgets the records of `task_ids` (sent back to the queue, or
/// succeeded); how many there were.
pub(crate) async fn forget(pool: &PgPool, task_ids: &[String]) -> Result<u64, sqlx::Error> {
    if task_ids.is_empty() {
        return Ok(0);
    }
    let done = sqlx::query("DELETE FROM listener_failures WHERE task_id = ANY($1)")
        .bind(task_ids)
        .execute(pool)
        .await?;
    Ok(done.rows_affected())
}
