//! The worker's metrics, in the Prometheus text format on
//! `WORKER_METRICS_ADDR` (`GET /metrics`):
//!
//! - under `outbox_`: the relay's counters of published events, duplicates
//!   and errors, its round durations, gauges of the outbox backlog and of
//!   the relay's last round, each listener's counts of successful,
//!   failed and snoozed runs and its run durations, and the scheduler's
//!   ticks and leadership;
//! - under `asynq_`: the queues' sizes, latency and totals under Go asynq's
//!   names (its `x/metrics` collector, `worker::queue_metrics`), so
//!   that dashboards made for asynq read them unchanged.
//!
//! `docs/metrics.md` lists every metric.

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
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::limits::LimitMetrics;
use super::queue_metrics::QueueMetrics;
use crate::outbox::Store;
pub(crate) use crate::outbox::relay::RelayMetrics;
use crate::queue::Client;
pub(crate) use crate::scheduler::SchedulerMetrics;

/// How often the backlog and queue gauges are refreshed.
pub(crate) const BACKLOG_INTERVAL: Duration = Duration::from_secs(5);

/// The labels of a listener's counters: `event="orderPlaced",listener="audit"`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ListenerLabels {
    /// The event's wire name.
    pub(crate) event: String,
    /// The listener's name.
    pub(crate) listener: String,
}

/// The labels of a listener's run durations:
/// `event="orderPlaced",listener="audit",outcome="succeeded"`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ListenerRunLabels {
    /// The event's wire name.
    pub(crate) event: String,
    /// The listener's name.
    pub(crate) listener: String,
    /// `succeeded` or `failed`.
    pub(crate) outcome: String,
}

type Durations<L> = Family<L, Histogram, fn() -> Histogram>;

/// Buckets from 1 ms to about 33 s, for run and request durations.
pub(crate) fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// Runs of each listener, by outcome, and how long they took. Cloning
/// shares them.
#[derive(Debug, Clone)]
pub(crate) struct ListenerMetrics {
    /// Runs that returned `Ok`.
    pub(crate) succeeded: Family<ListenerLabels, Counter>,
    /// Runs that failed (each retry counts once).
    pub(crate) failed: Family<ListenerLabels, Counter>,
    /// How long each run took, in seconds, by outcome.
    pub(crate) durations: Durations<ListenerRunLabels>,
    /// Deliveries whose `ctx.once` work was skipped: the inbox had the
    /// event already.
    pub(crate) inbox_duplicates: Family<ListenerLabels, Counter>,
    /// Runs that snoozed (no failure; not counted in `failed`).
    pub(crate) snoozes: Family<ListenerLabels, Counter>,
}

impl Default for ListenerMetrics {
    fn default() -> Self {
        Self {
            succeeded: Family::default(),
            failed: Family::default(),
            durations: Family::new_with_constructor(duration_histogram),
            inbox_duplicates: Family::default(),
            snoozes: Family::default(),
        }
    }
}

impl ListenerMetrics {
    /// Exports both counts of `listener` of `event` at 0 until it runs, so
    /// that a rate over them exists from the start.
    pub(crate) fn register(&self, event: &str, listener: &str) {
        let labels = ListenerLabels {
            event: event.to_string(),
            listener: listener.to_string(),
        };
        drop(self.succeeded.get_or_create(&labels));
        drop(self.failed.get_or_create(&labels));
        drop(self.inbox_duplicates.get_or_create(&labels));
        drop(self.snoozes.get_or_create(&labels));
    }

    /// Counts one run of `listener` of `event` that snoozed.
    pub(crate) fn record_snooze(&self, event: &str, listener: &str) {
        self.snoozes
            .get_or_create(&ListenerLabels {
                event: event.to_string(),
                listener: listener.to_string(),
            })
            .inc();
    }

    /// The counter of `listener`'s deliveries that its inbox skipped.
    pub(crate) fn inbox_duplicates_of(&self, event: &str, listener: &str) -> Counter {
        self.inbox_duplicates
            .get_or_create(&ListenerLabels {
                event: event.to_string(),
                listener: listener.to_string(),
            })
            .clone()
    }

    /// Counts one run of `listener` of `event` that took `took`.
    pub(crate) fn record(&self, event: &str, listener: &str, succeeded: bool, took: Duration) {
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
        let outcome = if succeeded { "succeeded" } else { "failed" };
        self.durations
            .get_or_create(&ListenerRunLabels {
                event: labels.event,
                listener: labels.listener,
                outcome: outcome.to_string(),
            })
            .observe(took.as_secs_f64());
    }
}

/// Every metric of the worker, registered for export.
#[derive(Debug, Clone)]
pub(crate) struct Metrics {
    /// The relay's instruments.
    pub(crate) relay: RelayMetrics,
    /// The listeners' run counters.
    pub(crate) listeners: ListenerMetrics,
    /// The scheduler's instruments.
    pub(crate) scheduler: SchedulerMetrics,
    /// The queues' state, as Go asynq exports it.
    pub(crate) queues: QueueMetrics,
    /// What ordered listeners hold back.
    pub(crate) ordering: OrderingMetrics,
    /// Runs that waited for a listener's limits.
    pub(crate) limits: LimitMetrics,
    registry: Arc<Registry>,
}

