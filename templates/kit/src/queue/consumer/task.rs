//! What a handler receives, [`Task`], and what it returns on failure,
//! [`HandlerError`]: a retry, an archive ([`SkipRetry`]), a deferral (counted in the task's
//! [`SNOOZES_HEADER`] for a snooze), or a run superseded by another.

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, Utc};

use crate::queue::message::TaskMessage;

/// The header in which a task counts the times it snoozed
/// ([`HandlerError::snooze`]); written by the deferral, read by the
/// listener handler.
pub(crate) const SNOOZES_HEADER: &str = "gpkit-snoozes";

/// A task as a handler receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Task {
    /// The task type, such as `event:orderPlaced`.
    pub(crate) task_type: String,
    /// The task id.
    pub(crate) id: String,
    /// The payload, as the producer enqueued it.
    pub(crate) payload: Vec<u8>,
    /// The task's headers (asynq's `TaskMessage.headers`), as the producer
    /// set them; a Go producer sets them with `asynq.NewTaskWithHeaders`.
    pub(crate) headers: BTreeMap<String, String>,
    /// The queue the task came from.
    pub(crate) queue: String,
    /// Failed runs before this one.
    pub(crate) retried: u32,
    /// Retries allowed after the first failed run.
    pub(crate) max_retry: u32,
    /// Whether an earlier run failed (the task carries its error): a retry,
    /// or an archived task run again.
    pub(crate) failed_before: bool,
}

impl From<&TaskMessage> for Task {
    fn from(message: &TaskMessage) -> Self {
        Self {
            task_type: message.r#type.clone(),
            id: message.id.clone(),
            payload: message.payload.clone(),
            headers: message.headers.clone(),
            queue: message.queue.clone(),
            retried: u32::try_from(message.retried).unwrap_or(0),
            max_retry: u32::try_from(message.retry).unwrap_or(0),
            failed_before: !message.error_msg.is_empty(),
        }
    }
}

/// Why a handler failed. Any error converts into it with `?`; the task is
/// retried, unless [`SkipRetry`] is in the error's chain (or the error was
/// made with [`HandlerError::skip_retry`]): then it is archived at once.
/// One made with `HandlerError::defer` is no failure: the task runs again
/// later.
pub(crate) struct HandlerError {
    error: anyhow::Error,
    skip_retry: bool,
    /// Set by [`HandlerError::defer`]: run again at this time, no retry
    /// counted.
    defer_until: Option<DateTime<Utc>>,
    /// Set by [`HandlerError::superseded`]: the task is another run's.
    superseded: bool,
    /// Set by [`HandlerError::snooze`]: the deferral counts in the task's
    /// [`SNOOZES_HEADER`].
    snooze: bool,
}

impl HandlerError {
    /// A failure that retrying cannot fix (Go's `asynq.SkipRetry`): the
    /// task is archived at once.
    pub(crate) fn skip_retry(error: impl Into<anyhow::Error>) -> Self {
        Self {
            error: error.into(),
            skip_retry: true,
            defer_until: None,
            superseded: false,
            snooze: false,
        }
    }

    /// Not a failure: the task waits in `:scheduled` until `until` (or
    /// until [`Client::promote`](crate::queue::Client::promote) moves it
    /// back) and runs again then, with no retry counted and its error and
    /// retry count unchanged; its slot is free at once. What a listener's
    /// limit returns when it is reached (`crate::worker::limits`).
    pub(crate) fn defer(until: DateTime<Utc>) -> Self {
        Self {
            error: anyhow::anyhow!("deferred until {}", until.to_rfc3339()),
            skip_retry: false,
            defer_until: Some(until),
            superseded: false,
            snooze: false,
        }
    }

    /// A deferral (as [`HandlerError::defer`]) that the task counts: the
    /// deferral writes the count in the task's [`SNOOZES_HEADER`], one
    /// more than it had. What a listener's `Snooze` returns.
    pub(crate) fn snooze(until: DateTime<Utc>) -> Self {
        Self {
            error: anyhow::anyhow!("snoozed until {}", until.to_rfc3339()),
            snooze: true,
            ..Self::defer(until)
        }
    }

    /// Whether it was made with [`HandlerError::snooze`].
    pub(crate) fn is_snooze(&self) -> bool {
        self.snooze
    }

    /// Not this run's to settle: another run of the task took it over (its
    /// lease ran out while this one still ran). The task is left as it is,
    /// as after a lost lease.
    pub(crate) fn superseded(error: impl Into<anyhow::Error>) -> Self {
        Self {
            error: error.into(),
            skip_retry: false,
            defer_until: None,
            superseded: true,
            snooze: false,
        }
    }

    /// Whether it was made with [`HandlerError::superseded`].
    pub(crate) fn is_superseded(&self) -> bool {
        self.superseded
    }

    /// When a deferred task runs again: `Some` for an error made with
    /// `HandlerError::defer`.
    pub(crate) fn deferred_until(&self) -> Option<DateTime<Utc>> {
        self.defer_until
    }

    /// Whether the task is archived at once rather than retried.
    pub(crate) fn skips_retry(&self) -> bool {
        self.skip_retry
    }
}

impl<E: Into<anyhow::Error>> From<E> for HandlerError {
    fn from(error: E) -> Self {
        let error = error.into();
        let skip_retry = error.chain().any(|cause| cause.is::<SkipRetry>());
        Self {
            error,
            skip_retry,
            defer_until: None,
            superseded: false,
            snooze: false,
        }
    }
}

/// A failure that retrying cannot fix: return it from a listener or a
/// scheduled job (`Err(SkipRetry("...".into()).into())`, also wrapped in
/// `anyhow`'s context) and its task is archived at once instead of retried,
/// as Go's `asynq.SkipRetry` does. `outbox retry-archived` runs it again
/// later.
#[derive(Debug, thiserror::Error)]
#[error("{0} (not retried)")]
pub struct SkipRetry(pub String);

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#}", self.error)
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerError")
            .field("error", &self.error)
            .field("skip_retry", &self.skip_retry)
            .field("defer_until", &self.defer_until)
            .field("snooze", &self.snooze)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeDelta;

    use super::*;

    #[test]
    fn a_deferral_is_no_failure() {
        let until = Utc::now() + TimeDelta::seconds(1);
        let deferred = HandlerError::defer(until);
        assert_eq!(deferred.deferred_until(), Some(until));
        assert!(!deferred.skip_retry);
        let failed = HandlerError::from(anyhow::anyhow!("boom"));
        assert_eq!(failed.deferred_until(), None);
    }
}
