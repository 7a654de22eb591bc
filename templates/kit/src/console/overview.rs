//! The overview: how the outbox is doing now and over the last minutes.
//!
//! Each load of `overview.json` (the page's script asks every two seconds)
//! takes one sample, at most one a second whoever asks: the relay's lag
//! and backlog from the unpublished rows' partial index, the newest row's
//! id (events committed since the last sample), and each queue's counts,
//! latency and processed and failed totals from Valkey. Rates are the
//! differences between samples; nothing is sampled while no one looks,
//! and the last [`KEPT`] samples (six minutes) are kept for the charts.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use maud::html;
use serde::Serialize;

use super::State as Console;
use super::page::{self, Depth, Section};

/// How many samples the charts keep: six minutes at one every two seconds.
pub(crate) const KEPT: usize = 180;

/// One look at the outbox and its queues.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Sample {
    /// Seconds since the console started.
    pub(crate) at: f64,
    /// Age of the oldest unpublished event, in seconds (0 with none).
    pub(crate) lag_seconds: f64,
    /// Unpublished events.
    pub(crate) backlog: i64,
    /// The newest row's id: events committed so far.
    pub(crate) committed_total: i64,
    /// Tasks processed and failed so far, over the service's queues.
    pub(crate) processed_total: u64,
    pub(crate) failed_total: u64,
    pub(crate) queues: Vec<QueueFigures>,
}

/// One queue in a sample.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct QueueFigures {
    pub(crate) queue: String,
    pub(crate) size: u64,
    pub(crate) pending: u64,
    pub(crate) retry: u64,
    pub(crate) archived: u64,
    pub(crate) latency_seconds: f64,
    pub(crate) paused: bool,
}

/// The samples the charts draw, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Samples {
    kept: VecDeque<Sample>,
    started: Option<Instant>,
}

impl Samples {
    /// Seconds since the first sample was asked for.
    fn now(&mut self) -> f64 {
        self.started
            .get_or_insert_with(Instant::now)
            .elapsed()
            .as_secs_f64()
    }

    /// The newest sample, when it is under a second old.
    fn fresh(&mut self) -> Option<Sample> {
        let now = self.now();
        self.kept.back().filter(|s| now - s.at < 1.0).cloned()
    }

    fn push(&mut self, sample: Sample) {
        if self.kept.len() == KEPT {
            self.kept.pop_front();
        }
        self.kept.push_back(sample);
    }
}

/// The figures now and the series over the kept samples.
#[derive(Debug, Serialize)]
pub(crate) struct Figures {
    pub(crate) now: Now,
    /// `[seconds since start, value]` pairs, oldest first, by series.
    pub(crate) series: Series,
}

#[derive(Debug, Serialize)]
pub(crate) struct Now {
    pub(crate) lag_seconds: f64,
    pub(crate) backlog: i64,
    pub(crate) committed_per_second: Option<f64>,
    pub(crate) published_per_second: Option<f64>,
    pub(crate) processed_per_second: Option<f64>,
    pub(crate) failed_per_second: Option<f64>,
    pub(crate) queues: Vec<QueueFigures>,
}

#[derive(Debug, Default, Serialize)]
pub(crate) struct Series {
    pub(crate) lag_seconds: Vec<(f64, f64)>,
    pub(crate) backlog: Vec<(f64, f64)>,
    pub(crate) published_per_second: Vec<(f64, f64)>,
    pub(crate) processed_per_second: Vec<(f64, f64)>,
    pub(crate) failed_per_second: Vec<(f64, f64)>,
}

/// The rates between two samples: committed, published, processed and
/// failed per second. Published = committed - growth of the backlog.
fn rates(before: &Sample, after: &Sample) -> Option<[f64; 4]> {
    let seconds = after.at - before.at;
    if seconds <= 0.0 {
        return None;
    }
    let committed = (after.committed_total - before.committed_total).max(0) as f64;
    let published = (committed - (after.backlog - before.backlog) as f64).max(0.0);
    let processed = after.processed_total.saturating_sub(before.processed_total) as f64;
    let failed = after.failed_total.saturating_sub(before.failed_total) as f64;
    Some([committed, published, processed, failed].map(|n| n / seconds))
}

