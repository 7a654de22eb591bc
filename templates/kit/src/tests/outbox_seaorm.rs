//! The outbox guarantee on SeaORM: an event dispatched inside a SeaORM
//! transaction is stored exactly when the transaction commits, with the
//! entities written in it.

#![cfg(feature = "seaorm")]

use super::support;

use sea_orm::{ActiveModelTrait, EntityTrait, PaginatorTrait, Set};
use serde::Serialize;
use support::TestDatabase;

use crate::dispatch::{Dispatcher, Event};
use crate::orm::{self, Transactor};
use crate::outbox::dispatcher::OutboxDispatcher;

/// A SeaORM entity of the test's own table (the project's migrations may
/// well have `orders`).
mod order {
    use sea_orm::entity::prelude::*;

    #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
    #[sea_orm(table_name = "outbox_test_orders")]
    pub struct Model {
        #[sea_orm(primary_key, auto_increment = false)]
        pub id: i64,
    }

    #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
    pub enum Relation {}

    impl ActiveModelBehavior for ActiveModel {}
}

#[derive(Debug, Serialize)]
struct OrderPlaced {
    order_id: i64,
}

impl Event for OrderPlaced {
    const NAME: &'static str = "orderPlaced";
}

async fn setup() -> (TestDatabase, Transactor, OutboxDispatcher) {
    let db = TestDatabase::migrated().await;
    sqlx::query("CREATE TABLE outbox_test_orders (id bigint PRIMARY KEY)")
        .execute(&db.pool)
        .await
        .expect("create a table of the test's own");
    let transactor = Transactor::new(orm::connection(&db.pool));
    (db, transactor, OutboxDispatcher::new())
}

/// The rows of `outbox_events`: (event id, name, payload, published).
async fn outbox_rows(
    db: &TestDatabase,
) -> Vec<(
    uuid::Uuid,
    String,
    serde_json::Value,
    Option<chrono::DateTime<chrono::Utc>>,
)> {
    sqlx::query_as(
        "SELECT event_id, event_name, payload, published_at FROM outbox_events ORDER BY id",
    )
    .fetch_all(&db.pool)
    .await
    .expect("read the outbox")
}

async fn orders(transactor: &Transactor) -> u64 {
    order::Entity::find()
        .count(transactor.connection())
        .await
        .expect("count the orders")
}

#[tokio::test]
async fn an_entity_and_its_event_commit_together() {
    // Arrange
    let (db, transactor, dispatcher) = setup().await;

    // Act
    let envelope = transactor
        .run(async |tx| {
            order::ActiveModel { id: Set(7) }.insert(tx).await?;
            let envelope = dispatcher
                .dispatch(tx, &OrderPlaced { order_id: 7 })
                .await?;
            Ok::<_, anyhow::Error>(envelope)
        })
        .await
        .expect("the transaction commits");

    // Assert: the order, and exactly one unpublished event.
    assert_eq!(orders(&transactor).await, 1);
    assert_eq!(
        outbox_rows(&db).await,
        vec![(
            envelope.id,
            "orderPlaced".to_string(),
            serde_json::json!({"order_id": 7}),
            None
        )]
    );
    let (created_at,): (chrono::DateTime<chrono::Utc>,) =
        sqlx::query_as("SELECT created_at FROM outbox_events")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(created_at, envelope.occurred_at);
}

#[tokio::test]
async fn an_error_stores_neither_the_entity_nor_the_event() {
    // Arrange
    let (db, transactor, dispatcher) = setup().await;

    // Act
    let result: Result<(), anyhow::Error> = transactor
        .run(async |tx| {
            order::ActiveModel { id: Set(7) }.insert(tx).await?;
            dispatcher
                .dispatch(tx, &OrderPlaced { order_id: 7 })
                .await?;
            anyhow::bail!("payment declined")
        })
        .await;

    // Assert
    assert_eq!(result.unwrap_err().to_string(), "payment declined");
    assert_eq!(orders(&transactor).await, 0);
    assert!(outbox_rows(&db).await.is_empty());
}

