//! `confirm`: a listener of `orderPlaced` that confirms the order.

use kit::prelude::*;

use crate::events::order_placed::OrderPlaced;

/// Records the order's confirmation, once per event: `ctx.once` runs the
/// insert in a transaction that also records the event in the inbox, so a
/// second delivery of the same event skips it.
pub async fn handle(event: OrderPlaced, ctx: ListenerContext) -> Result<(), ListenerError> {
    let confirmed = ctx
        .once(async |tx| {
            sqlx::query("INSERT INTO order_confirmations (event_id, order_id) VALUES ($1, $2)")
                .bind(ctx.event_id())
                .bind(event.order_id)
                .execute(&mut *tx)
                .await?;
            Ok(())
        })
        .await?;
    if confirmed.is_some() {
        tracing::info!(event_id = %ctx.event_id(), order_id = %event.order_id, "order confirmed");
    }
    Ok(())
}
