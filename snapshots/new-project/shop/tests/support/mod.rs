//! What the service's tests share: a throwaway database per test, empty or
//! migrated from scratch. Tests of events, listeners and routes use the
//! testing kit (`kit::testing`) instead: its `TestDatabase` copies a
//! database migrated once, and the README's "Tests" shows its other calls.
//! (The kit's own tests are in `kit/src/tests/`; `cargo test -p shop-kit
//! --all-features` runs them.)

// Each test binary uses a different part of this module.
#![allow(dead_code)]

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Connection, Executor, PgConnection};

use kit::migrate;

/// A database created for one test and dropped (with `FORCE`) when the value
/// is dropped, also when the test fails.
pub struct TestDatabase {
    pub pool: PgPool,
    pub options: PgConnectOptions,
    name: String,
    admin: PgConnectOptions,
}

impl TestDatabase {
    /// Creates an empty database on the server `DATABASE_URL` points at.
    pub async fn empty() -> Self {
        let url = std::env::var("DATABASE_URL").expect(
            "these tests need a Postgres server: set DATABASE_URL, \
             e.g. postgres://postgres@127.0.0.1:5432/postgres",
        );
        let admin = PgConnectOptions::from_str(&url).expect("DATABASE_URL is a Postgres URL");
        let name = format!("test_{}", uuid::Uuid::now_v7().simple());
        let mut conn = PgConnection::connect_with(&admin)
            .await
            .expect("connect to DATABASE_URL");
        conn.execute(format!(r#"CREATE DATABASE "{name}""#).as_str())
            .await
            .expect("create the test database");
        conn.close().await.ok();
        let options = admin.clone().database(&name);
        let pool = PgPoolOptions::new()
            .max_connections(5)
            .connect_with(options.clone())
            .await
            .expect("connect to the test database");
        Self {
            pool,
            options,
            name,
            admin,
        }
    }

    /// Creates a database with every migration in `migrations/` applied by
    /// the project's own goose runner.
    pub async fn migrated() -> Self {
        let db = Self::empty().await;
        migrate::testing::up(&db.pool, "migrations")
            .await
            .expect("apply the migrations");
        db
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let admin = self.admin.clone();
        let name = std::mem::take(&mut self.name);
        // Drop runs inside the test's runtime, which cannot block on async
        // work; a separate thread with its own runtime can.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime to drop the test database");
            runtime.block_on(async move {
                let mut conn = PgConnection::connect_with(&admin).await?;
                conn.execute(format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#).as_str())
                    .await?;
                conn.close().await
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("warning: failed to drop a test database");
        }
    }
}
