//! `confirm`: a listener of `orderPlaced` that confirms the order.

use kit::prelude::*;
use sea_orm::{ActiveModelTrait, Set};

use crate::entities::confirmation;
use crate::events::order_placed::OrderPlaced;

/// Records the order's confirmation, once per event: `ctx.once` runs the
/// insert in a SeaORM transaction that also records the event in the inbox,
/// so a second delivery of the same event skips it.
pub async fn handle(event: OrderPlaced, ctx: OrmListenerContext) -> Result<(), ListenerError> {
    let confirmed = ctx
        .once(async |tx| {
            confirmation::ActiveModel {
                event_id: Set(ctx.event_id()),
                order_id: Set(event.order_id),
            }
            .insert(tx)
            .await?;
            Ok(())
        })
        .await?;
    if confirmed.is_some() {
        tracing::info!(event_id = %ctx.event_id(), order_id = %event.order_id, "order confirmed");
    }
    Ok(())
}
