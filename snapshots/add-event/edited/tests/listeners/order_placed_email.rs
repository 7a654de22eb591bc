//! The test of `email`, a listener of `orderPlaced`.
//!
//! The event goes through the outbox and the service's listeners, in the
//! test's process. `gpkit add event` wrote it with the listener; it is
//! yours to change: give the event the values your listener needs, and
//! assert on what the listener writes.

use shop::events::order_placed::OrderPlaced;
use shop::listeners::register;

#[tokio::test]
async fn email_handles_an_order_placed() {
    let db = kit::testing::TestDatabase::new().await;
    let event = OrderPlaced {
        order_id: Default::default(),
        total_cents: Default::default(),
        note: Default::default(),
    };
    db.transactor()
        .run(async |tx| {
            kit::dispatch(&mut *tx, &event).await?;
            Ok(())
        })
        .await
        .expect("dispatch the event");

    let report = db.drain(&kit::testing::listeners(register)).await;
    report.assert_succeeded("orderPlaced", "email");
}
