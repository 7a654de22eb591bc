//! At most one event per key in a window (`kit::dispatch_unique`) against
//! real Postgres: concurrent transactions commit exactly one event, the
//! key is free again after its window, and a rolled-back holder leaves it
//! free.
#![cfg(feature = "testing")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::postgres::PgPoolOptions;
use tokio::sync::Barrier;

use super::support;
use crate::outbox::{Envelope, Event, Unique};
use crate::testing::TestDatabase;

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct SyncRequested {
    account: u32,
}

impl Event for SyncRequested {
    const NAME: &'static str = "syncRequested";
}

const HOUR: Duration = Duration::from_secs(3600);

async fn events(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox_events")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn dispatch_once(pool: &sqlx::PgPool, key: &str, window: Duration) -> Unique {
    let mut tx = pool.begin().await.unwrap();
    let outcome = crate::dispatch_unique(&mut *tx, &SyncRequested { account: 1 }, key, window)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    outcome
}

/// 100 transactions, all open at once, dispatch one key: exactly one
/// event commits, and the 99 others name it as the one that holds the key.
/// Every wait is bounded ([`RACE_DEADLINE`]): a racer that cannot open its
/// transaction fails the test instead of leaving the others at the barrier.
#[tokio::test]
async fn a_hundred_concurrent_dispatches_of_one_key_commit_exactly_one_event() {
    const RACERS: usize = 100;
    const RACE_DEADLINE: Duration = Duration::from_secs(10);
    let db = TestDatabase::new().await;
    let started = Instant::now();
    let pool = PgPoolOptions::new()
        .max_connections(RACERS as u32)
        .acquire_timeout(RACE_DEADLINE)
        .connect_with(db.pool().connect_options().as_ref().clone())
        .await
        .unwrap();
    let barrier = Arc::new(Barrier::new(RACERS));
    let mut racers = tokio::task::JoinSet::new();
    for account in 0..RACERS as u32 {
        let (pool, barrier) = (pool.clone(), barrier.clone());
        racers.spawn(async move {
            let mut tx = pool
                .begin()
                .await
                .map_err(|err| format!("racer {account} could not open its transaction: {err}"))?;
            // Every transaction is open before any dispatches.
            tokio::time::timeout(RACE_DEADLINE, barrier.wait())
                .await
                .map_err(|_| {
                    format!(
                        "racer {account}: not every racer reached the barrier within \
                         {RACE_DEADLINE:?} (one could not open its transaction?)"
                    )
                })?;
            let outcome =
                crate::dispatch_unique(&mut *tx, &SyncRequested { account }, "sync:1", HOUR)
                    .await
                    .map_err(|err| format!("racer {account}'s dispatch failed: {err}"))?;
            tx.commit()
                .await
                .map_err(|err| format!("racer {account}'s commit failed: {err}"))?;
            Ok::<Unique, String>(outcome)
        });
    }
    let outcomes: Vec<Unique> = tokio::time::timeout(2 * RACE_DEADLINE, racers.join_all())
        .await
        .unwrap_or_else(|_| panic!("the race did not end within {:?}", 2 * RACE_DEADLINE))
        .into_iter()
        .map(|outcome| outcome.unwrap_or_else(|err| panic!("{err}")))
        .collect();
    let stored: Vec<&Envelope> = outcomes
        .iter()
        .filter_map(|outcome| match outcome {
            Unique::Stored(envelope) => Some(envelope),
            Unique::Duplicate { .. } => None,
        })
        .collect();
    assert_eq!(stored.len(), 1, "exactly one stored");
    for outcome in &outcomes {
        if let Unique::Duplicate { existing, .. } = outcome {
            assert_eq!(*existing, stored[0].id);
        }
    }
    assert_eq!(events(db.pool()).await, 1);
    pool.close().await;
    eprintln!("the race took {:?}", started.elapsed());
}

