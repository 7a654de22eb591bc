//! `remind`: a listener of `orderReminderDue`, which `POST /orders`
//! dispatches for a day after the order.

use kit::prelude::*;
use sea_orm::{ActiveModelTrait, Set};

use crate::entities::reminder;
use crate::events::order_reminder_due::OrderReminderDue;

/// Records the order's reminder, once per event: `ctx.once` runs the
/// insert in a SeaORM transaction that also records the event in the inbox,
/// so a second delivery of the same event skips it.
pub async fn handle(event: OrderReminderDue, ctx: OrmListenerContext) -> Result<(), ListenerError> {
    let reminded = ctx
        .once(async |tx| {
            reminder::ActiveModel {
                event_id: Set(ctx.event_id()),
                order_id: Set(event.order_id),
            }
            .insert(tx)
            .await?;
            Ok(())
        })
        .await?;
    if reminded.is_some() {
        tracing::info!(event_id = %ctx.event_id(), order_id = %event.order_id, "order reminded");
    }
    Ok(())
}
