//! One run of a task's handler: found by the longest matching pattern,
//! within the task's trace, bounded by its deadline, its lease, a
//! cancellation and the shutdown timeout; and how it ended, [`Outcome`].

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use super::{RunningConsumer, Task};
use crate::queue::message::TaskMessage;
use crate::spans;
use crate::trace_context::{self, TraceContext};

/// The error recorded on a task that ran past its deadline, or was past it
/// when its turn to run came (Go's `context.DeadlineExceeded`).
const DEADLINE_EXCEEDED: &str = "context deadline exceeded";
/// The error recorded on a task cancelled through `asynq:cancel` (Go's
/// `context.Canceled`).
pub(super) const CANCELED: &str = "context canceled";

/// How one run of a task ended.
pub(super) enum Outcome {
    Succeeded,
    Failed {
        error: String,
        skip_retry: bool,
    },
    /// Cancelled through `asynq:cancel`, on a consumer with a hook that
    /// says whether the cancellation is final (`Consumer::on_cancel`).
    Cancelled,
    /// The handler deferred the task to `until` (not a failure); a snooze
    /// counts in the task's `SNOOZES_HEADER`.
    Deferred {
        until: DateTime<Utc>,
        snooze: bool,
    },
    /// The lease ran out (Valkey unreachable): the recoverer owns the task.
    LeaseLost,
    /// Another run of the task holds it (this one's lease ran out while it
    /// ran, and another worker took it over): left to that run.
    Superseded {
        error: String,
    },
    /// Cut short by shutdown.
    Interrupted,
}

