//! `audit`: a listener of `orderPlaced`.

use kit::prelude::*;

use crate::events::order_placed::OrderPlaced;

/// Handles one `orderPlaced`. It runs in the worker, in a task of its
/// own, retried on error, and may see the same event more than once.
pub async fn handle(event: OrderPlaced, ctx: ListenerContext) -> Result<(), ListenerError> {
    // Database work in `ctx.once` commits once per event, however often the
    // event arrives: write through `tx`, and dispatch follow-up events with
    // it. Work outside the database (an e-mail, an HTTP call) does not
    // belong there; make it idempotent on `ctx.event_id()` instead.
    let ran = ctx
        .once(async |_tx| {
            // sqlx::query("INSERT ...").execute(&mut *_tx).await?;
            Ok(())
        })
        .await?;
    tracing::info!(event_id = %ctx.event_id(), ?event, first = ran.is_some(), "orderPlaced: audit");
    Ok(())
}
