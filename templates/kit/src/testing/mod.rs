//! The testing kit, for the service's tests (`tests/`) and the kit's own.
//!
//! Always here: [`config()`] and [`settings()`], a configuration that needs no
//! environment. With the feature `testing` (the service turns it on in its
//! `[dev-dependencies]`, so none of it reaches the service's binaries):
//!
//! - `TestDatabase`: a database per test, migrated once per set of
//!   migrations and copied from a template for each test, dropped after
//!   it. The server is `TEST_DATABASE_URL`, else `DATABASE_URL`.
//! - `Dispatched` (`db.dispatched().await`): typed assertions on what
//!   the code under test put in the outbox, in order: `assert_dispatched`,
//!   `assert_not_dispatched`, `assert_all_dispatched`.
//! - `TestClient`: the service's routes called without a port, so a test
//!   goes request → transaction → dispatched events.
//! - With the feature `worker` too:
//!   - `Drain` (`db.drain(&listeners).await`): publishes and runs every
//!     event through the service's listeners in the test's process, without
//!     Valkey, following the events they dispatch, and reports what ran
//!     (`DrainReport`); `db.drain_twice(..)` delivers every event twice,
//!     the redelivery check of a listener's idempotency;
//!   - `run_listener` and `listener_context`: one listener on one event
//!     with a real `ListenerContext`;
//!     `run_job` and `dispatch_tick`: one tick of a schedule;
//!   - `TestWorker`: the real worker on a test Valkey, for tests through
//!     the queue itself.
//!
//! A test of a route and its listener, end to end:
//!
#![cfg_attr(
    all(feature = "testing", feature = "worker"),
    doc = r#"
```
# #[tokio::main(flavor = "current_thread")]
# async fn main() {
# if !kit::testing::example_has_a_database() { return; }
use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use kit::prelude::*;
use kit::testing::{TestClient, TestDatabase};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct OrderPlaced {
    sku: String,
}
impl Event for OrderPlaced {
    const NAME: &'static str = "orderPlaced";
}

// The service: a route that dispatches, a listener that reacts.
async fn place(State(transactor): State<Transactor>, Json(order): Json<OrderPlaced>) {
    transactor
        .run(async |tx| Ok(dispatch(&mut *tx, &order).await?))
        .await
        .unwrap();
}
async fn confirm(event: OrderPlaced, ctx: ListenerContext) -> Result<(), ListenerError> {
    ctx.once(async |tx| {
        sqlx::query("SELECT $1").bind(&event.sku).execute(&mut *tx).await?;
        Ok(())
    })
    .await?;
    Ok(())
}

let db = TestDatabase::new().await;
let router = Router::new()
    .route("/orders", post(place))
    .with_state(db.transactor());
let client = TestClient::new(router);

let response = client.post_json("/orders", &serde_json::json!({"sku": "tea"})).await;
assert_eq!(response.status(), 200);
db.dispatched().await.assert_dispatched::<OrderPlaced>(|e| e.sku == "tea");

let listeners = kit::testing::listeners(|listeners| {
    listeners.listen("confirm", confirm);
});
db.drain(&listeners).await.assert_succeeded("orderPlaced", "confirm");
# }
```
"#
)]
//!
//! The examples that need Postgres run where `DATABASE_URL` is set (gpkit's
//! suite sets it). Elsewhere they fail under CI (`CI=true`), and return at
//! once, saying so on stderr, outside it.

#[cfg(feature = "testing")]
mod database;
#[cfg(feature = "testing")]
mod dispatched;
#[cfg(all(feature = "testing", feature = "worker"))]
mod drain;
#[cfg(feature = "testing")]
mod examples;
#[cfg(feature = "testing")]
mod http;
#[cfg(all(feature = "testing", feature = "worker"))]
mod schedule;
#[cfg(all(feature = "testing", feature = "worker"))]
mod worker;

#[cfg(feature = "testing")]
pub use database::TestDatabase;
#[cfg(feature = "testing")]
pub use dispatched::Dispatched;
#[cfg(all(feature = "testing", feature = "worker"))]
pub use drain::{
    Delivery, Drain, DrainReport, Once, Outcome, listener_context, listeners, run_listener,
};
#[cfg(feature = "testing")]
#[doc(hidden)]
pub use examples::example_has_a_database;
#[cfg(feature = "testing")]
pub use http::{TestClient, TestResponse};
#[cfg(all(feature = "testing", feature = "worker"))]
pub use schedule::{dispatch_tick, run_job};
#[cfg(all(feature = "testing", feature = "worker"))]
pub use worker::TestWorker;

use std::time::Duration;

use crate::config::{self, Config};

/// [`config()`] as the service's settings type `S` (its own `Settings`, which
/// nests the kit's configuration, or the kit's [`Config`] itself), inferred
/// from where it goes: `Application::build(&kit::testing::settings(url))`.
pub fn settings<S: From<Config>>(database_url: &str) -> S {
    S::from(config(database_url))
}

/// The configuration a test starts from, read from no environment:
/// `database_url`, the HTTP server and the metrics endpoint on free ports
/// (`127.0.0.1:0`), the relay's wake-ups off, and fixed values of a test's
/// size for the rest (5 connections, a 1 s relay poll).
///
/// # Panics
///
/// If `database_url` is not a Postgres URL.
pub fn config(database_url: &str) -> Config {
    Config {
        database: config::DatabaseConfig {
            url: database_url
                .parse()
                .expect("the test's DATABASE_URL is a Postgres URL"),
            max_connections: 5,
            connect_timeout: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(30),
        },
        http: config::HttpConfig {
            addr: "127.0.0.1:0".parse().unwrap(),
        },
        valkey: config::ValkeyConfig::default(),
        outbox: config::OutboxConfig {
            poll_interval: Duration::from_secs(1),
            batch_size: 100,
            retention: Duration::from_secs(168 * 3600),
            cleanup_interval: Duration::from_secs(3600),
            task_retention: Duration::from_secs(24 * 3600),
            #[cfg(feature = "worker")]
            wake: config::WakeMode::Off,
            #[cfg(feature = "worker")]
            queues: Default::default(),
        },
        #[cfg(feature = "worker")]
        worker: config::WorkerConfig {
            concurrency: 10,
            queues: "default=1".parse().unwrap(),
            shutdown_timeout: Duration::from_secs(30),
            metrics_addr: "127.0.0.1:0".parse().unwrap(),
            inbox_retention: Duration::from_secs(168 * 3600),
            failure_retention: None,
            service_id: None,
        },
        #[cfg(feature = "worker")]
        scheduler: config::SchedulerConfig {
            enabled: true,
            lease_ttl: Duration::from_secs(15),
        },
    }
}
