//! [`ConsumerOptions`]: how a consumer runs, with Go asynq's defaults.

use std::time::Duration;

use crate::queue::{QueueWeights, default_retry_delay};

/// How a [`Consumer`](super::Consumer) runs. `Default` gives Go asynq's values; the worker
/// sets `queues` and `concurrency` from `WORKER_QUEUES` and
/// `WORKER_CONCURRENCY`. Tests shorten the intervals.
#[derive(Debug, Clone)]
pub(crate) struct ConsumerOptions {
    /// The queues served, with their weights. Default `default=1`.
    pub(crate) queues: QueueWeights,
    /// Tasks run at the same time. Default: the number of CPUs.
    pub(crate) concurrency: usize,
    /// How long running handlers may take to finish at shutdown before
    /// their tasks are put back to pending. Default 8 s.
    pub(crate) shutdown_timeout: Duration,
    /// Pause between dequeues while every queue is empty (jittered ±50%).
    /// Default 1 s.
    pub(crate) poll_interval: Duration,
    /// How long a dequeued task stays leased without a heartbeat. Default 30 s.
    pub(crate) lease_duration: Duration,
    /// How often leases of running tasks are extended and the server state
    /// is written (it expires after twice this). Default 5 s.
    pub(crate) heartbeat_interval: Duration,
    /// How often due retries and scheduled tasks move to pending. Default 5 s.
    pub(crate) forward_interval: Duration,
    /// How often expired leases are looked for. Default 10 s (Go asynq's
    /// recoverer looks once a minute): a task whose worker died is retried
    /// within 70 s of its last heartbeat instead of 2 min, which matters
    /// most to an ordered listener's run, whose key waits for it.
    pub(crate) recover_interval: Duration,
    /// How often completed tasks past their retention are deleted. Default 8 s.
    pub(crate) cleanup_interval: Duration,
    /// Delay before retry n + 1, given n failures so far.
    /// Default `default_retry_delay`, Go asynq's.
    pub(crate) retry_delay: fn(u32) -> Duration,
    /// Also wake when another process publishes an enqueue on
    /// `wakeup::CHANNEL`. Default off; the worker sets it from
    /// `OUTBOX_WAKE` (`valkey` unless set).
    pub(crate) wake_on_published: bool,
}

impl Default for ConsumerOptions {
    fn default() -> Self {
        Self {
            queues: QueueWeights::default(),
            concurrency: std::thread::available_parallelism().map_or(1, |n| n.get()),
            shutdown_timeout: Duration::from_secs(8),
            poll_interval: Duration::from_secs(1),
            lease_duration: Duration::from_secs(30),
            heartbeat_interval: Duration::from_secs(5),
            forward_interval: Duration::from_secs(5),
            recover_interval: Duration::from_secs(10),
            cleanup_interval: Duration::from_secs(8),
            retry_delay: default_retry_delay,
            wake_on_published: false,
        }
    }
}
