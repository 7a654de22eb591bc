//! What a failure keeps, and for how long, against real Postgres and
//! Valkey: only a run that holds its key keeps its key's events from the
//! cleanup and `outbox purge`; failures that hold nothing expire; the
//! chains of a listener no worker orders any more are released after a
//! grace period.

#![cfg(feature = "worker")]

use std::time::Duration;

use sqlx::PgPool;

use super::ordering::{Placed, Running, SEEN, chains, publish_shuffled, record, seen};
use super::support::{TestDatabase, TestQueue, eventually, valkey_addr};
use crate::outbox::dispatch;
use crate::queue::SkipRetry;
use crate::worker::listeners::{ListenerContext, ListenerOptions, Listeners, OnFailure};
use crate::worker::ordering::Held;

/// `ledger` (ordered, `on_failure`; or unordered) refusing step 2 of key 1,
/// recording the others.
fn refusing_step_2(ordered: Option<OnFailure>) -> Listeners {
    let options = match ordered {
        Some(on_failure) => ListenerOptions::new().ordered().on_failure(on_failure),
        None => ListenerOptions::new(),
    };
    let mut listeners = Listeners::new();
    listeners.listen_with(
        "ledger",
        options,
        |event: Placed, context: ListenerContext| async move {
            if (event.key, event.n) == (1, 2) {
                return Err(SkipRetry("step 2 is refused".into()).into());
            }
            record(&context, event.key, event.n).await
        },
    );
    listeners
}

/// Key 1's steps 1 to 3, run by `listeners` until step 2's failure is
/// recorded and the others ran as they may.
async fn run_three_steps(db: &TestDatabase, queue: &TestQueue, listeners: Listeners, ran: usize) {
    let running = Running::start(queue, &db.pool, listeners);
    for n in 1..=3 {
        dispatch(&db.pool, &Placed { key: 1, n }).await.unwrap();
    }
    publish_shuffled(&db.pool, queue, &mut fastrand::Rng::with_seed(6)).await;
    eventually(
        Duration::from_secs(20),
        "step 2's failure and the runs",
        || async {
            failures(&db.pool).await.len() == 1
                && seen(&db.pool).await.get(&1).map_or(0, Vec::len) == ran
        },
    )
    .await;
    running.stop().await;
}