/// What ordered listeners hold back (`worker::ordering`), read with the
/// backlog.
#[derive(Debug, Clone, Default)]
pub(crate) struct OrderingMetrics {
    /// Keys whose first run failed for good.
    pub(crate) blocked_keys: Gauge,
    /// Runs waiting for an earlier run of their key.
    pub(crate) waiting_runs: Gauge,
    /// Event tasks waiting for the fan-out of an earlier event of their key.
    pub(crate) waiting_events: Gauge,
}

impl Metrics {
    /// New instruments, registered for export under the `outbox` and
    /// `asynq` prefixes.
    pub(crate) fn new() -> Self {
        let relay = RelayMetrics::default();
        let listeners = ListenerMetrics::default();
        let scheduler = SchedulerMetrics::default();
        let queues = QueueMetrics::default();
        let ordering = OrderingMetrics::default();
        let limits = LimitMetrics::default();
        let mut root = Registry::default();
        root.sub_registry_with_prefix("asynq")
            .register_collector(Box::new(queues.clone()));
        let registry = root.sub_registry_with_prefix("outbox");
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
            "listener_snoozes",
            "Listener runs that snoozed (not failures), by event and listener",
            listeners.snoozes.clone(),
        );
        registry.register(
            "inbox_duplicates",
            "Deliveries whose once-per-event work the inbox skipped, by event and listener",
            listeners.inbox_duplicates.clone(),
        );
        registry.register(
            "listener_duration_seconds",
            "How long listener runs took, by event, listener and outcome",
            listeners.durations.clone(),
        );
        registry.register(
            "relay_last_round_timestamp_seconds",
            "When the last relay round finished, in Unix seconds",
            relay.last_round_unix.clone(),
        );
        registry.register(
            "relay_round_duration_seconds",
            "How long relay rounds took (claim, enqueue, commit)",
            relay.round_duration.clone(),
        );
        registry.register(
            "scheduler_ticks_enqueued",
            "Schedule ticks this replica enqueued as new, by schedule",
            scheduler.ticks.clone(),
        );
        registry.register(
            "scheduler_leader",
            "1 while this replica leads the scheduler, else 0",
            scheduler.leader.clone(),
        );
        registry.register(
            "ordered_blocked_keys",
            "Keys of ordered listeners held by a run that failed for good (outbox retry-archived or outbox skip releases them)",
            ordering.blocked_keys.clone(),
        );
        registry.register(
            "ordered_waiting_runs",
            "Runs of ordered listeners waiting for an earlier run of their key",
            ordering.waiting_runs.clone(),
        );
        registry.register(
            "ordered_waiting_events",
            "Keyed events waiting for the fan-out of an earlier event of their key",
            ordering.waiting_events.clone(),
        );
        limits.register(registry);
        Self {
            relay,
            listeners,
            scheduler,
            queues,
            ordering,
            limits,
            registry: Arc::new(root),
        }
    }

    /// The metrics in the Prometheus text format.
    pub(crate) fn render(&self) -> String {
        let mut text = String::new();
        encode(&mut text, &self.registry).expect("writing to a String cannot fail");
        text
    }

    /// `GET /metrics`.
    pub(crate) fn router(self) -> Router {
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

/// Refreshes the backlog gauges, and the state of `queues`, every
/// [`BACKLOG_INTERVAL`] until `shutdown`.
pub(crate) async fn watch_backlog(
    pool: PgPool,
    queue: Client,
    ordering_chains: super::ordering::Ordering,
    queues: Vec<String>,
    metrics: Metrics,
    shutdown: CancellationToken,
) {
    let (relay, gauges, ordering) = (metrics.relay, metrics.queues, metrics.ordering);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = gauges.refresh(&queue, &queues) => {}
        }
        let backlog = tokio::select! {
            () = shutdown.cancelled() => break,
            backlog = Store.backlog(&pool) => backlog,
        };
        match backlog {
            Ok(backlog) => {
                relay.backlog.set(backlog.events);
                relay
                    .oldest_unpublished_age
                    .set(backlog.oldest_age.map_or(0.0, |age| age.as_secs_f64()));
            }
            Err(err) => tracing::debug!(error = %err, "cannot read the outbox backlog"),
        }
        let held = tokio::select! {
            () = shutdown.cancelled() => break,
            held = ordering_chains.held() => held,
        };
        match held {
            Ok(held) => {
                ordering.blocked_keys.set(held.blocked_keys);
                ordering.waiting_runs.set(held.waiting_runs);
                ordering.waiting_events.set(held.waiting_events);
            }
            Err(err) => tracing::debug!(error = %err, "cannot read what ordered listeners hold"),
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(BACKLOG_INTERVAL) => {}
        }
    }
}