/// The figures from the kept samples.
fn figures(samples: &VecDeque<Sample>) -> Option<Figures> {
    let last = samples.back()?;
    let mut series = Series::default();
    for sample in samples {
        series.lag_seconds.push((sample.at, sample.lag_seconds));
        series.backlog.push((sample.at, sample.backlog as f64));
    }
    for (before, after) in samples.iter().zip(samples.iter().skip(1)) {
        if let Some([_, published, processed, failed]) = rates(before, after) {
            series.published_per_second.push((after.at, published));
            series.processed_per_second.push((after.at, processed));
            series.failed_per_second.push((after.at, failed));
        }
    }
    let latest = samples
        .len()
        .checked_sub(2)
        .and_then(|i| rates(&samples[i], last));
    Some(Figures {
        now: Now {
            lag_seconds: last.lag_seconds,
            backlog: last.backlog,
            committed_per_second: latest.map(|r| r[0]),
            published_per_second: latest.map(|r| r[1]),
            processed_per_second: latest.map(|r| r[2]),
            failed_per_second: latest.map(|r| r[3]),
            queues: last.queues.clone(),
        },
        series,
    })
}

/// Takes a sample now (Postgres, then Valkey).
async fn sample(console: &Console, at: f64) -> anyhow::Result<Sample> {
    let context = &console.context;
    let (backlog, lag, committed): (i64, Option<f64>, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM outbox_events WHERE published_at IS NULL), \
                (SELECT extract(epoch FROM now() - min(created_at))::float8 \
                 FROM outbox_events WHERE published_at IS NULL), \
                (SELECT coalesce(max(id), 0) FROM outbox_events)",
    )
    .fetch_one(&context.pool)
    .await
    .map_err(|err| anyhow::anyhow!("Postgres: {err}"))?;
    let client = context
        .queue()
        .await
        .map_err(|err| anyhow::anyhow!("Valkey: {err:#}"))?;
    let mut queues = Vec::new();
    let (mut processed_total, mut failed_total) = (0, 0);
    for queue in context.all_queues() {
        let stats = client
            .queue_stats(&queue)
            .await
            .map_err(|err| anyhow::anyhow!("Valkey: {err}"))?;
        processed_total += stats.processed_total;
        failed_total += stats.failed_total;
        queues.push(QueueFigures {
            size: stats.size(),
            pending: stats.counts.pending,
            retry: stats.counts.retry,
            archived: stats.counts.archived,
            latency_seconds: stats.latency_seconds,
            paused: stats.paused,
            queue,
        });
    }
    Ok(Sample {
        at,
        lag_seconds: lag.unwrap_or(0.0).max(0.0),
        backlog,
        committed_total: committed,
        processed_total,
        failed_total,
        queues,
    })
}

/// Takes a sample unless a fresh one is kept, and returns the figures.
async fn current(console: &Console) -> anyhow::Result<Figures> {
    let at = {
        let mut samples = console.samples.lock().unwrap_or_else(|e| e.into_inner());
        if samples.fresh().is_none() {
            Some(samples.now())
        } else {
            None
        }
    };
    if let Some(at) = at {
        let taken = sample(console, at).await?;
        let mut samples = console.samples.lock().unwrap_or_else(|e| e.into_inner());
        samples.push(taken);
    }
    let samples = console.samples.lock().unwrap_or_else(|e| e.into_inner());
    figures(&samples.kept).ok_or_else(|| anyhow::anyhow!("no sample yet"))
}

/// `GET overview.json`: the figures, or what is down (503).
pub(crate) async fn figures_json(State(console): State<Arc<Console>>) -> Response {
    match current(&console).await {
        Ok(figures) => Json(figures).into_response(),
        Err(err) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({ "error": format!("{err:#}") })),
        )
            .into_response(),
    }
}

