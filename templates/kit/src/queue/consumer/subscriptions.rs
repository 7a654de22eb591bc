//! The consumer's pub/sub subscriptions, each renewed after a lost
//! connection: `asynq:cancel` cancels a task it holds, and (with
//! `wake_on_published`) the enqueue channel wakes this process's idle
//! consumers (see [`crate::queue::wakeup`]).

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

use super::RunningConsumer;
use crate::queue::{keys, wakeup};

/// How long to wait before subscribing to `asynq:cancel` again.
const RESUBSCRIBE_DELAY: Duration = Duration::from_secs(5);

impl RunningConsumer {
    /// Cancels the running tasks whose ids are published on `asynq:cancel`,
    /// until `stop`.
    pub(super) async fn listen_for_cancellations(self: Arc<Self>, stop: CancellationToken) {
        let consumer = Arc::clone(&self);
        self.listen(
            keys::CANCEL_CHANNEL,
            "task cancellations",
            stop,
            move |id| consumer.active.cancel(&id),
        )
        .await;
    }

    /// Wakes this process's idle consumers when another process publishes
    /// an enqueue (see [`crate::queue::wakeup`]), until `stop`.
    pub(super) async fn listen_for_enqueues(self: Arc<Self>, stop: CancellationToken) {
        let enqueued = self.client.enqueued().clone();
        self.listen(wakeup::CHANNEL, "enqueue wake-ups", stop, move |_queues| {
            enqueued.signal()
        })
        .await;
    }

    /// Calls `on_message` with each message published on `channel` until
    /// `stop`; subscribes again after a lost connection. `what` names the
    /// messages in logs.
    async fn listen(
        &self,
        channel: &str,
        what: &str,
        stop: CancellationToken,
        on_message: impl Fn(String),
    ) {
        loop {
            let subscribed = tokio::select! {
                () = stop.cancelled() => return,
                subscribed = tokio::time::timeout(
                    RESUBSCRIBE_DELAY,
                    self.client.subscribe(channel),
                ) => subscribed,
            };
            match subscribed {
                Ok(Ok(subscription)) => {
                    let mut messages = subscription.into_on_message();
                    loop {
                        let message = tokio::select! {
                            () = stop.cancelled() => return,
                            message = messages.next() => message,
                        };
                        let Some(message) = message else { break };
                        match message.get_payload::<String>() {
                            Ok(payload) => on_message(payload),
                            Err(err) => {
                                tracing::warn!(error = %err, "unreadable message on {channel}")
                            }
                        }
                    }
                    tracing::warn!("the subscription to {what} was lost; subscribing again");
                }
                Ok(Err(err)) => {
                    tracing::warn!(error = %err, "cannot subscribe to {what}");
                }
                Err(_) => tracing::warn!("subscribing to {what} timed out"),
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = sleep(RESUBSCRIBE_DELAY) => {}
            }
        }
    }
}
