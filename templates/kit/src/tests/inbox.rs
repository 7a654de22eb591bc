//! The inbox against real Postgres: a listener's database work commits once
//! per event, however often and however concurrently the event arrives.

#![cfg(feature = "worker")]

use super::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use support::TestDatabase;
use tokio::sync::Barrier;
use uuid::Uuid;

use crate::database::Transactor;
use crate::dispatch::{Dispatcher, Event};
use crate::outbox::Envelope;
use crate::outbox::dispatcher::OutboxDispatcher;
use crate::worker::inbox;
use crate::worker::listeners::ListenerContext;
use crate::worker::listeners::ListenerError;
use crate::worker::listeners::Listeners;

#[derive(Debug, Serialize, Deserialize)]
struct PaymentTaken {
    amount: i64,
}

impl Event for PaymentTaken {
    const NAME: &'static str = "paymentTaken";
}

#[derive(Debug, Serialize, Deserialize)]
struct ReceiptSent {
    amount: i64,
}

impl Event for ReceiptSent {
    const NAME: &'static str = "receiptSent";
}

async fn count(db: &TestDatabase, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(&db.pool).await.unwrap()
}

/// A listener that records the payment and dispatches a receipt, in one
/// `ctx.once`, and counts how often its work ran.
fn listeners(runs: Arc<AtomicU32>) -> Listeners {
    let mut listeners = Listeners::new();
    listeners.listen(
        "ledger",
        move |event: PaymentTaken, ctx: ListenerContext| {
            let runs = Arc::clone(&runs);
            async move {
                ctx.once(async |tx| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    sqlx::query("INSERT INTO ledger (event_id, amount) VALUES ($1, $2)")
                        .bind(ctx.event_id())
                        .bind(event.amount)
                        .execute(&mut *tx)
                        .await?;
                    OutboxDispatcher::new()
                        .dispatch(
                            &mut *tx,
                            &ReceiptSent {
                                amount: event.amount,
                            },
                        )
                        .await?;
                    Ok::<_, ListenerError>(())
                })
                .await?;
                Ok(())
            }
        },
    );
    listeners
}

async fn ledger_database() -> TestDatabase {
    let db = TestDatabase::migrated().await;
    sqlx::query("CREATE TABLE ledger (event_id uuid NOT NULL, amount bigint NOT NULL)")
        .execute(&db.pool)
        .await
        .unwrap();
    db
}

#[tokio::test]
async fn an_event_delivered_twice_commits_its_work_and_follow_up_once() {
    let db = ledger_database().await;
    let runs = Arc::new(AtomicU32::new(0));
    let listeners = listeners(Arc::clone(&runs));
    let listener = &listeners.of(PaymentTaken::NAME)[0];
    let envelope = Envelope::new(PaymentTaken::NAME, serde_json::json!({ "amount": 42 }));

    for _ in 0..2 {
        listener
            .call(
                envelope.clone(),
                Default::default(),
                Transactor::new(db.pool.clone()),
            )
            .await
            .unwrap();
    }

    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(count(&db, "SELECT count(*) FROM ledger").await, 1);
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM outbox_events WHERE event_name = 'receiptSent'"
        )
        .await,
        1
    );
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM inbox_processed WHERE listener = 'ledger'"
        )
        .await,
        1
    );
}

#[tokio::test]
async fn two_deliveries_at_the_same_moment_commit_once_and_neither_fails() {
    let db = ledger_database().await;
    let event_id = Uuid::now_v7();
    let barrier = Arc::new(Barrier::new(2));
    let mut deliveries = Vec::new();
    for _ in 0..2 {
        let (pool, barrier) = (db.pool.clone(), Arc::clone(&barrier));
        deliveries.push(tokio::spawn(async move {
            barrier.wait().await;
            inbox::once(
                &Transactor::new(pool),
                "ledger",
                event_id,
                None,
                async |tx| {
                    // Hold the transaction open, so that the other delivery
                    // arrives while this one is still uncommitted.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    sqlx::query("INSERT INTO ledger (event_id, amount) VALUES ($1, 1)")
                        .bind(event_id)
                        .execute(&mut *tx)
                        .await?;
                    Ok(())
                },
            )
            .await
        }));
    }
    let mut ran = 0;
    for delivery in deliveries {
        ran += usize::from(delivery.await.unwrap().unwrap().is_some());
    }

    assert_eq!(ran, 1, "exactly one delivery ran the work");
    assert_eq!(count(&db, "SELECT count(*) FROM ledger").await, 1);
}

