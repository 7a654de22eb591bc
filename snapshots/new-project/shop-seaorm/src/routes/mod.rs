//! The HTTP routes. Add one module per resource and register it in
//! [`router`].

use axum::Router;
use kit::{health, trace_context};

use crate::startup::AppState;

/// All routes of the service.
pub fn router(state: AppState) -> Router {
    Router::new()
        .merge(health::routes(state.pool.clone()))
        .layer(axum::middleware::from_fn(trace_context::propagate))
        .with_state(state)
}
