//! Ordered keys when Valkey loses writes, against real Postgres and Valkey:
//! the last writes of a restart or a failover (a consistent prefix kept:
//! the README's recovery, `outbox replay --lost`), the chains alone (a key
//! deleted by hand, eviction), the queue's task keys alone.

#![cfg(feature = "worker")]

use std::time::Duration;

use sqlx::PgPool;

use super::ordering::{
    Placed, Running, SEEN, chains, ordered_ledger, publish_shuffled, record, seen,
};
use super::support::{TestDatabase, TestQueue, eventually, valkey_addr};
use crate::outbox::dispatch;
use crate::queue::SkipRetry;
use crate::worker::listeners::{ListenerContext, ListenerOptions, Listeners};
use crate::worker::ordering::Held;

/// Every run of the listener, in the order they began: its step.
const RUNS: &str = "CREATE TABLE runs (id bigserial PRIMARY KEY, n int NOT NULL)";

/// An ordered `ledger` that logs each run's step in `runs`, and records
/// its work once; it refuses (`SkipRetry`) step `refused`, if any, until
/// `refusing` is cleared.
fn logging_ledger(
    refusing: Option<(u32, std::sync::Arc<std::sync::atomic::AtomicBool>)>,
) -> Listeners {
    let mut listeners = Listeners::new();
    listeners.listen_with(
        "ledger",
        ListenerOptions::new().ordered(),
        move |event: Placed, context: ListenerContext| {
            let refuse = refusing.as_ref().is_some_and(|(n, on)| {
                *n == event.n && on.load(std::sync::atomic::Ordering::SeqCst)
            });
            async move {
                sqlx::query("INSERT INTO runs (n) VALUES ($1)")
                    .bind(event.n as i32)
                    .execute(context.pool())
                    .await?;
                if refuse {
                    return Err(SkipRetry(format!("step {} is refused", event.n)).into());
                }
                record(&context, event.key, event.n).await
            }
        },
    );
    listeners
}