impl RunningConsumer {
    /// Runs the handler, bounded by the task's deadline, its lease, a
    /// cancellation and the shutdown timeout.
    pub(super) async fn execute(
        &self,
        message: &TaskMessage,
        deadline: DateTime<Utc>,
        lease: watch::Receiver<Instant>,
        cancel: CancellationToken,
    ) -> Outcome {
        // As Go: a task already past its deadline is not started.
        if deadline <= Utc::now() {
            return Outcome::Failed {
                error: DEADLINE_EXCEEDED.into(),
                skip_retry: false,
            };
        }
        let Some(handler) = handler_for(&self.handlers, &message.r#type) else {
            return Outcome::Failed {
                error: format!("handler not found for task {:?}", message.r#type),
                skip_retry: false,
            };
        };
        // The run continues the trace of the task's headers, or starts one.
        let span = spans::process(
            &message.id,
            &message.r#type,
            &message.queue,
            message.retried,
        );
        let mut run = trace_context::spawn_in_task_trace(
            span.clone(),
            TraceContext::from_metadata(&message.headers).as_ref(),
            handler(Task::from(message)),
        );
        let outcome = tokio::select! {
            joined = &mut run => match joined {
                Ok(Ok(())) => Outcome::Succeeded,
                Ok(Err(err)) if err.is_superseded() => Outcome::Superseded { error: err.to_string() },
                Ok(Err(err)) => match err.deferred_until() {
                    Some(until) => Outcome::Deferred { until, snooze: err.is_snooze() },
                    None => Outcome::Failed {
                        error: err.to_string(),
                        skip_retry: err.skips_retry(),
                    },
                },
                Err(err) => Outcome::Failed { error: panic_message(err), skip_retry: false },
            },
            () = sleep_until(instant_at(deadline)) => Outcome::Failed {
                error: DEADLINE_EXCEEDED.into(),
                skip_retry: false,
            },
            () = cancel.cancelled() => {
                tracing::info!(id = %message.id, task_type = %message.r#type, "task cancelled");
                if self.on_cancel.is_some() {
                    Outcome::Cancelled
                } else {
                    Outcome::Failed { error: CANCELED.into(), skip_retry: false }
                }
            }
            () = lease_lost(lease.clone()) => Outcome::LeaseLost,
            () = self.abort.cancelled() => Outcome::Interrupted,
        };
        // A no-op for a run that has ended.
        run.abort();
        match &outcome {
            Outcome::Succeeded => spans::record_outcome(&span, "succeeded", None),
            Outcome::Failed { error, .. } => spans::record_outcome(&span, "failed", Some(error)),
            Outcome::Deferred { .. } => spans::record_outcome(&span, "deferred", None),
            Outcome::Cancelled => spans::record_outcome(&span, "cancelled", Some(CANCELED)),
            Outcome::LeaseLost => spans::record_outcome(&span, "lease_lost", Some("lease lost")),
            Outcome::Superseded { error } => {
                spans::record_outcome(&span, "superseded", Some(error));
            }
            Outcome::Interrupted => {
                spans::record_outcome(&span, "interrupted", Some("interrupted by shutdown"));
            }
        }
        outcome
    }
}

/// Completes once the lease is past its (possibly extended) expiry.
async fn lease_lost(mut lease: watch::Receiver<Instant>) {
    loop {
        let until = *lease.borrow_and_update();
        tokio::select! {
            () = sleep_until(until) => {
                if *lease.borrow() <= Instant::now() {
                    return;
                }
            }
            changed = lease.changed() => {
                if changed.is_err() {
                    // The lease was dropped: the task is being settled.
                    std::future::pending::<()>().await;
                }
            }
        }
    }
}

/// When the current run must end: `now` + timeout, or the task's deadline,
/// whichever is first (Go asynq's `computeDeadline`).
pub(super) fn deadline(message: &TaskMessage, now: DateTime<Utc>) -> DateTime<Utc> {
    let by_timeout = (message.timeout > 0).then(|| {
        TimeDelta::try_seconds(message.timeout)
            .and_then(|timeout| now.checked_add_signed(timeout))
            .unwrap_or(DateTime::<Utc>::MAX_UTC)
    });
    let by_deadline = (message.deadline > 0)
        .then(|| DateTime::from_timestamp(message.deadline, 0).unwrap_or(DateTime::<Utc>::MAX_UTC));
    match (by_timeout, by_deadline) {
        (Some(a), Some(b)) => a.min(b),
        (Some(at), None) | (None, Some(at)) => at,
        (None, None) => {
            tracing::error!(id = %message.id, "task has no timeout nor deadline; using 30 min");
            now + crate::queue::DEFAULT_TIMEOUT
        }
    }
}

/// The local instant at which the wall-clock `time` comes.
pub(super) fn instant_at(time: DateTime<Utc>) -> Instant {
    let left = (time - Utc::now()).to_std().unwrap_or(Duration::ZERO);
    Instant::now() + left.min(Duration::from_secs(100 * 365 * 24 * 3600))
}

fn panic_message(err: tokio::task::JoinError) -> String {
    match err.try_into_panic() {
        Ok(panic) => {
            let text = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string payload".into());
            format!("panic: {text}")
        }
        Err(err) => format!("handler task failed: {err}"),
    }
}

/// The entry whose pattern is the longest prefix of `task_type` (the
/// handler of a task, as Go asynq's `ServeMux` picks it).
fn handler_for<'a, H>(handlers: &'a HashMap<String, H>, task_type: &str) -> Option<&'a H> {
    handlers
        .iter()
        .filter(|(pattern, _)| task_type.starts_with(pattern.as_str()))
        .max_by_key(|(pattern, _)| pattern.len())
        .map(|(_, handler)| handler)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_matching_pattern_handles_a_task() {
        let handlers: HashMap<String, &str> =
            [("event:", "fan-out"), ("event:orderPlaced", "special")]
                .into_iter()
                .map(|(pattern, name)| (pattern.to_string(), name))
                .collect();
        assert_eq!(
            handler_for(&handlers, "event:orderPlaced"),
            Some(&"special")
        );
        assert_eq!(
            handler_for(&handlers, "event:orderShipped"),
            Some(&"fan-out")
        );
        assert_eq!(handler_for(&handlers, "listener:orderPlaced:audit"), None);
    }
}
