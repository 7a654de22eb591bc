//! [`Capacity`]: the takes and slots that bound how many tasks a consumer
//! holds and runs.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// How many tasks a consumer holds and runs: a task holds a *take* from
/// its dequeue until its handler returns, and a *slot* from its start until
/// its final write, `concurrency` of each. So the consumer runs at most
/// `concurrency` tasks, and takes a task ahead only for a slot whose
/// handler has returned and whose completion is on its way.
#[derive(Clone)]
pub(super) struct Capacity {
    takes: Arc<Semaphore>,
    slots: Arc<Semaphore>,
    /// Cancelled at shutdown: tasks taken ahead stop waiting for a slot.
    stopping: CancellationToken,
}

impl Capacity {
    pub(super) fn new(concurrency: usize) -> Self {
        Self {
            takes: Arc::new(Semaphore::new(concurrency)),
            slots: Arc::new(Semaphore::new(concurrency)),
            stopping: CancellationToken::new(),
        }
    }

    /// Waits for a free take.
    pub(super) async fn take(&self) -> OwnedSemaphorePermit {
        Arc::clone(&self.takes)
            .acquire_owned()
            .await
            .expect("never closed")
    }

    /// A free take, if there is one now.
    pub(super) fn try_take(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.takes).try_acquire_owned().ok()
    }

    /// Waits for a free slot; `None` once the consumer is stopping.
    pub(super) async fn slot(&self) -> Option<OwnedSemaphorePermit> {
        if let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() {
            return Some(slot);
        }
        tokio::select! {
            biased;
            () = self.stopping.cancelled() => None,
            slot = Arc::clone(&self.slots).acquire_owned() => Some(slot.expect("never closed")),
        }
    }

    /// Tasks waiting for a slot give up: they go back to pending.
    pub(super) fn stop(&self) {
        self.stopping.cancel();
    }
}
