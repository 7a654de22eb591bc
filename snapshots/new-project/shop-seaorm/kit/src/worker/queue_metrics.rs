//! The queues' state as metrics under Go asynq's names and labels (its
//! `x/metrics` collector), so that a dashboard or alert made for asynq
//! reads a Rust worker's `/metrics` unchanged:
//!
//! - `asynq_tasks_enqueued_total{queue,state}` (a gauge, as in Go): tasks
//!   in each state;
//! - `asynq_queue_size{queue}`: tasks in every state;
//! - `asynq_queue_latency_seconds{queue}`: how long the oldest pending
//!   task has waited;
//! - `asynq_tasks_processed_total{queue}` and `asynq_tasks_failed_total{queue}`:
//!   the queue's totals, which every worker (Rust or Go) adds to;
//! - `asynq_queue_paused_total{queue}`: 1 while the queue is paused.
//!
//! Go's `asynq_queue_memory_usage_approx_bytes` is not exported: it samples
//! `MEMORY USAGE`, which managed servers often refuse.
//!
//! The values are read from Valkey every few seconds by the worker's
//! watcher, not at each scrape, so a scrape never waits on Valkey; a queue
//! that cannot be read keeps its last values.

use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::queue::{Client, QueueStats};

/// `queue="default"`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    queue: String,
}

/// `queue="default",state="pending"`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueStateLabels {
    queue: String,
    state: &'static str,
}

/// The latest state of each watched queue. Cloning shares it.
#[derive(Debug, Clone, Default)]
pub(crate) struct QueueMetrics {
    latest: Arc<Mutex<Vec<QueueStats>>>,
}

impl QueueMetrics {
    /// Reads the state of each of `queues`; a queue that cannot be read
    /// keeps its last state.
    pub(crate) async fn refresh(&self, client: &Client, queues: &[String]) {
        for queue in queues {
            match client.queue_stats(queue).await {
                Ok(stats) => self.set(stats),
                Err(err) => tracing::debug!(queue, error = %err, "cannot read the queue's state"),
            }
        }
    }

    fn set(&self, stats: QueueStats) {
        let mut latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
        match latest.iter_mut().find(|s| s.queue == stats.queue) {
            Some(known) => *known = stats,
            None => latest.push(stats),
        }
    }
}

impl Collector for QueueMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let latest = self
            .latest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let labels = |stats: &QueueStats| QueueLabels {
            queue: stats.queue.clone(),
        };

        let sample = ConstGauge::new(0i64);
        let mut family = encoder.encode_descriptor(
            "tasks_enqueued_total",
            "Number of tasks enqueued; broken down by queue and state.",
            None,
            sample.metric_type(),
        )?;
        for stats in &latest {
            let c = &stats.counts;
            for (state, count) in [
                ("active", c.active),
                ("pending", c.pending),
                ("scheduled", c.scheduled),
                ("retry", c.retry),
                ("archived", c.archived),
                ("completed", c.completed),
            ] {
                let labels = QueueStateLabels {
                    queue: stats.queue.clone(),
                    state,
                };
                ConstGauge::new(gauge(count)).encode(family.encode_family(&labels)?)?;
            }
        }

        let mut family = encoder.encode_descriptor(
            "queue_size",
            "Number of tasks in a queue",
            None,
            sample.metric_type(),
        )?;
        for stats in &latest {
            ConstGauge::new(gauge(stats.size())).encode(family.encode_family(&labels(stats))?)?;
        }

        let mut family = encoder.encode_descriptor(
            "queue_latency_seconds",
            "Number of seconds the oldest pending task is waiting in pending state to be processed.",
            None,
            ConstGauge::new(0.0f64).metric_type(),
        )?;
        for stats in &latest {
            ConstGauge::new(stats.latency_seconds).encode(family.encode_family(&labels(stats))?)?;
        }

        for (name, help, value) in [
            (
                "tasks_processed",
                "Number of tasks processed (both succeeded and failed); broken down by queue",
                (|s: &QueueStats| s.processed_total) as fn(&QueueStats) -> u64,
            ),
            (
                "tasks_failed",
                "Number of tasks failed; broken down by queue",
                |s: &QueueStats| s.failed_total,
            ),
        ] {
            let mut family = encoder.encode_descriptor(
                name,
                help,
                None,
                ConstCounter::new(0u64).metric_type(),
            )?;
            for stats in &latest {
                ConstCounter::new(value(stats)).encode(family.encode_family(&labels(stats))?)?;
            }
        }

        let mut family = encoder.encode_descriptor(
            "queue_paused_total",
            "Number of queues paused",
            None,
            sample.metric_type(),
        )?;
        for stats in &latest {
            ConstGauge::new(i64::from(stats.paused))
                .encode(family.encode_family(&labels(stats))?)?;
        }
        Ok(())
    }
}

/// A count as a gauge value.
fn gauge(count: u64) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::QueueCounts;
    use prometheus_client::registry::Registry;

    #[test]
    fn the_names_and_labels_are_go_asynqs() {
        let metrics = QueueMetrics::default();
        metrics.set(QueueStats {
            queue: "default".into(),
            counts: QueueCounts {
                pending: 2,
                active: 1,
                completed: 7,
                ..QueueCounts::default()
            },
            processed_total: 40,
            failed_total: 3,
            paused: true,
            latency_seconds: 1.5,
        });
        let mut registry = Registry::default();
        registry
            .sub_registry_with_prefix("asynq")
            .register_collector(Box::new(metrics));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "asynq_tasks_enqueued_total{queue=\"default\",state=\"pending\"} 2",
            "asynq_tasks_enqueued_total{queue=\"default\",state=\"completed\"} 7",
            "asynq_queue_size{queue=\"default\"} 10",
            "asynq_queue_latency_seconds{queue=\"default\"} 1.5",
            "asynq_tasks_processed_total{queue=\"default\"} 40",
            "asynq_tasks_failed_total{queue=\"default\"} 3",
            "asynq_queue_paused_total{queue=\"default\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
        }
    }
}
