//! The limits' metrics: how many runs waited, by which limit, and for how
//! long before they started.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::settings::Limits;

/// Which limit made a run wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum LimitKind {
    /// No concurrency slot was free.
    Concurrency,
    /// The rate allowed no run yet.
    Rate,
}

impl LimitKind {
    /// `concurrency` or `rate`, its metrics label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Concurrency => "concurrency",
            Self::Rate => "rate",
        }
    }
}

/// The labels of the limits' metrics:
/// `event="orderPlaced",listener="email",limit="rate"`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct LimitLabels {
    /// The event's wire name.
    pub event: String,
    /// The listener's name.
    pub listener: String,
    /// `concurrency` or `rate`.
    pub limit: String,
}

/// Runs deferred by a limit, and how long runs waited for one. Cloning
/// shares them.
#[derive(Debug, Clone)]
pub(crate) struct LimitMetrics {
    /// Runs deferred because a limit was reached (a run deferred twice
    /// counts twice).
    pub deferred: Family<LimitLabels, Counter>,
    /// How long runs that had to wait waited, from their first deferral
    /// to their start, in seconds (Valkey's clock).
    pub waited: Family<LimitLabels, Histogram, fn() -> Histogram>,
}

/// Buckets from 10 ms to about 5.5 min.
fn wait_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 16))
}

impl Default for LimitMetrics {
    fn default() -> Self {
        Self {
            deferred: Family::default(),
            waited: Family::new_with_constructor(wait_histogram),
        }
    }
}

impl LimitMetrics {
    /// Exports the series of `listener` of `event` for each limit it has,
    /// at 0, before its first wait.
    pub(crate) fn register_listener(&self, event: &str, listener: &str, limits: Limits) {
        let kinds = [
            limits.concurrency.map(|_| LimitKind::Concurrency),
            limits.rate.map(|_| LimitKind::Rate),
        ];
        for kind in kinds.into_iter().flatten() {
            let labels = LimitLabels {
                event: event.to_string(),
                listener: listener.to_string(),
                limit: kind.as_str().to_string(),
            };
            drop(self.deferred.get_or_create(&labels));
            drop(self.waited.get_or_create(&labels));
        }
    }

    /// Registers both families in `registry` (the worker's `outbox_`
    /// prefix: `outbox_listener_limit_deferred_total` and
    /// `outbox_listener_limit_wait_seconds`).
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "listener_limit_deferred",
            "Listener runs deferred because a limit was reached, by event, listener and limit",
            self.deferred.clone(),
        );
        registry.register(
            "listener_limit_wait_seconds",
            "How long listener runs waited for a limit before they started, by event, listener and limit",
            self.waited.clone(),
        );
    }
}
