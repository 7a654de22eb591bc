//! The kit's own state changes of a task, for the limits on listeners and
//! snoozes: a deferral (active to `:scheduled`, as Go's schedule leaves a
//! task, no retry counted; a snooze counted in a header), and the promotion of deferred tasks back to pending
//! before they are due (a limit's turn came) or the moment they are (the
//! consumer's own wake-up, ahead of the forwarder).

use std::collections::BTreeMap;

use chrono::{DateTime, TimeDelta, Utc};
use prost::Message as _;

use crate::queue::SNOOZES_HEADER;
use crate::queue::message::TaskMessage;
use crate::queue::{Client, QueueError, keys, scripts, wakeup};

/// How long a wake-up asked for while its task was still active waits for
/// the task's deferral ([`Client::promote`]); older ones are dropped.
const WOKEN_TTL: TimeDelta = TimeDelta::seconds(60);

impl Client {
    /// Not a failure: the task waits in `:scheduled` until `until`, its
    /// message (so its retry count and error) unchanged, its hash's state
    /// `scheduled` as Go's schedule leaves it; the score is `until` in
    /// whole seconds, rounded up, so that no forwarder moves it early. A
    /// task [`Self::promote`]d while it was still active goes straight back
    /// to the head of pending instead: `Ok(true)`. A task no longer active
    /// is Go's `NOT FOUND`. A `snooze` counts in the message's
    /// [`SNOOZES_HEADER`], one up, written with the deferral.
    pub(in crate::queue) async fn defer(
        &self,
        message: &TaskMessage,
        until: DateTime<Utc>,
        snooze: bool,
    ) -> Result<bool, QueueError> {
        let queue = &message.queue;
        let counted = if snooze {
            let mut counted = message.clone();
            let snoozes = snoozes_of(&counted.headers).saturating_add(1);
            counted
                .headers
                .insert(SNOOZES_HEADER.to_string(), snoozes.to_string());
            counted.encode_to_vec()
        } else {
            Vec::new()
        };
        let woken: i64 = scripts::DEFER
            .key(keys::task(queue, &message.id))
            .key(keys::active(queue))
            .key(keys::lease(queue))
            .key(keys::scheduled(queue))
            .key(keys::pending(queue))
            .key(keys::woken(queue))
            .arg(&message.id)
            .arg(due_score(until))
            .arg(Utc::now().timestamp_nanos_opt().unwrap_or_default())
            .arg(counted)
            .invoke_async(&mut self.conn())
            .await?;
        if woken == 1 {
            self.enqueued().signal();
        }
        Ok(woken == 1)
    }

    /// Wakes the deferred tasks `ids` of `queue` now (a limit's turn came):
    /// each still in `:scheduled` (and in no group) moves to the head of
    /// pending, where the next dequeue takes it; one still active (its
    /// handler's deferral on its way) is marked, so that its deferral sends
    /// it to pending instead (within [`WOKEN_TTL`]); one pending already,
    /// or scheduled in a group, is left to run as it is. Returns the ids of
    /// the tasks that no longer wait at all (gone, completed, retried,
    /// archived), so that a limit can pass their turn on.
    pub(crate) async fn promote(
        &self,
        queue: &str,
        ids: &[String],
    ) -> Result<Vec<String>, QueueError> {
        let tasks: Vec<(&str, Option<i64>)> = ids.iter().map(|id| (id.as_str(), None)).collect();
        let results = self.run_promote(queue, &tasks, true).await?;
        Ok(ids
            .iter()
            .zip(results)
            .filter(|(_, result)| *result == 0)
            .map(|(id, _)| id.clone())
            .collect())
    }

    /// The consumer's own wake-up of tasks it deferred, now due: each
    /// `(id, due)` still in `:scheduled` with a score of at most `due`
    /// (not deferred again since, to later) moves to the head of pending.
    pub(in crate::queue) async fn wake_due(
        &self,
        queue: &str,
        tasks: &[(String, i64)],
    ) -> Result<(), QueueError> {
        let tasks: Vec<(&str, Option<i64>)> = tasks
            .iter()
            .map(|(id, due)| (id.as_str(), Some(*due)))
            .collect();
        self.run_promote(queue, &tasks, false).await?;
        Ok(())
    }

    /// [`scripts::PROMOTE`] on `tasks` (ids with an optional bound on
    /// their score), marking the active ones when `mark_active`; its
    /// result per task. Wakes this process's idle consumers when a task
    /// moved, and publishes the wake-up as an enqueue does.
    async fn run_promote(
        &self,
        queue: &str,
        tasks: &[(&str, Option<i64>)],
        mark_active: bool,
    ) -> Result<Vec<i64>, QueueError> {
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        let now = Utc::now();
        let mut invocation = scripts::PROMOTE.prepare_invoke();
        invocation
            .key(keys::scheduled(queue))
            .key(keys::pending(queue))
            .key(keys::woken(queue))
            .arg(now.timestamp())
            .arg(now.timestamp_nanos_opt().unwrap_or_default())
            .arg((now - WOKEN_TTL).timestamp())
            .arg(u8::from(mark_active));
        for (id, bound) in tasks {
            invocation.key(keys::task(queue, id)).arg(*id);
            match bound {
                Some(bound) => invocation.arg(*bound),
                None => invocation.arg(""),
            };
        }
        let mut conn = self.conn();
        let results: Vec<i64> = invocation.invoke_async(&mut conn).await?;
        if results.len() != tasks.len() {
            return Err(QueueError::UnexpectedReply(format!(
                "the promote script answered for {} tasks of {}",
                results.len(),
                tasks.len()
            )));
        }
        if results.contains(&1) {
            self.enqueued().signal();
            if self.enqueued().publish() {
                // Best effort, as an enqueue's: consumers poll anyway.
                let published = redis::cmd("PUBLISH")
                    .arg(wakeup::CHANNEL)
                    .arg(queue)
                    .query_async::<i64>(&mut conn)
                    .await;
                if let Err(err) = published {
                    tracing::debug!(error = %err, "could not publish the wake-up");
                }
            }
        }
        Ok(results)
    }
}

/// The score of a task deferred to `until` in `:scheduled`: Unix seconds,
/// rounded up, so that no forwarder (which compares whole seconds) moves
/// it early.
pub(in crate::queue) fn due_score(until: DateTime<Utc>) -> i64 {
    until.timestamp() + i64::from(until.timestamp_subsec_nanos() > 0)
}

/// How many times the task of `headers` snoozed ([`SNOOZES_HEADER`]; 0
/// without it, or with a value that is no count).
pub(crate) fn snoozes_of(headers: &BTreeMap<String, String>) -> u32 {
    headers
        .get(SNOOZES_HEADER)
        .and_then(|count| count.parse().ok())
        .unwrap_or(0)
}