/// Within its window a key stays held; once the window is over, the next
/// dispatch takes it and is stored.
#[tokio::test]
async fn after_its_window_a_key_takes_a_new_event() {
    let db = TestDatabase::new().await;
    let window = Duration::from_millis(300);
    let Unique::Stored(first) = dispatch_once(db.pool(), "sync:2", window).await else {
        panic!("the first dispatch of a key is stored");
    };
    let Unique::Duplicate { existing, until } = dispatch_once(db.pool(), "sync:2", window).await
    else {
        panic!("the second, within the window, is not");
    };
    assert_eq!(existing, first.id);

    let deadline = Instant::now() + Duration::from_secs(3);
    let (second, stored_at) = loop {
        if let Unique::Stored(envelope) = dispatch_once(db.pool(), "sync:2", window).await {
            break (envelope, chrono::Utc::now());
        }
        assert!(Instant::now() < deadline, "the key is still held after 3 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(stored_at >= until, "stored at {stored_at}, before {until}");
    assert_ne!(second.id, first.id);
    assert_eq!(events(db.pool()).await, 2);
    // The cleanup deletes the key once its new window is over.
    #[cfg(feature = "worker")]
    support::eventually(Duration::from_secs(3), "the key to expire", || async {
        crate::outbox::cleanup::delete_expired_keys(db.pool())
            .await
            .unwrap()
            == 1
    })
    .await;
}

/// A dispatch that finds the key held takes no lock: while one such
/// dispatch's transaction stays open, another dispatch of the key answers
/// at once (within [`ANSWER_BOUND`]) that the first event holds it.
#[tokio::test]
async fn a_duplicate_holds_no_lock_on_the_key() {
    const ANSWER_BOUND: Duration = Duration::from_secs(2);
    let db = TestDatabase::new().await;
    let Unique::Stored(first) = dispatch_once(db.pool(), "sync:5", HOUR).await else {
        panic!("the first dispatch of a key is stored");
    };
    let mut open = db.pool().begin().await.unwrap();
    let duplicate =
        crate::dispatch_unique(&mut *open, &SyncRequested { account: 5 }, "sync:5", HOUR)
            .await
            .unwrap();
    assert!(!duplicate.is_stored(), "{duplicate:?}");

    let answer = tokio::time::timeout(ANSWER_BOUND, dispatch_once(db.pool(), "sync:5", HOUR))
        .await
        .unwrap_or_else(|_| {
            panic!("a dispatch waited {ANSWER_BOUND:?} on another duplicate's open transaction")
        });
    open.commit().await.unwrap();
    let Unique::Duplicate { existing, until } = answer else {
        panic!("the key is held: {answer:?}");
    };
    assert_eq!(existing, first.id);
    assert!(until > chrono::Utc::now(), "{until}");
    assert_eq!(events(db.pool()).await, 1);
}

/// A dispatch that waited on the transaction taking the key until that
/// key's window was over is stored (the window ended before it got its
/// answer), never told `Duplicate` with an `until` already past.
#[tokio::test]
async fn a_dispatch_that_waited_past_the_window_takes_the_key() {
    let db = TestDatabase::new().await;
    let window = Duration::from_millis(200);
    let mut holder = db.pool().begin().await.unwrap();
    let taken = crate::dispatch_unique(
        &mut *holder,
        &SyncRequested { account: 6 },
        "sync:6",
        window,
    )
    .await
    .unwrap();
    assert!(taken.is_stored());
    let until: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT until FROM outbox_unique WHERE key = 'sync:6'")
            .fetch_one(&mut *holder)
            .await
            .unwrap();
    let pool = db.pool().clone();
    let waiting = tokio::spawn(async move { dispatch_once(&pool, "sync:6", window).await });
    support::eventually(
        Duration::from_secs(3),
        "the second to wait on the key",
        || async { waiting_on_a_lock(db.pool()).await == 1 },
    )
    .await;
    // The holder commits once its window is over.
    support::eventually(Duration::from_secs(3), "the window to end", || async {
        chrono::Utc::now() > until
    })
    .await;
    holder.commit().await.unwrap();

    let answer = waiting.await.unwrap();
    let answered_at = chrono::Utc::now();
    match answer {
        Unique::Stored(_) => {}
        Unique::Duplicate { until, .. } => {
            panic!("told Duplicate until {until}, at {answered_at}: the window was over")
        }
    }
    assert_eq!(events(db.pool()).await, 2);
}

/// How many sessions of the test's database wait on a lock.
async fn waiting_on_a_lock(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A transaction that took the key and rolled back leaves it free: the
/// dispatch that waited on it is stored.
#[tokio::test]
async fn a_key_taken_by_a_rolled_back_transaction_is_free_again() {
    let db = TestDatabase::new().await;
    let mut holder = db.pool().begin().await.unwrap();
    let taken = crate::dispatch_unique(&mut *holder, &SyncRequested { account: 3 }, "sync:3", HOUR)
        .await
        .unwrap();
    assert!(taken.is_stored());
    let pool = db.pool().clone();
    let waiting = tokio::spawn(async move { dispatch_once(&pool, "sync:3", HOUR).await });
    // The second waits on the key's row lock until the holder ends.
    support::eventually(
        Duration::from_secs(3),
        "the second to wait on the key",
        || async {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .fetch_one(db.pool())
            .await
            .unwrap();
            waiting == 1
        },
    )
    .await;
    holder.rollback().await.unwrap();

    let Unique::Stored(stored) = waiting.await.unwrap() else {
        panic!("the key is free once its holder rolled back");
    };
    let ids: Vec<uuid::Uuid> = sqlx::query_scalar("SELECT event_id FROM outbox_events")
        .fetch_all(db.pool())
        .await
        .unwrap();
    assert_eq!(ids, [stored.id]);
}

#[cfg(feature = "seaorm")]
mod seaorm {
    use super::*;

    /// The SeaORM form takes the key as the sqlx form does, keyed events
    /// included.
    #[tokio::test]
    async fn the_seaorm_form_stores_once_per_window() {
        let db = TestDatabase::new().await;
        let orm = crate::orm::Transactor::new(
            sea_orm::SqlxPostgresConnector::from_sqlx_postgres_pool(db.pool().clone()),
        );
        let event = SyncRequested { account: 4 };
        let first = orm
            .run(async |tx| Ok(crate::dispatch_unique(tx, &event, "sync:4", HOUR).await?))
            .await
            .unwrap();
        let second = orm
            .run(async |tx| Ok(crate::dispatch_unique(tx, &event, "sync:4", HOUR).await?))
            .await
            .unwrap();
        let Unique::Stored(first) = first else {
            panic!("stored first");
        };
        assert!(
            matches!(second, Unique::Duplicate { existing, .. } if existing == first.id),
            "{second:?}"
        );
        assert_eq!(events(db.pool()).await, 1);
    }
}
