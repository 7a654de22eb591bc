//! The consumer's loop, from start to shutdown: it waits for a free take,
//! dequeues as many tasks as there are free takes, runs each in a task of
//! its own (execute, then settle), sleeps while the queues are empty, and
//! at shutdown drains the running tasks and stops the background loops.

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::sync::OwnedSemaphorePermit;
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;

use super::active::ActiveTasks;
use super::capacity::Capacity;
use super::execute::{Outcome, deadline};
use super::heartbeat::server_info;
use super::wakeups::Wakeups;
use super::{Consumer, RunningConsumer};
use crate::queue::QueueError;
use crate::queue::broker::Dequeued;
use crate::queue::completions::Completions;

/// How long a Valkey call in progress at shutdown (a dequeue, the server
/// state's removal) may go on before it is dropped.
const STOP_GRACE: Duration = Duration::from_millis(500);
/// The most tasks one dequeue takes (as many as there are free takes, up
/// to this).
const MAX_DEQUEUE_BATCH: usize = 32;

impl Consumer {
    /// Processes tasks until `shutdown` completes, then stops as described
    /// in the module docs and returns. Valkey errors while running are
    /// logged and retried; only invalid options are an error.
    pub(crate) async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), QueueError> {
        let options = &self.options;
        if options.concurrency == 0 {
            return Err(QueueError::Options("concurrency must be at least 1".into()));
        }
        if options.heartbeat_interval >= options.lease_duration {
            return Err(QueueError::Options(
                "the heartbeat interval must be shorter than the lease".into(),
            ));
        }
        let consumer = Arc::new(RunningConsumer {
            server: server_info(&self.options),
            completions: Completions::start(self.client.clone()),
            client: self.client,
            handlers: self.handlers,
            before_archive: self.before_archive,
            retry_delays: self.retry_delays,
            on_cancel: self.on_cancel,
            options: self.options,
            active: ActiveTasks::default(),
            wakeups: Wakeups::default(),
            abort: CancellationToken::new(),
        });
        let options = &consumer.options;
        tracing::info!(
            queues = %options.queues,
            concurrency = options.concurrency,
            server_id = %consumer.server.server_id,
            "consumer started"
        );

        let maintenance = CancellationToken::new();
        let heartbeat = CancellationToken::new();
        let mut background = JoinSet::new();
        background.spawn(consumer.clone().heartbeat(heartbeat.clone()));
        background.spawn(consumer.clone().maintain(maintenance.clone()));
        background.spawn(consumer.clone().listen_for_cancellations(heartbeat.clone()));
        // Until the last handler has returned: a task deferred during the
        // shutdown's drain still wakes on time.
        background.spawn(consumer.clone().wake_deferred(heartbeat.clone()));
        if options.wake_on_published {
            background.spawn(consumer.clone().listen_for_enqueues(heartbeat.clone()));
        }

        let mut running = JoinSet::new();
        let capacity = Capacity::new(options.concurrency);
        let mut shutdown = pin!(shutdown);
        loop {
            let take = tokio::select! {
                biased;
                () = &mut shutdown => break,
                take = capacity.take() => take,
            };
            // Every take free now, up to a batch: one dequeue uses them.
            // Tasks whose handlers are returning at this moment free theirs
            // first.
            tokio::task::yield_now().await;
            let mut takes = vec![take];
            while takes.len() < MAX_DEQUEUE_BATCH {
                match capacity.try_take() {
                    Some(take) => takes.push(take),
                    None => break,
                }
            }
            while running.try_join_next().is_some() {}
            // Listening before looking: an enqueue during the dequeue still wakes.
            let mut enqueued = pin!(consumer.client.enqueued().next());
            enqueued.as_mut().enable();
            // A dequeue stuck on a hung Valkey must not hold up shutdown; a
            // task it took meanwhile is recovered when its lease expires.
            let dequeued = tokio::select! {
                biased;
                dequeued = consumer.dequeue(takes, &capacity, &mut running) => dequeued,
                () = async {
                    (&mut shutdown).await;
                    sleep(STOP_GRACE).await;
                } => break,
            };
            let pause = match dequeued {
                Ok(true) => continue,
                Ok(false) => {
                    let pause = jittered(options.poll_interval);
                    tracing::debug!(
                        ?pause,
                        "every queue empty: idle until an enqueue or the next poll"
                    );
                    pause
                }
                Err(err) => {
                    tracing::error!(error = %err, "dequeue failed; retrying in 1s");
                    Duration::from_secs(1)
                }
            };
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                () = enqueued => {}
                () = sleep(pause) => {}
            }
        }

        tracing::info!(running = running.len(), "consumer stopping");
        capacity.stop();
        maintenance.cancel();
        let drain = async { while running.join_next().await.is_some() {} };
        if tokio::time::timeout(options.shutdown_timeout, drain)
            .await
            .is_err()
        {
            tracing::warn!(
                running = running.len(),
                "shutdown timeout reached; putting unfinished tasks back to pending"
            );
            consumer.abort.cancel();
            while running.join_next().await.is_some() {}
        }
        heartbeat.cancel();
        let background_stopped = async { while background.join_next().await.is_some() {} };
        if tokio::time::timeout(STOP_GRACE, background_stopped)
            .await
            .is_err()
        {
            tracing::warn!("Valkey did not answer at shutdown; the server state expires by itself");
            background.abort_all();
        }
        tracing::info!("consumer stopped");
        Ok(())
    }
}

