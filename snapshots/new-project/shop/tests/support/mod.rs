//! What the service's tests share: a migrated database per test, and the
//! application's routes called without a port. The testing kit
//! (`kit::testing`) has the rest; the README's "Tests" shows its calls.
//! (The kit's own tests are in `kit/tests/`; `cargo test -p shop-kit
//! --all-features` runs them.)

// Each test binary uses a different part of this module.
#![allow(dead_code)]

pub use kit::testing::{TestClient, TestDatabase};

use shop::startup::Application;

/// The application on `db`, and a client that calls its routes without a
/// port: a request goes through the routes, their transactions and the
/// outbox as in production.
pub async fn client(db: &TestDatabase) -> TestClient {
    let app = Application::build(&db.settings())
        .await
        .expect("build the application");
    TestClient::new(app.router())
}
