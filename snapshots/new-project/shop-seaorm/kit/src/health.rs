//! Liveness and readiness probes: `/healthz` answers while the process runs,
//! `/readyz` only while the database answers too.

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use sqlx::PgPool;

/// How long readiness waits for the database.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// The probe routes, `GET /healthz` and `GET /readyz`, for any router state:
/// merge them into the service's router.
pub fn routes<S>(pool: PgPool) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
{
    Router::new()
        .route("/healthz", get(alive))
        .route("/readyz", get(ready))
        .with_state(pool)
}

/// `GET /healthz`: the process is alive.
pub async fn alive() -> &'static str {
    "ok"
}

/// `GET /readyz`: 200 when the database answers within two seconds, 503 otherwise.
pub async fn ready(State(pool): State<PgPool>) -> (StatusCode, &'static str) {
    let ping = sqlx::query("SELECT 1").execute(&pool);
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
