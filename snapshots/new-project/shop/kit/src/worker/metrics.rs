//! The worker's metrics, in the Prometheus text format on
//! `WORKER_METRICS_ADDR` (`GET /metrics`): the relay's counters of published
//! events, duplicates and errors, gauges of the outbox backlog and of the
//! relay's last round, and each listener's counts of successful and failed
//! runs.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::outbox::Store;
pub use crate::outbox::relay::RelayMetrics;

/// How often the backlog gauges are refreshed.
pub(crate) const BACKLOG_INTERVAL: Duration = Duration::from_secs(5);

/// The labels of a listener's counters: `event="orderPlaced",listener="audit"`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabels {
    /// The event's wire name.
    pub event: String,
    /// The listener's name.
    pub listener: String,
}

/// Runs of each listener, by outcome. Cloning shares them.
#[derive(Debug, Clone, Default)]
pub struct ListenerMetrics {
    /// Runs that returned `Ok`.
    pub succeeded: Family<ListenerLabels, Counter>,
    /// Runs that failed (each retry counts once).
    pub failed: Family<ListenerLabels, Counter>,
}

impl ListenerMetrics {
    /// Counts one run of `listener` of `event`.
    pub fn record(&self, event: &str, listener: &str, succeeded: bool) {
        let labels = ListenerLabels {
            event: event.to_string(),
            listener: listener.to_string(),
        };
        let family = if succeeded {
            &self.succeeded
        } else {
            &self.failed
        };
        family.get_or_create(&labels).inc();
    }
}

/// Every metric of the worker, registered for export.
#[derive(Debug, Clone)]
pub struct Metrics {
    /// The relay's instruments.
    pub relay: RelayMetrics,
    /// The listeners' run counters.
    pub listeners: ListenerMetrics,
    registry: Arc<Registry>,
}

impl Metrics {
    /// New instruments, registered for export under the `outbox` prefix.
    pub fn new() -> Self {
        let relay = RelayMetrics::default();
        let listeners = ListenerMetrics::default();
        let mut registry = Registry::with_prefix("outbox");
        registry.register(
            "published",
            "Events published to the queue",
            relay.published.clone(),
        );
        registry.register(
            "duplicates",
            "Events the queue already had",
            relay.duplicates.clone(),
        );
        registry.register(
            "relay_rounds",
            "Relay rounds done, empty ones included",
            relay.rounds.clone(),
        );
        registry.register("relay_errors", "Failed relay rounds", relay.errors.clone());
        registry.register("backlog", "Unpublished events", relay.backlog.clone());
        registry.register(
            "oldest_unpublished_age_seconds",
            "Age of the oldest unpublished event",
            relay.oldest_unpublished_age.clone(),
        );
        registry.register(
            "listener_succeeded",
            "Listener runs that succeeded, by event and listener",
            listeners.succeeded.clone(),
        );
        registry.register(
            "listener_failed",
            "Listener runs that failed, by event and listener",
            listeners.failed.clone(),
        );
        registry.register(
            "relay_last_round_timestamp_seconds",
            "When the last relay round finished, in Unix seconds",
            relay.last_round_unix.clone(),
        );
        Self {
            relay,
            listeners,
            registry: Arc::new(registry),
        }
    }

    /// The metrics in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut text = String::new();
        encode(&mut text, &self.registry).expect("writing to a String cannot fail");
        text
    }

    /// `GET /metrics`.
    pub fn router(self) -> Router {
        Router::new().route(
            "/metrics",
            get(move || {
                let metrics = self.clone();
                async move {
                    (
                        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                        metrics.render(),
                    )
                        .into_response()
                }
            }),
        )
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Refreshes the backlog gauges every [`BACKLOG_INTERVAL`] until `shutdown`.
pub(crate) async fn watch_backlog(
    pool: PgPool,
    metrics: RelayMetrics,
    shutdown: CancellationToken,
) {
    loop {
        let backlog = tokio::select! {
            () = shutdown.cancelled() => break,
            backlog = Store.backlog(&pool) => backlog,
        };
        match backlog {
            Ok(backlog) => {
                metrics.backlog.set(backlog.events);
                metrics
                    .oldest_unpublished_age
                    .set(backlog.oldest_age.map_or(0.0, |age| age.as_secs_f64()));
            }
            Err(err) => tracing::debug!(error = %err, "cannot read the outbox backlog"),
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(BACKLOG_INTERVAL) => {}
        }
    }
}
