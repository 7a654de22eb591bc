//! The outbox guarantee: an event dispatched inside a transaction is stored
//! exactly when the transaction commits.

use super::support;

use serde::Serialize;
use sqlx::PgPool;
use support::TestDatabase;

use crate::database::Transactor;
use crate::dispatch::{Dispatcher, Event};
use crate::migrate::parser::{self, Direction};
use crate::outbox::MIGRATION_SQL;
use crate::outbox::dispatcher::OutboxDispatcher;
use crate::trace_context::{self, TraceContext};

#[derive(Debug, Serialize)]
struct OrderPlaced {
    order_id: i64,
}

impl Event for OrderPlaced {
    const NAME: &'static str = "orderPlaced";
}

async fn outbox_rows(pool: &PgPool) -> i64 {
    let (count,): (i64,) = sqlx::query_as("SELECT count(*) FROM outbox_events")
        .fetch_one(pool)
        .await
        .expect("count outbox rows");
    count
}

async fn setup() -> (TestDatabase, Transactor, OutboxDispatcher) {
    let db = TestDatabase::migrated().await;
    // A name of its own: the project's migrations may well have `orders`.
    sqlx::query("CREATE TABLE outbox_test_orders (id bigint PRIMARY KEY)")
        .execute(&db.pool)
        .await
        .expect("create a table of the test's own");
    let transactor = Transactor::new(db.pool.clone());
    (db, transactor, OutboxDispatcher::new())
}

#[tokio::test]
async fn an_event_dispatched_in_a_committed_transaction_is_stored_once() {
    // Arrange
    let (db, transactor, dispatcher) = setup().await;

    // Act
    let envelope = transactor
        .run(async |tx| {
            sqlx::query("INSERT INTO outbox_test_orders (id) VALUES (7)")
                .execute(&mut *tx)
                .await?;
            let envelope = dispatcher
                .dispatch(&mut *tx, &OrderPlaced { order_id: 7 })
                .await?;
            Ok::<_, anyhow::Error>(envelope)
        })
        .await
        .expect("the transaction commits");

    // Assert
    assert_eq!(outbox_rows(&db.pool).await, 1);
    let (event_id, name, payload, created_at, published): (
        uuid::Uuid,
        String,
        serde_json::Value,
        chrono::DateTime<chrono::Utc>,
        Option<chrono::DateTime<chrono::Utc>>,
    ) = sqlx::query_as(
        "SELECT event_id, event_name, payload, created_at, published_at FROM outbox_events",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(event_id, envelope.id);
    assert_eq!(name, "orderPlaced");
    assert_eq!(payload, serde_json::json!({"order_id": 7}));
    assert_eq!(created_at, envelope.occurred_at);
    assert_eq!(published, None);
}

#[tokio::test]
async fn a_rolled_back_transaction_stores_neither_the_change_nor_the_event() {
    // Arrange
    let (db, transactor, dispatcher) = setup().await;

    // Act
    let result: Result<(), anyhow::Error> = transactor
        .run(async |tx| {
            sqlx::query("INSERT INTO outbox_test_orders (id) VALUES (7)")
                .execute(&mut *tx)
                .await?;
            dispatcher
                .dispatch(&mut *tx, &OrderPlaced { order_id: 7 })
                .await?;
            anyhow::bail!("payment declined")
        })
        .await;

    // Assert
    assert_eq!(result.unwrap_err().to_string(), "payment declined");
    assert_eq!(outbox_rows(&db.pool).await, 0);
    let (orders,): (i64,) = sqlx::query_as("SELECT count(*) FROM outbox_test_orders")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(orders, 0);
}

#[tokio::test]
async fn a_panic_inside_the_transaction_stores_nothing() {
    // Arrange
    let (db, transactor, dispatcher) = setup().await;

    // Act
    let task = tokio::spawn(async move {
        transactor
            .run(async |tx| {
                dispatcher
                    .dispatch(&mut *tx, &OrderPlaced { order_id: 7 })
                    .await?;
                if std::hint::black_box(true) {
                    panic!("bug in the handler");
                }
                Ok::<_, anyhow::Error>(())
            })
            .await
    });

    // Assert
    assert!(task.await.unwrap_err().is_panic());
    assert_eq!(outbox_rows(&db.pool).await, 0);
}

#[tokio::test]
async fn outside_a_transaction_dispatch_is_a_plain_insert() {
    let (db, _, dispatcher) = setup().await;

    dispatcher
        .dispatch(&db.pool, &OrderPlaced { order_id: 1 })
        .await
        .expect("dispatch on the pool");

    assert_eq!(outbox_rows(&db.pool).await, 1);
}

#[tokio::test]
async fn a_dispatch_inside_a_trace_stores_the_trace_context() {
    // Arrange: the context a request with a `traceparent` header runs in.
    let (db, transactor, dispatcher) = setup().await;
    let parent = TraceContext::parse(
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        Some("rojo=00f067aa0ba902b7"),
    )
    .unwrap();

    // Act
    let envelope = trace_context::scope(
        parent.clone(),
        transactor.run(async |tx| {
            let envelope = dispatcher
                .dispatch(&mut *tx, &OrderPlaced { order_id: 7 })
                .await?;
            Ok::<_, anyhow::Error>(envelope)
        }),
    )
    .await
    .unwrap();

    // Assert: the same trace, a span of its own, stored with the row.
    let stored = TraceContext::from_metadata(&envelope.metadata).expect("a traceparent");
    assert_eq!(stored.trace_id(), parent.trace_id());
    assert_ne!(stored.traceparent(), parent.traceparent());
    assert_eq!(envelope.metadata["tracestate"], "rojo=00f067aa0ba902b7");
    let (metadata,): (serde_json::Value,) = sqlx::query_as("SELECT metadata FROM outbox_events")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(metadata["traceparent"], stored.traceparent());
}

/// Without a current trace and without span export, a dispatch starts no
/// trace: nothing would record it, and a listener would run in a trace
/// no one can find.
#[tokio::test]
async fn a_dispatch_outside_a_trace_without_export_stores_no_trace_context() {
    let (db, _, dispatcher) = setup().await;

    let envelope = dispatcher
        .dispatch(&db.pool, &OrderPlaced { order_id: 3 })
        .await
        .expect("dispatch on the pool");

    assert_eq!(
        TraceContext::from_metadata(&envelope.metadata),
        None,
        "metadata: {:?}",
        envelope.metadata
    );
    let (metadata,): (serde_json::Value,) = sqlx::query_as("SELECT metadata FROM outbox_events")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(metadata.get("traceparent"), None, "stored: {metadata}");
}

#[test]
fn migration_sql_is_the_up_section_of_the_outbox_migration() {
    let file = std::fs::read_to_string(support::migrations_dir().join("20200101000100_outbox.sql"))
        .unwrap();
    let parsed =
        parser::parse(&file, Direction::Up, &|_| None).expect("the outbox migration parses");
    assert!(parsed.use_tx);
    assert_eq!(parsed.statements.join("\n\n"), MIGRATION_SQL);
}
