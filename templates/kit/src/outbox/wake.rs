//! Wake-ups: a commit that may have stored events wakes the relays at once,
//! instead of leaving the events to the next poll.
//!
//! - In one process, `Wake::signal` wakes the relay running there.
//! - Across processes (`OUTBOX_WAKE=valkey`), a commit also publishes on the
//!   Valkey channel `CHANNEL`, and every worker's relay, subscribed to it
//!   (`forward_published`), wakes.
//!
//! Wake-ups are coalesced: a burst of commits gives one pending wake-up per
//! relay and at most one publish in flight per process. A lost wake-up (a
//! Valkey outage, a dropped subscription) delays an event by one poll
//! interval at most, since the relay keeps polling. Postgres `NOTIFY` would
//! also work, but it takes a global lock at every commit that sends one,
//! which serialises commits; a publish after commit costs the committing
//! transaction nothing.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::relay::Backoff;
use crate::config::{Config, WakeMode};
use crate::database::Transactor;
use crate::queue::{Client, Connection, QueueError, Target};

/// The Valkey channel wake-ups are published on.
pub(crate) const CHANNEL: &str = "outbox:wake";

/// Signals relays that committed events may be waiting.
#[derive(Debug, Clone, Default)]
pub(crate) struct Wake {
    local: Option<Arc<Notify>>,
    publish: Option<Arc<Notify>>,
}

impl Wake {
    /// Wakes the relay that waits on `relay` (its `Relay::waker()`), in
    /// this process.
    pub(crate) fn local(relay: Arc<Notify>) -> Self {
        Self {
            local: Some(relay),
            publish: None,
        }
    }

    /// Publishes wake-ups on `CHANNEL` through `client`, for the relays of
    /// other processes. Spawns the task that publishes, so it must be called
    /// inside a Tokio runtime.
    pub(crate) fn publishing(client: Client) -> Self {
        let connection = client.connection();
        Self::publisher(connection.target().clone(), Some(connection))
    }

    /// Also wakes the relay that waits on `relay`, in this process.
    pub(crate) fn and_local(mut self, relay: Arc<Notify>) -> Self {
        self.local = Some(relay);
        self
    }

    /// Publishes wake-ups on `CHANNEL` to the Valkey `target` names,
    /// connecting at the first wake-up and again after a failed attempt,
    /// so that a process starts, and runs, while Valkey is down: wake-ups
    /// until it answers are lost, and relays find those events at their
    /// next poll. Spawns the task that publishes, so it must be called
    /// inside a Tokio runtime.
    pub(crate) fn connecting(target: Target) -> Self {
        Self::publisher(target, None)
    }

    /// Spawns the task that publishes one wake-up per pending signal on
    /// `connection`, connecting to `target` first while it has none.
    fn publisher(target: Target, mut connection: Option<Connection>) -> Self {
        let trigger = Arc::new(Notify::new());
        let pending = Arc::clone(&trigger);
        tokio::spawn(async move {
            loop {
                pending.notified().await;
                if connection.is_none() {
                    match target.connect().await {
                        Ok(connected) => connection = Some(connected),
                        Err(err) => {
                            tracing::debug!(
                                error = %err,
                                "outbox wake-up not published: Valkey unreachable; relays will poll"
                            );
                            continue;
                        }
                    }
                }
                if let Some(connection) = connection.as_mut() {
                    let published = redis::cmd("PUBLISH")
                        .arg(CHANNEL)
                        .arg("")
                        .query_async::<i64>(connection)
                        .await;
                    if let Err(err) = published {
                        tracing::debug!(error = %err, "outbox wake-up not published; relays will poll");
                    }
                }
            }
        });
        Self {
            local: None,
            publish: Some(trigger),
        }
    }

    /// Wakes the relays. Never blocks and never fails.
    pub(crate) fn signal(&self) {
        for notify in [&self.local, &self.publish].into_iter().flatten() {
            notify.notify_one();
        }
    }
}

/// The transactor for a process that dispatches events (`kit::transactor`):
/// with `OUTBOX_WAKE=valkey`, every commit that stored events also wakes
/// the workers' relays. It does not connect to Valkey (the first wake-up
/// does, see `Wake::connecting`): a server starts while Valkey is down. The
/// error is a Valkey setting that does not parse.
///
/// ```no_run
/// # fn example(config: &kit::config::Config) -> anyhow::Result<kit::Transactor> {
/// let pool = kit::database::connect_lazy(&config.database);
/// let transactor = kit::transactor(pool, config)?;
/// # Ok(transactor) }
/// ```
pub fn transactor(pool: PgPool, config: &Config) -> Result<Transactor, QueueError> {
    let transactor = Transactor::new(pool);
    Ok(match config.outbox.wake {
        WakeMode::Off => transactor,
        WakeMode::Valkey => {
            let wake = Wake::connecting(Target::from_config(&config.valkey)?);
            transactor.after_events(move || wake.signal())
        }
    })
}

/// Wakes `relay` whenever a wake-up is published on `CHANNEL`, until
/// `shutdown`. A lost subscription is renewed with backoff, and followed by
/// one wake-up in case something was published meanwhile.
pub(crate) async fn forward_published(
    client: Client,
    relay: Arc<Notify>,
    shutdown: CancellationToken,
) {
    let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
    while !shutdown.is_cancelled() {
        let subscribed = tokio::select! {
            () = shutdown.cancelled() => return,
            subscribed = client.subscribe(CHANNEL) => subscribed,
        };
        let wait = match subscribed {
            Ok(subscription) => {
                backoff.reset();
                let mut messages = subscription.into_on_message();
                loop {
                    tokio::select! {
                        () = shutdown.cancelled() => return,
                        message = messages.next() => match message {
                            Some(_) => relay.notify_one(),
                            None => break,
                        },
                    }
                }
                relay.notify_one();
                backoff.next_delay()
            }
            Err(err) => {
                let wait = backoff.next_delay();
                tracing::warn!(error = %err, retry_in = ?wait, "cannot subscribe to outbox wake-ups; relying on polling");
                wait
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
    }
}