/// `(task id, holds its key)` of each failure recorded.
async fn failures(pool: &PgPool) -> Vec<(String, bool)> {
    sqlx::query_as("SELECT task_id, holds_key FROM listener_failures")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// The steps of key 1 the outbox still has.
async fn kept(pool: &PgPool) -> Vec<i32> {
    sqlx::query_scalar(
        "SELECT (payload ->> 'n')::int FROM outbox_events WHERE payload ->> 'key' = '1' ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// The cleanup, as if every row were past the retention.
async fn clean_up(pool: &PgPool) {
    crate::outbox::cleanup::delete_expired(pool, Duration::ZERO)
        .await
        .unwrap();
}

#[tokio::test]
async fn only_a_failure_that_holds_its_key_keeps_its_keys_events() {
    // Arrange: three services' worth of the same failure of step 2 (key 1):
    // an ordered listener that holds its key, one that moves on, and one
    // not ordered.
    let mut after_cleanup = Vec::new();
    for (ordered, ran) in [
        (Some(OnFailure::HoldKey), 1),
        (Some(OnFailure::MoveOn), 2),
        (None, 2),
    ] {
        let db = TestDatabase::migrated().await;
        sqlx::query(SEEN).execute(&db.pool).await.unwrap();
        let queue = TestQueue::new().await;
        run_three_steps(&db, &queue, refusing_step_2(ordered), ran).await;

        // Act
        let recorded = failures(&db.pool).await;
        clean_up(&db.pool).await;
        after_cleanup.push((ordered, recorded[0].1, kept(&db.pool).await));
    }

    // Assert
    assert_eq!(
        after_cleanup,
        vec![
            (Some(OnFailure::HoldKey), true, vec![2, 3]),
            (Some(OnFailure::MoveOn), false, vec![]),
            (None, false, vec![]),
        ]
    );
}

#[tokio::test]
async fn a_key_moved_past_keeps_nothing_and_its_failure_expires() {
    // Arrange: step 2 holds key 1; the operator skips it.
    let db = TestDatabase::migrated().await;
    sqlx::query(SEEN).execute(&db.pool).await.unwrap();
    let queue = TestQueue::new().await;
    let listeners = refusing_step_2(Some(OnFailure::HoldKey));
    run_three_steps(&db, &queue, listeners.clone(), 1).await;
    let mut config = crate::testing::config(&db.url());
    config.valkey.addr = Some(valkey_addr());
    config.outbox.queues = queue.name.parse().unwrap();
    config.worker.queues = queue.name.parse().unwrap();
    let context = crate::follow::Context::new(config, Listeners::new());
    let (task_id, _) = failures(&db.pool).await.remove(0);
    let kept_while_held = {
        clean_up(&db.pool).await;
        kept(&db.pool).await
    };
    let expired_while_held = crate::worker::failures::delete_expired(&db.pool, Duration::ZERO)
        .await
        .unwrap();

    // Act
    let skip = crate::operations::skip::Args {
        task_id: task_id.clone(),
    };
    crate::operations::skip::run(&context, &skip, crate::operations::output::Format::Text)
        .await
        .unwrap();
    let after_skip = failures(&db.pool).await;
    clean_up(&db.pool).await;
    let kept_after_skip = kept(&db.pool).await;
    let expired = crate::worker::failures::delete_expired(&db.pool, Duration::ZERO)
        .await
        .unwrap();

    // Assert
    assert_eq!(kept_while_held, vec![2, 3]);
    assert_eq!(
        expired_while_held, 0,
        "a failure that holds its key does not expire"
    );
    assert_eq!(after_skip, vec![(task_id, false)]);
    assert_eq!(kept_after_skip, Vec::<i32>::new());
    assert_eq!(expired, 1);
    assert!(failures(&db.pool).await.is_empty());
}

#[tokio::test]
async fn outbox_purge_keeps_a_held_keys_events_unless_told() {
    // Arrange: step 2 holds key 1.
    let db = TestDatabase::migrated().await;
    sqlx::query(SEEN).execute(&db.pool).await.unwrap();
    let queue = TestQueue::new().await;
    run_three_steps(&db, &queue, refusing_step_2(Some(OnFailure::HoldKey)), 1).await;
    let context = crate::follow::Context::new(crate::testing::config(&db.url()), Listeners::new());
    let purge = |include_held| crate::operations::purge::Args {
        published_before: chrono::Utc::now() + chrono::TimeDelta::seconds(1),
        batch_size: 100,
        include_held,
        yes: true,
    };
    let json = crate::operations::output::Format::Json;

    // Act
    crate::operations::purge::run(&context, &purge(false), json)
        .await
        .unwrap();
    let kept_by_default = kept(&db.pool).await;
    crate::operations::purge::run(&context, &purge(true), json)
        .await
        .unwrap();

    // Assert
    assert_eq!(kept_by_default, vec![2, 3]);
    assert_eq!(kept(&db.pool).await, Vec::<i32>::new());
}

#[tokio::test]
async fn a_listener_no_longer_ordered_has_its_chains_released_after_the_grace() {
    // Arrange: step 2 holds key 1, step 3 waits behind it; the listener is
    // then deployed unordered.
    let db = TestDatabase::migrated().await;
    sqlx::query(SEEN).execute(&db.pool).await.unwrap();
    let queue = TestQueue::new().await;
    run_three_steps(&db, &queue, refusing_step_2(Some(OnFailure::HoldKey)), 1).await;
    let unordered = refusing_step_2(None);
    let ordering = chains(&db.pool, &queue);
    let orphans = ordering.orphans(&unordered.ordered()).await.unwrap();

    // Act: the worker's look marks the listener, and releases its chains
    // once the grace is over.
    let running = Running::start(&queue, &db.pool, unordered.clone());
    let within_grace = ordering
        .release_orphans(&unordered.ordered(), Duration::from_secs(3600))
        .await
        .unwrap();
    let held_within_grace = ordering.held().await.unwrap();
    let released = ordering
        .release_orphans(&unordered.ordered(), Duration::ZERO)
        .await
        .unwrap();
    eventually(Duration::from_secs(20), "step 3 to run", || async {
        seen(&db.pool).await.get(&1).map(Vec::len) == Some(2)
    })
    .await;
    running.stop().await;

    // Assert
    assert_eq!(orphans, vec![(queue.name.clone(), "ledger".to_string(), 1)]);
    assert_eq!(within_grace, 0);
    assert_eq!(held_within_grace.waiting_runs, 1, "kept within the grace");
    assert_eq!(released, 2, "the failed head and the run behind it");
    assert_eq!(seen(&db.pool).await.get(&1), Some(&vec![1, 3]));
    assert_eq!(ordering.held().await.unwrap(), Held::default());
    assert!(
        ordering
            .orphans(&unordered.ordered())
            .await
            .unwrap()
            .is_empty()
    );
}
