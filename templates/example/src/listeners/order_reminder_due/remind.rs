//! `remind`: a listener of `orderReminderDue`, which `POST /orders`
//! dispatches for a day after the order.

use kit::prelude::*;

use crate::events::order_reminder_due::OrderReminderDue;

/// Records the order's reminder, once per event: `ctx.once` runs the
/// insert in a transaction that also records the event in the inbox, so a
/// second delivery of the same event skips it.
pub async fn handle(event: OrderReminderDue, ctx: ListenerContext) -> Result<(), ListenerError> {
    let reminded = ctx
        .once(async |tx| {
            sqlx::query("INSERT INTO order_reminders (event_id, order_id) VALUES ($1, $2)")
                .bind(ctx.event_id())
                .bind(event.order_id)
                .execute(&mut *tx)
                .await?;
            Ok(())
        })
        .await?;
    if reminded.is_some() {
        tracing::info!(event_id = %ctx.event_id(), order_id = %event.order_id, "order reminded");
    }
    Ok(())
}
