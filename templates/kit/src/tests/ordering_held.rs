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

/// Key `key`'s steps 1 to 3 dispatched; the worker runs until step 2 of
/// each of `keys` holds its key.
async fn hold_keys(db: &TestDatabase, queue: &TestQueue, keys: &[u32]) -> Vec<String> {
    let running = Running::start(queue, &db.pool, refusing_step_2_of_every_key());
    for &key in keys {
        for n in 1..=3 {
            dispatch(&db.pool, &Placed { key, n }).await.unwrap();
        }
    }
    publish_shuffled(&db.pool, queue, &mut fastrand::Rng::with_seed(7)).await;
    eventually(Duration::from_secs(20), "every key held", || async {
        failures(&db.pool).await.len() == keys.len()
    })
    .await;
    running.stop().await;
    failures(&db.pool)
        .await
        .into_iter()
        .map(|(task_id, _)| task_id)
        .collect()
}

/// An ordered `ledger` refusing step 2 of every key while `REFUSING`.
fn refusing_step_2_of_every_key() -> Listeners {
    let mut listeners = Listeners::new();
    listeners.listen_with(
        "ledger",
        ListenerOptions::new().ordered(),
        |event: Placed, context: ListenerContext| async move {
            if event.n == 2 && REFUSING.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(SkipRetry("step 2 is refused".into()).into());
            }
            record(&context, event.key, event.n).await
        },
    );
    listeners
}

/// Whether [`refusing_step_2_of_every_key`] refuses (its tests run one at
/// a time in a process: each sets it before its worker starts).
static REFUSING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);
static REFUSING_TESTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn held_keys_do_not_keep_the_look_at_old_heads_from_the_others() {
    // Arrange: three keys held by a failed step 2 each, and a fourth key's
    // head whose task the queue lost after them (so it is the newest head).
    let _one_at_a_time = REFUSING_TESTS.lock().await;
    REFUSING.store(true, std::sync::atomic::Ordering::SeqCst);
    let db = TestDatabase::migrated().await;
    sqlx::query(SEEN).execute(&db.pool).await.unwrap();
    let queue = TestQueue::new().await;
    hold_keys(&db, &queue, &[1, 2, 3]).await;
    let ordering = chains(&db.pool, &queue);
    // Key 4's step 1 fanned out, its task then lost.
    dispatch(&db.pool, &Placed { key: 4, n: 1 }).await.unwrap();
    let listeners = refusing_step_2_of_every_key();
    let rows: Vec<uuid::Uuid> = sqlx::query_scalar(
        "UPDATE outbox_events SET published_at = now() WHERE published_at IS NULL RETURNING event_id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let event = crate::follow::rows::by_ids(&db.pool, &rows)
        .await
        .unwrap()
        .remove(0);
    let task = crate::outbox::relay::event_task(
        &event.envelope(),
        event.id.to_string(),
        &queue.name,
        Duration::from_secs(60),
    );
    crate::worker::fan_out(
        &ordering,
        &listeners,
        crate::queue::Task::from(&task.to_message().unwrap()),
    )
    .await
    .unwrap();
    let run = crate::worker::task_names::listener_task_id(event.id, "ledger").to_string();
    let mut conn = queue.connection().await;
    let () = redis::pipe()
        .del(crate::queue::keys::task(&queue.name, &run))
        .ignore()
        .lrem(crate::queue::keys::pending(&queue.name), 0, &run)
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();

    // Act: two looks of two heads each (the held heads are the oldest).
    let ordered = listeners.ordered();
    for _ in 0..2 {
        ordering
            .look_at_old_heads_by(Duration::ZERO, &ordered, 2)
            .await
            .unwrap();
    }

    // Assert: key 4's head is queued again.
    assert_eq!(queue.pending_ids().await, vec![run]);
}

#[tokio::test]
async fn outbox_skip_refuses_a_run_sent_back_that_has_not_failed_again() {
    // Arrange: step 2 holds key 1; asynqmon's "run" sends it back (its
    // failure record stays until it succeeds); no worker runs.
    let _one_at_a_time = REFUSING_TESTS.lock().await;
    REFUSING.store(true, std::sync::atomic::Ordering::SeqCst);
    let db = TestDatabase::migrated().await;
    sqlx::query(SEEN).execute(&db.pool).await.unwrap();
    let queue = TestQueue::new().await;
    let held = hold_keys(&db, &queue, &[1]).await.remove(0);
    queue.client.run_task(&queue.name, &held).await.unwrap();
    let mut config = crate::testing::config(&db.url());
    config.valkey.addr = Some(valkey_addr());
    config.outbox.queues = queue.name.parse().unwrap();
    config.worker.queues = queue.name.parse().unwrap();
    let context = crate::follow::Context::new(config, Listeners::new());

    // Act
    let skip = crate::operations::skip::Args {
        task_id: held.clone(),
    };
    let refused =
        crate::operations::skip::run(&context, &skip, crate::operations::output::Format::Text)
            .await;

    // Assert: refused, and the key still held by it.
    let refused = refused.unwrap_err().to_string();
    assert!(refused.contains("has not failed for good"), "{refused}");
    let standing = chains(&db.pool, &queue);
    assert_eq!(
        standing
            .position(&queue.name, "ledger", "order:1", &held)
            .await
            .unwrap(),
        Some(0)
    );
}

#[tokio::test]
async fn a_held_run_the_queue_lost_and_the_worker_queued_again_forgets_its_failure_when_it_succeeds()
 {
    // Arrange: step 2 holds key 1; its archived task is deleted (asynqmon's
    // "delete"); the worker's look queues it again from the chain.
    let _one_at_a_time = REFUSING_TESTS.lock().await;
    REFUSING.store(true, std::sync::atomic::Ordering::SeqCst);
    let db = TestDatabase::migrated().await;
    sqlx::query(SEEN).execute(&db.pool).await.unwrap();
    let queue = TestQueue::new().await;
    let held = hold_keys(&db, &queue, &[1]).await.remove(0);
    let mut conn = queue.connection().await;
    let () = redis::pipe()
        .del(crate::queue::keys::task(&queue.name, &held))
        .ignore()
        .zrem(crate::queue::keys::archived(&queue.name), &held)
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();
    let ordering = chains(&db.pool, &queue);
    ordering
        .look_at_old_heads(Duration::ZERO, &refusing_step_2_of_every_key().ordered())
        .await
        .unwrap();

    // Act: the cause fixed, it runs.
    REFUSING.store(false, std::sync::atomic::Ordering::SeqCst);
    let running = Running::start(&queue, &db.pool, refusing_step_2_of_every_key());
    eventually(Duration::from_secs(20), "steps 2 and 3", || async {
        seen(&db.pool).await.get(&1).map(Vec::len) == Some(3)
    })
    .await;
    eventually(Duration::from_secs(20), "its failure forgotten", || async {
        failures(&db.pool).await.is_empty()
    })
    .await;
    running.stop().await;
    REFUSING.store(true, std::sync::atomic::Ordering::SeqCst);

    // Assert
    assert_eq!(seen(&db.pool).await.get(&1), Some(&vec![1, 2, 3]));
    assert_eq!(ordering.held().await.unwrap(), Held::default());
}