#[tokio::test]
async fn failed_work_records_nothing_and_the_retry_runs_it() {
    let db = ledger_database().await;
    let event_id = Uuid::now_v7();

    let failed = inbox::once(
        &Transactor::new(db.pool.clone()),
        "ledger",
        event_id,
        None,
        async |tx| {
            sqlx::query("INSERT INTO ledger (event_id, amount) VALUES ($1, 1)")
                .bind(event_id)
                .execute(&mut *tx)
                .await?;
            Err::<(), _>(anyhow::anyhow!("the payment service is down"))
        },
    )
    .await;
    assert!(failed.is_err());
    assert_eq!(count(&db, "SELECT count(*) FROM inbox_processed").await, 0);
    assert_eq!(count(&db, "SELECT count(*) FROM ledger").await, 0);

    let retried = inbox::once(
        &Transactor::new(db.pool.clone()),
        "ledger",
        event_id,
        None,
        async |_tx| Ok(7),
    )
    .await;
    assert_eq!(retried.unwrap(), Some(7));
    let again = inbox::once(
        &Transactor::new(db.pool.clone()),
        "ledger",
        event_id,
        None,
        async |_tx| Ok(7),
    )
    .await;
    assert_eq!(again.unwrap(), None);
}

#[tokio::test]
async fn each_listener_has_its_own_record_of_an_event() {
    let db = TestDatabase::migrated().await;
    let event_id = Uuid::now_v7();
    for listener in ["ledger", "email"] {
        let ran = inbox::once(
            &Transactor::new(db.pool.clone()),
            listener,
            event_id,
            None,
            async |_tx| Ok(()),
        )
        .await;
        assert_eq!(ran.unwrap(), Some(()), "{listener}");
    }
}

#[tokio::test]
async fn cleanup_deletes_only_expired_records() {
    let db = TestDatabase::migrated().await;
    sqlx::query(
        "INSERT INTO inbox_processed (listener, event_id, processed_at) \
         SELECT 'ledger', gen_random_uuid(), now() - interval '8 days' FROM generate_series(1, 2500)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let fresh = Uuid::now_v7();
    inbox::once(
        &Transactor::new(db.pool.clone()),
        "ledger",
        fresh,
        None,
        async |_tx| Ok(()),
    )
    .await
    .unwrap();

    let deleted = inbox::delete_expired(&db.pool, Duration::from_secs(7 * 24 * 3600))
        .await
        .unwrap();

    assert_eq!(deleted, 2500, "in batches of {}", inbox::CLEANUP_BATCH);
    let left: Vec<Uuid> = sqlx::query_scalar("SELECT event_id FROM inbox_processed")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, [fresh]);
}

/// `once` commits through the transactor, so its after-commit hook (the
/// relay's wake-up) fires when the work commits, and only then: not for a
/// duplicate delivery, not for a failure.
#[tokio::test]
async fn a_commit_in_once_runs_the_transactors_after_commit_hook() {
    let db = ledger_database().await;
    let commits = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&commits);
    let transactor = Transactor::new(db.pool.clone()).after_commit(move || {
        counted.fetch_add(1, Ordering::SeqCst);
    });
    let event_id = Uuid::now_v7();

    let failed = inbox::once(&transactor, "ledger", event_id, None, async |_tx| {
        Err::<(), _>(anyhow::anyhow!("the work failed"))
    })
    .await;
    assert!(failed.is_err());
    assert_eq!(commits.load(Ordering::SeqCst), 0, "a failure committed");

    let ran = inbox::once(&transactor, "ledger", event_id, None, async |_tx| Ok(1)).await;
    assert_eq!(ran.unwrap(), Some(1));
    assert_eq!(commits.load(Ordering::SeqCst), 1, "the commit ran no hook");

    let again = inbox::once(&transactor, "ledger", event_id, None, async |_tx| Ok(1)).await;
    assert_eq!(again.unwrap(), None);
    assert_eq!(
        commits.load(Ordering::SeqCst),
        1,
        "a skipped duplicate ran the hook"
    );
}

