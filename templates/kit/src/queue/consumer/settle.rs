//! Settling a task once its handler returned: the [`Settlement`] its
//! outcome calls for (complete, retry, archive, defer, requeue), decided
//! once and written until Valkey has it or the lease runs out.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use tokio::sync::watch;
use tokio::time::{Instant, sleep};

use super::execute::{CANCELED, Outcome, instant_at};
use super::wakeups::Wakeup;
use super::{CancelVerdict, RunningConsumer};
use crate::queue::QueueError;
use crate::queue::broker::{due_score, is_not_found};
use crate::queue::message::TaskMessage;

/// The longest pause between two tries of a failed acknowledgement (Go
/// asynq's syncer interval).
const MAX_SETTLE_BACKOFF: Duration = Duration::from_secs(5);
/// When the hook before an archive fails, the task is retried this much
/// later instead of archived.
const UNARCHIVED_RETRY: TimeDelta = TimeDelta::seconds(60);

/// The write that moves a finished task on, decided once so that a retried
/// write is the same write.
pub(super) enum Settlement {
    Complete,
    Retry {
        retry_at: DateTime<Utc>,
        error: String,
    },
    Archive {
        error: String,
    },
    Defer {
        until: DateTime<Utc>,
        /// Counted in the task's `SNOOZES_HEADER`.
        snooze: bool,
    },
    Requeue,
    /// A run cancelled for good (`Consumer::on_cancel`): the task is
    /// deleted.
    Delete,
}