#[tokio::test]
async fn a_panic_stores_neither_the_entity_nor_the_event() {
    // Arrange
    let (db, transactor, dispatcher) = setup().await;

    // Act
    let inner = transactor.clone();
    let task = tokio::spawn(async move {
        inner
            .run(async |tx| {
                order::ActiveModel { id: Set(7) }.insert(tx).await?;
                dispatcher
                    .dispatch(tx, &OrderPlaced { order_id: 7 })
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
    assert_eq!(orders(&transactor).await, 0);
    assert!(outbox_rows(&db).await.is_empty());
}

#[tokio::test]
async fn on_the_connection_dispatch_is_a_plain_insert() {
    // Arrange
    let (db, transactor, dispatcher) = setup().await;

    // Act: no transaction around it.
    let envelope = dispatcher
        .dispatch(transactor.connection(), &OrderPlaced { order_id: 1 })
        .await
        .expect("dispatch on the connection");

    // Assert: stored at once, visible to every other connection.
    let rows = outbox_rows(&db).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].0, envelope.id);
}

#[tokio::test]
async fn an_uncommitted_event_is_invisible_to_other_connections() {
    // Arrange
    let (db, transactor, dispatcher) = setup().await;

    // Act: look from the pool while the transaction is still open.
    let seen_inside = transactor
        .run(async |tx| {
            dispatcher
                .dispatch(tx, &OrderPlaced { order_id: 3 })
                .await?;
            Ok::<_, anyhow::Error>(outbox_rows(&db).await.len())
        })
        .await
        .expect("the transaction commits");

    // Assert
    assert_eq!(seen_inside, 0);
    assert_eq!(outbox_rows(&db).await.len(), 1);
}

/// An event with an order key (`Event::order_key`).
#[derive(Debug, Serialize)]
struct OrderCancelled {
    order_id: i64,
}

impl Event for OrderCancelled {
    const NAME: &'static str = "orderCancelled";

    fn order_key(&self) -> Option<String> {
        Some(format!("order:{}", self.order_id))
    }
}

#[tokio::test]
async fn a_keyed_event_takes_its_keys_next_number_in_a_seaorm_transaction() {
    // Arrange
    let (db, transactor, dispatcher) = setup().await;

    // Act: two events of one key, one of another, in SeaORM transactions.
    let mut numbers = Vec::new();
    for order_id in [7, 7, 8] {
        let envelope = transactor
            .run(async |tx| {
                Ok::<_, anyhow::Error>(
                    dispatcher
                        .dispatch(tx, &OrderCancelled { order_id })
                        .await?,
                )
            })
            .await
            .expect("the transaction commits");
        numbers.push((
            envelope.metadata["order_key"].clone(),
            envelope.metadata["order_seq"].clone(),
        ));
    }

    // Assert: the envelopes and the rows carry the same numbers.
    let pairs = |key: &str, seq: &str| (key.to_string(), seq.to_string());
    assert_eq!(
        numbers,
        [
            pairs("order:7", "1"),
            pairs("order:7", "2"),
            pairs("order:8", "1")
        ]
    );
    let stored: Vec<(String, String)> = sqlx::query_as(
        "SELECT metadata ->> 'order_key', metadata ->> 'order_seq' FROM outbox_events ORDER BY id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(stored, numbers);
}

/// `Executor::insert_event`, the insert without the numbering the
/// dispatcher asks for, stores its row on each kind of executor.
#[tokio::test]
async fn insert_event_stores_the_row_on_every_kind_of_executor() {
    use crate::outbox::{Envelope, Executor};

    // Arrange
    let (db, transactor, _) = setup().await;
    let envelope = |n: i64| Envelope::new("orderPlaced", serde_json::json!({ "order_id": n }));
    let (in_tx, on_connection, on_pg_connection, on_pool) =
        (envelope(1), envelope(2), envelope(3), envelope(4));

    // Act
    transactor
        .run(async |tx| Ok::<_, anyhow::Error>(tx.insert_event(&in_tx).await?))
        .await
        .expect("insert in a SeaORM transaction");
    transactor
        .connection()
        .insert_event(&on_connection)
        .await
        .expect("insert on the SeaORM connection");
    let mut connection = db.pool.acquire().await.expect("a connection");
    (&mut *connection)
        .insert_event(&on_pg_connection)
        .await
        .expect("insert on a sqlx connection");
    (&db.pool)
        .insert_event(&on_pool)
        .await
        .expect("insert on the pool");

    // Assert: the four rows, unpublished, in their order.
    let rows: Vec<(uuid::Uuid, Option<chrono::DateTime<chrono::Utc>>)> = outbox_rows(&db)
        .await
        .into_iter()
        .map(|(id, _, _, published)| (id, published))
        .collect();
    let expected: Vec<_> = [&in_tx, &on_connection, &on_pg_connection, &on_pool]
        .into_iter()
        .map(|envelope| (envelope.id, None))
        .collect();
    assert_eq!(rows, expected);
}
