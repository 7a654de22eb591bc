//! `confirm`: a listener of `orderPlaced` that confirms the order.

use crate::events::order_placed::OrderPlaced;
use crate::worker::listeners::{ListenerContext, ListenerError};

/// Records the order's confirmation once per event. Delivery is at least
/// once: a second delivery of the same event finds the row the first one
/// wrote (keyed by the envelope id, `ctx.event_id`) and changes nothing.
pub async fn handle(event: OrderPlaced, ctx: ListenerContext) -> Result<(), ListenerError> {
    sqlx::query(
        "INSERT INTO order_confirmations (event_id, order_id) VALUES ($1, $2) \
         ON CONFLICT (event_id) DO NOTHING",
    )
    .bind(ctx.event_id)
    .bind(event.order_id)
    .execute(&ctx.pool)
    .await?;
    tracing::info!(event_id = %ctx.event_id, order_id = %event.order_id, "order confirmed");
    Ok(())
}