impl RunningConsumer {
    /// Moves the task on according to the outcome of its run. A write that
    /// fails is tried again with backoff while the lease holds; from the
    /// first failure on the heartbeat no longer extends it, so a write that
    /// keeps failing gives up at the lease's end and the task is left to
    /// the recoverer, as in Go.
    pub(super) async fn settle(
        &self,
        message: &Arc<TaskMessage>,
        outcome: Outcome,
        lease: watch::Receiver<Instant>,
    ) {
        let (id, task_type) = (&message.id, &message.r#type);
        let settlement = match outcome {
            Outcome::Succeeded => {
                tracing::debug!(%id, %task_type, "task succeeded");
                Settlement::Complete
            }
            Outcome::Failed { error, skip_retry } => self.failed(message, error, skip_retry).await,
            Outcome::Deferred { until, snooze } => {
                tracing::debug!(%id, %task_type, %until, snooze, "task deferred");
                Settlement::Defer { until, snooze }
            }
            Outcome::Cancelled => {
                let verdict = match &self.on_cancel {
                    Some(hook) => hook(Arc::clone(message)).await,
                    None => CancelVerdict::Failed,
                };
                match verdict {
                    CancelVerdict::Final => {
                        tracing::info!(%id, %task_type, "task cancelled; deleted, not retried");
                        Settlement::Delete
                    }
                    CancelVerdict::Failed => self.failed(message, CANCELED.into(), false).await,
                    CancelVerdict::Unrecorded(why) => {
                        tracing::error!(%id, %task_type, reason = %why, retry_in = ?UNARCHIVED_RETRY, "task cancelled, but not deleted: its cancellation could not be recorded");
                        Settlement::Retry {
                            retry_at: Utc::now() + UNARCHIVED_RETRY,
                            error: format!("{CANCELED} (not deleted: {why})"),
                        }
                    }
                }
            }
            Outcome::LeaseLost => {
                tracing::warn!(%id, %task_type, "lease lost; the recoverer will retry the task");
                return;
            }
            Outcome::Superseded { error } => {
                tracing::warn!(%id, %task_type, %error, "another run of the task holds it; left to that run");
                return;
            }
            Outcome::Interrupted => {
                tracing::info!(%id, %task_type, "task interrupted by shutdown; back to pending");
                Settlement::Requeue
            }
        };

        let mut backoff = Duration::from_millis(100);
        for attempt in 1.. {
            let lease_until = *lease.borrow();
            if lease_until <= Instant::now() {
                tracing::error!(
                    %id,
                    %task_type,
                    "lease lost before the task could be updated; the recoverer will retry it"
                );
                return;
            }
            let err = match self.write(message, &settlement).await {
                Ok(true) => return,
                Ok(false) if attempt > 1 => {
                    // An earlier try reached Valkey although its reply was lost.
                    tracing::info!(%id, %task_type, "task updated by an earlier try");
                    return;
                }
                Ok(false) => {
                    tracing::error!(%id, %task_type, "task is no longer active; left as it is");
                    return;
                }
                Err(err) => err,
            };
            if attempt == 1 {
                self.active.stop_extending(message);
            }
            if self.abort.is_cancelled() {
                tracing::error!(%id, %task_type, error = %err, "could not update the task in Valkey before shutdown; the recoverer will retry it");
                return;
            }
            tracing::warn!(%id, %task_type, error = %err, attempt, retry_in = ?backoff, "could not update the task in Valkey; will retry");
            let pause = backoff.min(lease_until.saturating_duration_since(Instant::now()));
            tokio::select! {
                () = sleep(pause) => {}
                // One last try before shutdown completes.
                () = self.abort.cancelled() => {}
            }
            backoff = (backoff * 2).min(MAX_SETTLE_BACKOFF);
        }
    }

    /// A failed run of `message`: retried after its backoff, or archived
    /// once its retries are spent or `skip_retry`.
    async fn failed(
        &self,
        message: &Arc<TaskMessage>,
        error: String,
        skip_retry: bool,
    ) -> Settlement {
        if skip_retry || message.retried >= message.retry {
            return self.archive_or_retry(message, error).await;
        }
        let delay = self.retry_delay(message);
        let (id, task_type) = (&message.id, &message.r#type);
        tracing::warn!(%id, %task_type, %error, retry_in = ?delay, "task failed");
        Settlement::Retry {
            retry_at: later_by(delay),
            error,
        }
    }

    /// The archive of `message` failed with `error`, once the hook before
    /// an archive let it; else a retry a minute later, saying why.
    pub(super) async fn archive_or_retry(
        &self,
        message: &Arc<TaskMessage>,
        error: String,
    ) -> Settlement {
        let (id, task_type) = (&message.id, &message.r#type);
        let refused = match &self.before_archive {
            Some(hook) => hook(Arc::clone(message), error.clone()).await.err(),
            None => None,
        };
        match refused {
            None => {
                tracing::warn!(%id, %task_type, %error, "task failed; retries spent, archived");
                Settlement::Archive { error }
            }
            Some(why) => {
                tracing::error!(%id, %task_type, %error, reason = %why, retry_in = ?UNARCHIVED_RETRY, "task failed for good, but not archived: its failure could not be recorded");
                Settlement::Retry {
                    retry_at: Utc::now() + UNARCHIVED_RETRY,
                    error: format!("{error} (not archived: {why})"),
                }
            }
        }
    }

    /// One try of the write of `settlement`. `Ok(false)`: the task was no
    /// longer active (Go's `NOT FOUND`), and was left as it is.
    async fn write(
        &self,
        message: &Arc<TaskMessage>,
        settlement: &Settlement,
    ) -> Result<bool, QueueError> {
        let written = match settlement {
            Settlement::Complete => return self.completions.complete(message).await,
            Settlement::Retry { retry_at, error } => {
                self.client.retry(message, *retry_at, error, None).await
            }
            Settlement::Archive { error } => self.client.archive(message, error, None).await,
            Settlement::Defer { until, snooze } => {
                match self.client.defer(message, *until, *snooze).await {
                    // Woken meanwhile: back in pending already.
                    Ok(true) => Ok(()),
                    Ok(false) => {
                        let due = due_score(*until);
                        let wakeup = Wakeup {
                            queue: message.queue.clone(),
                            id: message.id.clone(),
                            due,
                        };
                        self.wakeups.add(instant_at(*until), wakeup);
                        Ok(())
                    }
                    Err(err) => Err(err),
                }
            }
            Settlement::Requeue => self.client.requeue(message).await,
            Settlement::Delete => self.client.delete_active(message).await,
        };
        match written {
            Ok(()) => Ok(true),
            Err(err) if is_not_found(&err) => Ok(false),
            Err(err) => Err(err),
        }
    }
}

/// Now and `delay`: a retry's time. A delay past the last time there is (a
/// listener's backoff may say anything) waits until then.
pub(super) fn later_by(delay: Duration) -> DateTime<Utc> {
    TimeDelta::from_std(delay)
        .ok()
        .and_then(|delay| Utc::now().checked_add_signed(delay))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}
