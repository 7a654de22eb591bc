//! Wake-ups for idle consumers, so that a task runs milliseconds after it
//! is enqueued instead of at the consumer's next poll.
//!
//! A consumer with nothing to do sleeps up to its poll interval. Every
//! [`Client`](super::Client) of the process shares one [`Enqueued`] signal:
//! a task enqueued through it (the relay's event tasks, the fan-out's
//! listener tasks) wakes the consumers of the same process at once. With
//! [`Enqueued::publish`] on (`OUTBOX_WAKE=valkey`), an enqueue also
//! publishes the queues' names on [`CHANNEL`], in the same round trip, and
//! consumers that subscribe to it wake as well, in any process. Polling
//! stays the fallback (Go asynq's processes neither publish nor listen),
//! and a busy consumer never waits for a wake-up.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;
use tokio::sync::futures::Notified;

/// The pub/sub channel an enqueue publishes its queues' names on.
pub(crate) const CHANNEL: &str = "outbox:enqueued";

/// "A task was enqueued": shared by every clone of a [`Client`](super::Client).
#[derive(Debug, Clone, Default)]
pub(crate) struct Enqueued {
    notify: Arc<Notify>,
    publish: Arc<AtomicBool>,
}

impl Enqueued {
    /// Wakes every consumer waiting in this process.
    pub(crate) fn signal(&self) {
        self.notify.notify_waiters();
    }

    /// A future that completes at the next [`signal`](Self::signal) after
    /// it is created. Enable it before looking for work, so that a signal
    /// between the look and the wait is not missed.
    pub(crate) fn next(&self) -> Notified<'_> {
        self.notify.notified()
    }

    /// Also publish each enqueue on [`CHANNEL`], for other processes.
    pub(crate) fn set_publish(&self, publish: bool) {
        self.publish.store(publish, Ordering::Relaxed);
    }

    /// Whether enqueues are published on [`CHANNEL`].
    pub(crate) fn publish(&self) -> bool {
        self.publish.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_signal_after_the_future_is_enabled_is_not_missed() {
        let enqueued = Enqueued::default();
        let mut next = pin!(enqueued.next());
        next.as_mut().enable();
        enqueued.clone().signal();
        tokio::time::timeout(Duration::from_secs(1), next)
            .await
            .expect("woken");
    }
}
