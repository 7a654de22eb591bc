//! The relay publishes events dispatched in SeaORM transactions like any
//! other: committed ones become tasks in commit order, rolled-back ones
//! never do, and the server's after-commit hook (the relay's wake-up) runs
//! after SeaORM commits too.

#![cfg(all(feature = "seaorm", feature = "worker"))]

use super::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::Serialize;
use support::{TestDatabase, TestQueue};

use crate::database::Transactor;
use crate::dispatch::{Dispatcher, Event};
use crate::outbox::dispatcher::OutboxDispatcher;
use crate::outbox::relay::Relay;
use crate::worker::metrics::Metrics;

#[derive(Debug, Serialize)]
struct OrderPlaced {
    order_id: u32,
}

impl Event for OrderPlaced {
    const NAME: &'static str = "orderPlaced";
}

#[tokio::test]
async fn seaorm_dispatched_events_become_tasks_like_any_other() {
    // Arrange: the server's transactor (the kit's, in SeaORM), counting
    // the wake-ups of commits that stored events.
    let db = TestDatabase::migrated().await;
    let queue = TestQueue::new().await;
    let wakeups = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&wakeups);
    let transactor = Transactor::new(db.pool.clone())
        .after_events(move || {
            counted.fetch_add(1, Ordering::SeqCst);
        })
        .orm();
    let dispatcher = OutboxDispatcher::new();

    // Three committed transactions, one rolled back, one plain insert.
    let mut envelopes = Vec::new();
    for order_id in 0..3 {
        let envelope = transactor
            .run(async |tx| {
                let envelope = dispatcher.dispatch(tx, &OrderPlaced { order_id }).await?;
                Ok::<_, anyhow::Error>(envelope)
            })
            .await
            .expect("the transaction commits");
        envelopes.push(envelope);
    }
    let rolled_back: Result<(), anyhow::Error> = transactor
        .run(async |tx| {
            dispatcher
                .dispatch(tx, &OrderPlaced { order_id: 99 })
                .await?;
            anyhow::bail!("out of stock")
        })
        .await;
    assert!(rolled_back.is_err());
    // A commit that stored no event wakes nothing.
    transactor
        .run(async |_tx| Ok::<_, anyhow::Error>(()))
        .await
        .expect("an empty transaction commits");
    envelopes.push(
        dispatcher
            .dispatch(transactor.connection(), &OrderPlaced { order_id: 3 })
            .await
            .expect("dispatch on the connection"),
    );

    // Act
    let config = crate::testing::config("postgres://unused@localhost/unused");
    let relay = Relay::new(
        db.pool.clone(),
        queue.client.clone(),
        &config.outbox,
        Metrics::new().relay,
    )
    .with_queue(queue.name.clone());
    let round = relay.publish_batch().await.expect("a relay round");

    // Assert: the four stored events, in commit order, and nothing else.
    assert_eq!((round.claimed, round.published), (4, 4));
    let expected: Vec<String> = envelopes.iter().map(|e| e.id.to_string()).collect();
    assert_eq!(queue.pending_ids().await, expected);
    assert_eq!(relay.publish_batch().await.unwrap().claimed, 0);
    assert_eq!(wakeups.load(Ordering::SeqCst), 3);
}