/// The live figures, each with an element the script fills.
const CARDS: [(&str, &str); 6] = [
    ("lag_seconds", "Relay lag (oldest unpublished)"),
    ("backlog", "Backlog (unpublished events)"),
    ("committed_per_second", "Events committed / s"),
    ("published_per_second", "Events published / s"),
    ("processed_per_second", "Tasks processed / s"),
    ("failed_per_second", "Tasks failed / s"),
];

/// The charts, by series.
const CHARTS: [(&str, &str); 5] = [
    ("lag_seconds", "Relay lag, seconds"),
    ("backlog", "Backlog"),
    ("published_per_second", "Published / s"),
    ("processed_per_second", "Tasks processed / s"),
    ("failed_per_second", "Tasks failed / s"),
];

/// `GET /`: the overview, which its script keeps live.
pub(crate) async fn page(
    State(console): State<Arc<Console>>,
    uri: axum::extract::OriginalUri,
) -> Response {
    // Links are relative to the root, which needs its trailing slash.
    let path = uri.path();
    if !path.ends_with('/') {
        let last = path.rsplit('/').next().unwrap_or_default();
        return axum::response::Redirect::permanent(&format!("{last}/")).into_response();
    }
    let first = current(&console).await;
    let body = html! {
        p.status role="status" data-live="status" {
            @match &first {
                Ok(_) => "Live: refreshed every two seconds.",
                Err(err) => span.error { (format!("{err:#}")) },
            }
        }
        section.cards aria-label="Now" {
            @for (key, label) in CARDS {
                div.card {
                    span.label { (label) }
                    span.value data-figure=(key) { "…" }
                }
            }
        }
        section.charts aria-label="The last minutes" {
            @for (key, label) in CHARTS {
                figure.chart {
                    figcaption { (label) }
                    svg data-series=(key) viewBox="0 0 300 80" preserveAspectRatio="none"
                        role="img" aria-label=(label) {}
                }
            }
        }
        h2 { "Queues" }
        table.queues data-live="queues" {
            thead { tr { th { "queue" } th { "size" } th { "pending" } th { "retry" } th { "archived" } th { "latency" } th { "state" } } }
            tbody {
                @if let Ok(figures) = &first {
                    @for queue in &figures.now.queues {
                        tr {
                            td { (queue.queue) } td { (queue.size) } td { (queue.pending) }
                            td { (queue.retry) } td { (queue.archived) }
                            td { (format!("{:.1} s", queue.latency_seconds)) }
                            td { @if queue.paused { "paused" } @else { "running" } }
                        }
                    }
                }
            }
        }
    };
    page::layout(Depth::Top, Section::Overview, "Overview", body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at: f64, backlog: i64, committed: i64, processed: u64) -> Sample {
        Sample {
            at,
            lag_seconds: 0.0,
            backlog,
            committed_total: committed,
            processed_total: processed,
            failed_total: 0,
            queues: Vec::new(),
        }
    }

    #[test]
    fn published_is_committed_less_what_the_backlog_grew() {
        let before = sample(10.0, 5, 100, 40);
        let after = sample(12.0, 9, 120, 80);
        let [committed, published, processed, failed] = rates(&before, &after).unwrap();
        assert_eq!(committed, 10.0);
        assert_eq!(published, 8.0);
        assert_eq!(processed, 20.0);
        assert_eq!(failed, 0.0);
    }

    #[test]
    fn the_kept_samples_are_bounded() {
        let mut samples = Samples::default();
        for i in 0..KEPT + 10 {
            samples.push(sample(i as f64, 0, i as i64, 0));
        }
        assert_eq!(samples.kept.len(), KEPT);
        let figures = figures(&samples.kept).unwrap();
        assert_eq!(figures.series.backlog.len(), KEPT);
        assert_eq!(figures.series.published_per_second.len(), KEPT - 1);
        assert_eq!(figures.now.committed_per_second, Some(1.0));
    }
}