/// The steps the listener began, in order, after run `after` of the log.
async fn runs_after(pool: &PgPool, after: i64) -> Vec<i32> {
    sqlx::query_scalar("SELECT n FROM runs WHERE id > $1 ORDER BY id")
        .bind(after)
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn last_run(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT coalesce(max(id), 0) FROM runs")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Key 1's steps `steps`, dispatched.
async fn dispatch_steps(pool: &PgPool, steps: std::ops::RangeInclusive<u32>) {
    for n in steps {
        dispatch(pool, &Placed { key: 1, n }).await.unwrap();
    }
}

/// Marks the unpublished rows published; their event tasks, as a worker
/// takes them from `queue` (not queued).
async fn published_tasks(pool: &PgPool, queue: &TestQueue) -> Vec<crate::queue::Task> {
    let ids: Vec<uuid::Uuid> = sqlx::query_scalar(
        "UPDATE outbox_events SET published_at = now() WHERE published_at IS NULL RETURNING event_id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let events = crate::follow::rows::by_ids(pool, &ids).await.unwrap();
    let mut tasks: Vec<crate::queue::Task> = events
        .iter()
        .map(|event| {
            let task = crate::outbox::relay::event_task(
                &event.envelope(),
                event.id.to_string(),
                &queue.name,
                Duration::from_secs(60),
            );
            crate::queue::Task::from(&task.to_message().unwrap())
        })
        .collect();
    tasks.sort_by_key(|task| task.id.clone());
    tasks
}

/// The service's `outbox` context on `db` and `queue`.
fn context(db: &TestDatabase, queue: &TestQueue) -> crate::follow::Context {
    let mut config = crate::testing::config(&db.url());
    config.valkey.addr = Some(valkey_addr());
    config.outbox.queues = queue.name.parse().unwrap();
    config.worker.queues = queue.name.parse().unwrap();
    crate::follow::Context::new(config, logging_ledger(None))
}

/// `outbox replay --lost --since <since> --yes`.
async fn replay_lost(context: &crate::follow::Context, since: chrono::DateTime<chrono::Utc>) {
    let args = crate::operations::replay::Args {
        ids: Vec::new(),
        name: None,
        since: Some(since),
        until: None,
        listener: None,
        lost: true,
        yes: true,
    };
    crate::operations::replay::run(context, &args, crate::operations::output::Format::Text)
        .await
        .unwrap();
}

/// What Valkey holds of `queue` (its tasks and its chains): each key's
/// dump and time to live.
async fn snapshot(queue: &TestQueue) -> Vec<(String, Vec<u8>, i64)> {
    let mut conn = queue.connection().await;
    let mut keys: Vec<String> = Vec::new();
    for pattern in [
        format!("{}*", crate::queue::keys::queue_prefix(&queue.name)),
        format!("ordered:{{{}}}:*", queue.name),
    ] {
        let found: Vec<String> = redis::cmd("KEYS")
            .arg(pattern)
            .query_async(&mut conn)
            .await
            .unwrap();
        keys.extend(found);
    }
    let mut dumps = Vec::new();
    for key in keys {
        let (dump, ttl): (Vec<u8>, i64) = redis::pipe()
            .cmd("DUMP")
            .arg(&key)
            .cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        dumps.push((key, dump, ttl));
    }
    dumps
}

/// Valkey back to `snapshot`: every write since it lost, as a restart with
/// `appendfsync everysec` or a failover loses the last ones.
async fn restore(queue: &TestQueue, snapshot: &[(String, Vec<u8>, i64)]) {
    queue.delete_keys();
    queue.delete_chains();
    let mut conn = queue.connection().await;
    for (key, dump, ttl) in snapshot {
        let () = redis::cmd("RESTORE")
            .arg(key)
            .arg(ttl.max(&0))
            .arg(dump)
            .arg("REPLACE")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn after_valkey_loses_its_last_writes_the_recovery_runs_what_it_lost_in_order_and_nothing_it_kept()
 {
    // Arrange: key 1's steps 1 to 6 run; Valkey keeps that (the snapshot).
    // Steps 7 and 8 run; then Valkey restarts without them (and without
    // their runs, whose completions it lost too). Step 9 comes after.
    let db = TestDatabase::migrated().await;
    for table in [SEEN, RUNS] {
        sqlx::query(table).execute(&db.pool).await.unwrap();
    }
    let queue = TestQueue::new().await;
    let listeners = logging_ledger(None);
    let running = Running::start(&queue, &db.pool, listeners.clone());
    dispatch_steps(&db.pool, 1..=4).await;
    let since = chrono::Utc::now();
    dispatch_steps(&db.pool, 5..=6).await;
    publish_shuffled(&db.pool, &queue, &mut fastrand::Rng::with_seed(41)).await;
    eventually(Duration::from_secs(20), "steps 1 to 6", || async {
        seen(&db.pool).await.get(&1).map(Vec::len) == Some(6)
    })
    .await;
    running.stop().await;
    let kept = snapshot(&queue).await;
    let running = Running::start(&queue, &db.pool, listeners.clone());
    dispatch_steps(&db.pool, 7..=8).await;
    publish_shuffled(&db.pool, &queue, &mut fastrand::Rng::with_seed(42)).await;
    eventually(Duration::from_secs(20), "steps 7 and 8", || async {
        seen(&db.pool).await.get(&1).map(Vec::len) == Some(8)
    })
    .await;
    running.stop().await;
    restore(&queue, &kept).await;
    let before_recovery = last_run(&db.pool).await;

    // Act: the README's recovery, from before step 5; then step 9.
    let running = Running::start(&queue, &db.pool, listeners);
    replay_lost(&context(&db, &queue), since).await;
    dispatch_steps(&db.pool, 9..=9).await;
    publish_shuffled(&db.pool, &queue, &mut fastrand::Rng::with_seed(43)).await;
    eventually(Duration::from_secs(20), "step 9", || async {
        runs_after(&db.pool, before_recovery).await.contains(&9)
    })
    .await;
    running.stop().await;

    // Assert: what Valkey kept did not run again (steps 5 and 6); what it
    // lost ran again, in order, before step 9; each step's work once.
    assert_eq!(runs_after(&db.pool, before_recovery).await, vec![7, 8, 9]);
    assert_eq!(seen(&db.pool).await.get(&1), Some(&(1..=9).collect()));
    assert_eq!(
        chains(&db.pool, &queue).held().await.unwrap(),
        Held::default()
    );
}

#[tokio::test]
async fn after_valkey_loses_the_chains_alone_the_recovery_runs_the_runs_that_waited_in_them() {
    // Arrange: key 1's step 2 holds its key (refused); steps 3 and 4 wait
    // behind it in its chain. Then Valkey loses the chains alone (a key
    // deleted by hand, eviction): the runs that waited, and the key's
    // number.
    let db = TestDatabase::migrated().await;
    for table in [SEEN, RUNS] {
        sqlx::query(table).execute(&db.pool).await.unwrap();
    }
    let queue = TestQueue::new().await;
    let refusing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let running = Running::start(
        &queue,
        &db.pool,
        logging_ledger(Some((2, refusing.clone()))),
    );
    let since = chrono::Utc::now();
    dispatch_steps(&db.pool, 1..=4).await;
    publish_shuffled(&db.pool, &queue, &mut fastrand::Rng::with_seed(44)).await;
    let chains = chains(&db.pool, &queue);
    eventually(
        Duration::from_secs(20),
        "step 2 to hold the key",
        || async {
            chains.held().await.unwrap()
                == Held {
                    blocked_keys: 1,
                    waiting_runs: 2,
                    waiting_events: 0,
                }
        },
    )
    .await;
    queue.delete_chains();

    // Act: the cause fixed, the failed run sent back (it joins its key's
    // order anew), and the README's recovery.
    refusing.store(false, std::sync::atomic::Ordering::SeqCst);
    let context = context(&db, &queue);
    let args = crate::operations::retry_archived::Args {
        listener: None,
        since: None,
        include_cancelled: false,
    };
    crate::operations::retry_archived::run(
        &context,
        &args,
        crate::operations::output::Format::Text,
    )
    .await
    .unwrap();
    replay_lost(&context, since).await;
    eventually(Duration::from_secs(20), "steps 2 to 4", || async {
        seen(&db.pool).await.get(&1).map(Vec::len) == Some(4)
    })
    .await;
    running.stop().await;

    // Assert: each step's work once, in order; nothing waits.
    assert_eq!(seen(&db.pool).await.get(&1), Some(&vec![1, 2, 3, 4]));
    assert_eq!(chains.held().await.unwrap(), Held::default());
}

#[tokio::test]
async fn after_valkey_loses_the_queue_alone_the_heads_come_back_and_the_recovery_brings_the_rest() {
    // Arrange: key 1's steps 1 to 3 fanned out (step 1 the head, queued;
    // 2 and 3 behind it) and step 4 published but not fanned out; no worker
    // runs. Then Valkey loses the queue's task keys alone.
    let db = TestDatabase::migrated().await;
    for table in [SEEN, RUNS] {
        sqlx::query(table).execute(&db.pool).await.unwrap();
    }
    let queue = TestQueue::new().await;
    let listeners = ordered_ledger();
    let since = chrono::Utc::now();
    dispatch_steps(&db.pool, 1..=3).await;
    let ordering = chains(&db.pool, &queue);
    for task in published_tasks(&db.pool, &queue).await {
        crate::worker::fan_out(&ordering, &listeners, task)
            .await
            .unwrap();
    }
    assert_eq!(ordering.held().await.unwrap().waiting_runs, 2);
    dispatch_steps(&db.pool, 4..=4).await;
    publish_shuffled(&db.pool, &queue, &mut fastrand::Rng::with_seed(46)).await;
    queue.delete_keys();

    // Act: a worker runs, looks at its old heads, and the README's recovery
    // queues again what the queue lost.
    let running = Running::start(&queue, &db.pool, listeners.clone());
    let looked = chains(&db.pool, &queue)
        .look_at_old_heads(Duration::ZERO, &listeners.ordered())
        .await
        .unwrap();
    replay_lost(&context(&db, &queue), since).await;
    eventually(Duration::from_secs(20), "steps 1 to 4", || async {
        seen(&db.pool).await.get(&1).map(Vec::len) == Some(4)
    })
    .await;
    running.stop().await;

    // Assert
    assert_eq!(looked, 1, "the head the queue lost");
    assert_eq!(seen(&db.pool).await.get(&1), Some(&vec![1, 2, 3, 4]));
    assert_eq!(
        chains(&db.pool, &queue).held().await.unwrap(),
        Held::default()
    );
}
