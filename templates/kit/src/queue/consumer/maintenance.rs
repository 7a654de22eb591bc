//! Queue maintenance, as Go asynq's forwarder, recoverer and janitor do
//! it, each at its own interval: due retries and scheduled tasks forwarded
//! to pending, tasks whose lease expired retried or archived, completed
//! tasks past their retention deleted. And, ahead of the forwarder, the
//! tasks this consumer deferred ([`super::wakeups`]) moved back to pending
//! the moment they are due.

use std::sync::Arc;

use chrono::{TimeDelta, Utc};
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use super::RunningConsumer;
use super::settle::Settlement;
use crate::queue::QueueError;
use crate::queue::broker::{is_leased, is_not_found};

/// Recovery waits this long past a lease's expiry, to allow for clock skew
/// between workers (Go asynq's value).
const LEASE_GRACE: TimeDelta = TimeDelta::seconds(30);
/// The error recorded on a task whose worker stopped extending its lease.
const LEASE_EXPIRED: &str = "asynq: task lease expired";
/// The most deferred tasks one promote moves back to pending.
const MAX_WAKE_BATCH: usize = 100;

impl RunningConsumer {
    /// Forwards due tasks, recovers expired leases and deletes expired
    /// completed tasks, each at its own interval, until `stop`.
    pub(super) async fn maintain(self: Arc<Self>, stop: CancellationToken) {
        let options = &self.options;
        let start = Instant::now();
        let (mut forward, mut recover, mut cleanup) = (start, start, start);
        loop {
            let now = Instant::now();
            for queue in options.queues.names() {
                if now >= forward {
                    log_failure(queue, "forward", self.client.forward_due(queue).await);
                }
                if now >= recover {
                    log_failure(queue, "recover", self.recover(queue).await);
                }
                if now >= cleanup {
                    let result = self.client.delete_expired_completed(queue).await;
                    log_failure(queue, "cleanup", result);
                }
            }
            for (next, interval) in [
                (&mut forward, options.forward_interval),
                (&mut recover, options.recover_interval),
                (&mut cleanup, options.cleanup_interval),
            ] {
                if now >= *next {
                    *next = now + interval;
                }
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = sleep_until(forward.min(recover).min(cleanup)) => {}
            }
        }
    }

    /// Go asynq's recoverer: a task whose lease expired (its worker died)
    /// is retried, or archived if its retries are spent. A task that cannot
    /// be moved is logged and skipped, as in Go; the next round tries again.
    async fn recover(&self, queue: &str) -> Result<(), QueueError> {
        let cutoff = Utc::now() - LEASE_GRACE;
        for message in self.client.lease_expired(queue, cutoff).await? {
            let message = Arc::new(message);
            let (id, task_type) = (&message.id, &message.r#type);
            tracing::warn!(%id, %task_type, "recovering a task whose lease expired");
            // Only if the lease is still the expired one read above: a
            // task another worker took since is its own.
            let result = if message.retried >= message.retry {
                // An archive, or the retry that replaces it.
                match self.archive_or_retry(&message, LEASE_EXPIRED.into()).await {
                    Settlement::Retry { retry_at, error } => {
                        self.client
                            .retry(&message, retry_at, &error, Some(cutoff))
                            .await
                    }
                    _ => {
                        self.client
                            .archive(&message, LEASE_EXPIRED, Some(cutoff))
                            .await
                    }
                }
            } else {
                let retry_at = super::settle::later_by(self.retry_delay(&message));
                self.client
                    .retry(&message, retry_at, LEASE_EXPIRED, Some(cutoff))
                    .await
            };
            match result {
                Ok(()) => {}
                Err(err) if is_leased(&err) || is_not_found(&err) => {
                    tracing::info!(%id, %task_type, "the task was taken by another worker meanwhile; left to it");
                }
                Err(err) => {
                    tracing::warn!(%id, %task_type, error = %err, "could not recover the task; skipped")
                }
            }
        }
        Ok(())
    }

    /// Moves the tasks this consumer deferred back to pending as they come
    /// due (ahead of the forwarder, which works on whole seconds every
    /// `forward_interval`), until `stop`. A task no longer in `:scheduled`
    /// (woken by a limit, run by asynqmon, deleted) is left as it is. A
    /// failed move is logged: the forwarder moves the task anyway.
    pub(super) async fn wake_deferred(self: Arc<Self>, stop: CancellationToken) {
        loop {
            for (queue, tasks) in self.wakeups.take_due(Instant::now()) {
                for chunk in tasks.chunks(MAX_WAKE_BATCH) {
                    if let Err(err) = self.client.wake_due(&queue, chunk).await {
                        tracing::warn!(%queue, tasks = chunk.len(), error = %err, "could not wake deferred tasks; the forwarder will");
                    }
                }
            }
            let next = self.wakeups.next();
            tokio::select! {
                () = stop.cancelled() => return,
                () = self.wakeups.changed() => {}
                () = async {
                    match next {
                        Some(at) => sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => {}
            }
        }
    }
}

fn log_failure(queue: &str, job: &str, result: Result<(), QueueError>) {
    if let Err(err) = result {
        tracing::warn!(%queue, job, error = %err, "queue maintenance failed");
    }
}
