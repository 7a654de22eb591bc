//! `email`: a listener of `orderPlaced`.

use crate::events::order_placed::OrderPlaced;
use crate::worker::listeners::{ListenerContext, ListenerError};

/// Handles one `orderPlaced`. It runs in the worker, in a task of its
/// own, retried on error. It may see the same event more than once: make it
/// idempotent on `ctx.event_id`.
pub async fn handle(event: OrderPlaced, ctx: ListenerContext) -> Result<(), ListenerError> {
    tracing::info!(event_id = %ctx.event_id, ?event, "orderPlaced: email");
    Ok(())
}
