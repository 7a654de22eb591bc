//! Liveness and readiness probes: `/healthz` answers while the process runs,
//! `/readyz` only while the database answers too.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;

use crate::startup::AppState;

/// How long readiness waits for the database.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// `GET /healthz`: the process is alive.
pub async fn alive() -> &'static str {
    "ok"
}

/// `GET /readyz`: 200 when the database answers within two seconds, 503 otherwise.
pub async fn ready(State(state): State<AppState>) -> (StatusCode, &'static str) {
    let ping = sqlx::query("SELECT 1").execute(&state.pool);
    match tokio::time::timeout(READY_TIMEOUT, ping).await {
        Ok(Ok(_)) => (StatusCode::OK, "ready"),
        Ok(Err(err)) => {
            tracing::warn!(error = %err, "not ready: database unreachable");
            (StatusCode::SERVICE_UNAVAILABLE, "database unreachable")
        }
        Err(_) => {
            tracing::warn!("not ready: database timed out");
            (StatusCode::SERVICE_UNAVAILABLE, "database timed out")
        }
    }
}
