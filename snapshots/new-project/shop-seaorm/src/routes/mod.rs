//! The HTTP routes. Add one module per resource and register it in
//! [`router`].

mod health_check;

use axum::Router;
use axum::routing::get;

use crate::startup::AppState;
use crate::trace_context;

/// All routes of the service.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(health_check::alive))
        .route("/readyz", get(health_check::ready))
        .layer(axum::middleware::from_fn(trace_context::propagate))
        .with_state(state)
}
