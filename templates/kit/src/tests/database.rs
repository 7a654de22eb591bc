//! The pool: a connection Postgres closed while it sat idle is replaced
//! before a transaction takes it.

use std::time::Duration;

use super::support::{TestDatabase, eventually};
use crate::database::{self, Transactor};

/// A connection is checked only once it has been idle for a second (the
/// check is a round trip per transaction otherwise): one that Postgres
/// closed meanwhile (a restart, an idle timeout, `pg_terminate_backend`)
/// is replaced, and the transaction runs on a new one.
#[tokio::test]
async fn a_connection_closed_while_idle_is_replaced_before_use() {
    let db = TestDatabase::migrated().await;
    let mut config = crate::testing::config(&db.url());
    config.database.max_connections = 1;
    let transactor = Transactor::new(database::connect_lazy(&config.database));
    let backend = || {
        transactor.run(async |tx| {
            let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                .fetch_one(&mut *tx)
                .await?;
            Ok(pid)
        })
    };
    let first = backend().await.unwrap();

    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(first)
        .execute(&db.pool)
        .await
        .unwrap();
    eventually(Duration::from_secs(10), "the backend is gone", || async {
        let left: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = $1")
            .bind(first)
            .fetch_one(&db.pool)
            .await
            .unwrap();
        left == 0
    })
    .await;
    // Idle past the check's threshold: the time is the condition.
    tokio::time::sleep(Duration::from_millis(1_100)).await;

    let second = backend()
        .await
        .expect("the transaction took the closed connection");
    assert_ne!(first, second);
}