impl RunningConsumer {
    /// Dequeues up to one task per take in `takes` and puts each on
    /// `running`, where it waits for a slot of `capacity`, runs, and is
    /// settled (the takes left over are freed). Returns whether there was
    /// a task.
    async fn dequeue(
        self: &Arc<Self>,
        mut takes: Vec<OwnedSemaphorePermit>,
        capacity: &Capacity,
        running: &mut JoinSet<()>,
    ) -> Result<bool, QueueError> {
        let order = self.options.queues.dequeue_order();
        let lease_until = Instant::now() + self.options.lease_duration;
        let lease_until_utc = Utc::now() + self.options.lease_duration;
        let dequeued = self
            .client
            .dequeue(&order, lease_until_utc, takes.len())
            .await?;
        let any = !dequeued.is_empty();
        for taken in dequeued {
            let message = match taken {
                Dequeued::Task(message) => Arc::new(message),
                Dequeued::Undecodable {
                    queue,
                    id,
                    encoded,
                    error,
                } => {
                    self.archive_undecodable(&queue, &id, &encoded, &error)
                        .await;
                    continue;
                }
            };
            let take = takes.pop().expect("no more tasks than takes");
            let (lease, cancel) = self.active.hold(&message, lease_until);
            let consumer = self.clone();
            let capacity = capacity.clone();
            running.spawn(async move {
                // Taken ahead: waits for the slot of a completion on its
                // way, or goes back to pending unrun at shutdown.
                let slot = capacity.slot().await;
                let outcome = match slot {
                    Some(_) => {
                        let deadline = deadline(&message, Utc::now());
                        consumer.active.run(&message, deadline);
                        consumer
                            .execute(&message, deadline, lease.clone(), cancel)
                            .await
                    }
                    None => Outcome::Interrupted,
                };
                // The handler has returned: the next task may be taken
                // while this one's completion is written.
                drop(take);
                consumer.settle(&message, outcome, lease).await;
                consumer.active.finish(&message);
                drop(slot);
            });
        }
        Ok(any)
    }

    /// Archives a dequeued task whose message does not decode: no handler
    /// can run it, and left active it would only expire and fail again.
    async fn archive_undecodable(
        &self,
        queue: &str,
        id: &[u8],
        encoded: &[u8],
        error: &prost::DecodeError,
    ) {
        let id_text = String::from_utf8_lossy(id);
        tracing::error!(
            %queue,
            id = %id_text,
            error = %error,
            "a task's message is not a valid asynq TaskMessage; archived as it is"
        );
        if let Err(err) = self.client.archive_undecodable(queue, id, encoded).await {
            tracing::error!(%queue, id = %id_text, error = %err, "could not archive the undecodable task; its lease will expire");
        }
    }
}

/// `interval` ± 50 %, so that idle workers do not poll in step.
fn jittered(interval: Duration) -> Duration {
    interval / 2 + interval.mul_f64(fastrand::f64())
}