/// The relay's wake-up (`after_events`) follows only the commits that
/// stored events, in `Transactor::run` and in `once` alike: a listener's
/// transaction that dispatches nothing wakes no relay (each wake-up is a
/// relay round, and with `OUTBOX_WAKE=valkey` a `PUBLISH`), while every
/// commit still runs `after_commit`.
#[tokio::test]
async fn only_a_commit_that_stored_events_wakes_the_relays() {
    let db = ledger_database().await;
    let (commits, wakes) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let transactor = Transactor::new(db.pool.clone())
        .after_commit({
            let commits = Arc::clone(&commits);
            move || {
                commits.fetch_add(1, Ordering::SeqCst);
            }
        })
        .after_events({
            let wakes = Arc::clone(&wakes);
            move || {
                wakes.fetch_add(1, Ordering::SeqCst);
            }
        });
    let counts = || (commits.load(Ordering::SeqCst), wakes.load(Ordering::SeqCst));

    transactor
        .run(async |tx| {
            sqlx::query("INSERT INTO ledger VALUES ($1, 1)")
                .bind(Uuid::now_v7())
                .execute(&mut *tx)
                .await?;
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(counts(), (1, 0), "a commit without events woke the relays");

    transactor
        .run(async |tx| {
            crate::dispatch(&mut *tx, &PaymentTaken { amount: 1 }).await?;
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(counts(), (2, 1), "a commit with an event did not wake them");

    let quiet = inbox::once(&transactor, "ledger", Uuid::now_v7(), None, async |_tx| {
        Ok(())
    })
    .await;
    assert_eq!(quiet.unwrap(), Some(()));
    assert_eq!(counts(), (3, 1), "once without events woke the relays");

    let follow_up = inbox::once(&transactor, "ledger", Uuid::now_v7(), None, async |tx| {
        crate::dispatch(&mut *tx, &ReceiptSent { amount: 1 }).await?;
        Ok(())
    })
    .await;
    assert_eq!(follow_up.unwrap(), Some(()));
    assert_eq!(counts(), (4, 2), "once with an event did not wake them");

    // A dispatch rolled back with its transaction wakes nothing.
    let failed: anyhow::Result<()> = transactor
        .run(async |tx| {
            crate::dispatch(&mut *tx, &PaymentTaken { amount: 2 }).await?;
            anyhow::bail!("the work failed")
        })
        .await;
    assert!(failed.is_err());
    assert_eq!(counts(), (4, 2), "a rolled-back dispatch woke the relays");
}

/// With SeaORM, a listener that takes an `OrmListenerContext` gets a SeaORM
/// transaction in `ctx.once`: its work and the events it dispatches there
/// commit once per event, a failure rolls both back, and the commit runs
/// the transactor's after-commit hook.
#[cfg(feature = "seaorm")]
#[tokio::test]
async fn a_seaorm_listener_commits_its_work_and_follow_up_once() {
    use crate::worker::listeners::OrmListenerContext;
    use sea_orm::{ConnectionTrait, Statement};

    let db = ledger_database().await;
    let runs = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&runs);
    let mut listeners = Listeners::new();
    listeners.listen(
        "ledger",
        move |event: PaymentTaken, ctx: OrmListenerContext| {
            let runs = Arc::clone(&counted);
            async move {
                ctx.once(async |tx| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    let insert = Statement::from_sql_and_values(
                        tx.get_database_backend(),
                        "INSERT INTO ledger (event_id, amount) VALUES ($1, $2)",
                        [ctx.event_id().into(), event.amount.into()],
                    );
                    tx.execute(insert).await?;
                    crate::dispatch(
                        tx,
                        &ReceiptSent {
                            amount: event.amount,
                        },
                    )
                    .await?;
                    if event.amount < 0 {
                        anyhow::bail!("a negative amount");
                    }
                    Ok(())
                })
                .await?;
                Ok(())
            }
        },
    );
    let listener = &listeners.of(PaymentTaken::NAME)[0];
    let commits = Arc::new(AtomicU32::new(0));
    let hooked = Arc::clone(&commits);
    let transactor = Transactor::new(db.pool.clone()).after_commit(move || {
        hooked.fetch_add(1, Ordering::SeqCst);
    });

    let envelope = Envelope::new(PaymentTaken::NAME, serde_json::json!({ "amount": 42 }));
    for _ in 0..2 {
        listener
            .call(envelope.clone(), Default::default(), transactor.clone())
            .await
            .unwrap();
    }
    let failing = Envelope::new(PaymentTaken::NAME, serde_json::json!({ "amount": -1 }));
    let failed = listener
        .call(failing, Default::default(), transactor.clone())
        .await;

    assert!(failed.is_err());
    assert_eq!(runs.load(Ordering::SeqCst), 2, "once, and the failing run");
    assert_eq!(commits.load(Ordering::SeqCst), 1);
    assert_eq!(count(&db, "SELECT count(*) FROM ledger").await, 1);
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM outbox_events WHERE event_name = 'receiptSent'"
        )
        .await,
        1
    );
    assert_eq!(count(&db, "SELECT count(*) FROM inbox_processed").await, 1);
}
