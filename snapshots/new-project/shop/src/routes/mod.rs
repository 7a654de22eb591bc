//! The HTTP routes. Add one module per resource and register it in
//! [`router`].

use axum::Router;
use kit::{health, http_metrics, trace_context};

use crate::startup::AppState;

/// All routes of the service, timed for `GET /metrics`.
pub fn router(state: AppState) -> Router {
    Router::new()
        .merge(health::routes(state.pool.clone()))
        .merge(http_metrics::routes())
        .layer(axum::middleware::from_fn(http_metrics::track))
        .layer(axum::middleware::from_fn(trace_context::propagate))
        .with_state(state)
}
