//! The worker's probes for orchestrators, served with the metrics on
//! `WORKER_METRICS_ADDR`:
//!
//! - `GET /healthz`: 200 while the process runs (liveness);
//! - `GET /readyz`: 200 when Postgres and Valkey each answer within two
//!   seconds and the relay is not stuck (a round finished recently), 503
//!   otherwise; the body names each check and why it failed.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use sqlx::PgPool;

use super::metrics::RelayMetrics;
use crate::config::OutboxConfig;
use crate::outbox::relay::MAX_BACKOFF;
use crate::queue::Client;

/// How long each readiness check waits for an answer.
pub(crate) const CHECK_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a relay round may take, beyond the longest wait between two
/// rounds, before the relay counts as stuck.
pub(crate) const ROUND_LIMIT: Duration = Duration::from_secs(120);

/// What `/readyz` checks. Cloning shares it.
#[derive(Clone)]
pub(crate) struct Readiness {
    pool: PgPool,
    queue: Client,
    relay: RelayMetrics,
    /// The relay is stuck when no round finished for this long.
    stuck_after: Duration,
    /// Before the first round, the relay's age counts from here.
    started: SystemTime,
}

/// One check: its name and, when it failed, why.
pub(crate) type Check = (&'static str, Result<(), String>);

impl Readiness {
    /// Checks `pool`, `queue`, and the relay that records its rounds in
    /// `relay` and waits `outbox.poll_interval` between rounds when idle.
    pub(crate) fn new(
        pool: PgPool,
        queue: Client,
        relay: RelayMetrics,
        outbox: &OutboxConfig,
    ) -> Self {
        Self {
            pool,
            queue,
            relay,
            stuck_after: outbox.poll_interval.max(MAX_BACKOFF) + ROUND_LIMIT,
            started: SystemTime::now(),
        }
    }

    /// Runs every check, concurrently.
    pub(crate) async fn check(&self) -> [Check; 3] {
        let postgres = bounded(async {
            sqlx::query("SELECT 1")
                .execute(&self.pool)
                .await
                .map(drop)
                .map_err(|err| err.to_string())
        });
        let valkey = bounded(async { self.queue.ping().await.map_err(|err| err.to_string()) });
        let (postgres, valkey) = tokio::join!(postgres, valkey);
        [
            ("postgres", postgres),
            ("valkey", valkey),
            ("relay", self.relay_progress()),
        ]
    }

    /// Whether a relay round finished within `stuck_after`.
    fn relay_progress(&self) -> Result<(), String> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        progress_since(
            self.relay.last_round_unix.get(),
            self.started.elapsed().unwrap_or_default(),
            now,
            self.stuck_after,
        )
    }

    /// `GET /healthz` and `GET /readyz`.
    pub(crate) fn router(self) -> Router {
        let readiness = Arc::new(self);
        Router::new()
            .route("/healthz", get(|| async { "ok" }))
            .route(
                "/readyz",
                get(move || {
                    let readiness = Arc::clone(&readiness);
                    async move { readiness.respond().await }
                }),
            )
    }

    /// 200 and `ready`, or 503 and one line per check.
    async fn respond(&self) -> (StatusCode, String) {
        let checks = self.check().await;
        if checks.iter().all(|(_, result)| result.is_ok()) {
            return (StatusCode::OK, "ready".to_string());
        }
        let mut body = String::new();
        for (name, result) in &checks {
            match result {
                Ok(()) => body.push_str(&format!("{name}: ok\n")),
                Err(reason) => {
                    tracing::warn!(check = name, %reason, "not ready");
                    body.push_str(&format!("{name}: {reason}\n"));
                }
            }
        }
        (StatusCode::SERVICE_UNAVAILABLE, body)
    }
}

/// Whether the relay whose last round finished at `last_round_unix` (Unix
/// seconds, 0 before the first), in a worker up for `up_for`, made a round
/// within `stuck_after` of `now` (since the Unix epoch).
fn progress_since(
    last_round_unix: f64,
    up_for: Duration,
    now: Duration,
    stuck_after: Duration,
) -> Result<(), String> {
    let since_round = if last_round_unix > 0.0 {
        Duration::from_secs_f64((now.as_secs_f64() - last_round_unix).max(0.0))
    } else {
        up_for
    };
    if since_round <= stuck_after {
        Ok(())
    } else {
        Err(format!(
            "no relay round finished for {}s",
            since_round.as_secs()
        ))
    }
}

/// `check`, or a timeout error after [`CHECK_TIMEOUT`].
async fn bounded(check: impl Future<Output = Result<(), String>>) -> Result<(), String> {
    tokio::time::timeout(CHECK_TIMEOUT, check)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {}s", CHECK_TIMEOUT.as_secs())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_relay_is_stuck_only_when_no_round_finished_for_too_long() {
        let stuck_after = Duration::from_secs(150);
        let now = Duration::from_secs(1_000_000);
        let at = |ago: u64| (now - Duration::from_secs(ago)).as_secs_f64();
        let up_for = Duration::from_secs(3600);
        assert!(progress_since(at(1), up_for, now, stuck_after).is_ok());
        assert!(progress_since(at(150), up_for, now, stuck_after).is_ok());
        let err = progress_since(at(151), up_for, now, stuck_after).unwrap_err();
        assert_eq!(err, "no relay round finished for 151s");
        // Before the first round, the worker's age counts.
        assert!(progress_since(0.0, Duration::from_secs(10), now, stuck_after).is_ok());
        assert!(progress_since(0.0, up_for, now, stuck_after).is_err());
    }
}
