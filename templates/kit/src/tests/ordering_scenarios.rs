//! Ordered listeners under what operators, neighbours and partial failures
//! do to them, against real Postgres and Valkey: a run moved past and sent
//! back, another service's events, a worker whose lease another worker took
//! over while it still ran.

#![cfg(feature = "worker")]

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::ordering::{
    Placed, Running, SEEN, chains, dispatch_step, event_task, ordered_ledger, publish_shuffled,
    record, seen,
};
use super::support::{TestDatabase, TestQueue, eventually};
use crate::outbox::dispatch;
use crate::queue::{Consumer, ConsumerOptions, SkipRetry};
use crate::worker::listeners::{ListenerContext, ListenerOptions, Listeners, OnFailure};
use crate::worker::ordering::Held;
use crate::worker::task_names::listener_task_id;

/// An ordered `ledger` (`on_failure` when a run fails for good) that refuses
/// (`SkipRetry`) the steps of key 1 in `refused`, and records the others.
fn refusing_ledger(on_failure: OnFailure, refused: Arc<Mutex<HashSet<u32>>>) -> Listeners {
    let mut listeners = Listeners::new();
    listeners.listen_with(
        "ledger",
        ListenerOptions::new().ordered().on_failure(on_failure),
        move |event: Placed, context: ListenerContext| {
            let refuse = event.key == 1 && refused.lock().unwrap().contains(&event.n);
            async move {
                if refuse {
                    return Err(SkipRetry(format!("step {} of key 1 is refused", event.n)).into());
                }
                record(&context, event.key, event.n).await
            }
        },
    );
    listeners
}

/// The service's configuration on `db` and `queue` (what the `outbox`
/// commands read).
fn config(db: &TestDatabase, queue: &TestQueue) -> crate::config::Config {
    let mut config = crate::testing::config(&db.url());
    config.valkey.addr = Some(super::support::valkey_addr());
    config.outbox.queues = queue.name.parse().unwrap();
    config.worker.queues = queue.name.parse().unwrap();
    config
}

/// The task ids in `listener_failures`, oldest first.
async fn failed_tasks(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar("SELECT task_id FROM listener_failures ORDER BY failed_at")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// `outbox retry-archived --listener ledger`.
async fn retry_archived(context: &crate::follow::Context) {
    let args = crate::operations::retry_archived::Args {
        listener: Some("ledger".into()),
        since: None,
        include_cancelled: false,
    };
    crate::operations::retry_archived::run(context, &args, crate::operations::output::Format::Text)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_run_skipped_then_sent_back_joins_its_keys_order_at_its_end_and_runs() {
    // Arrange: the listener refuses steps 1 and 2 of key 1. Step 1 holds the
    // key; the operator skips it (`outbox skip`), and step 2 holds it in turn.
    let db = TestDatabase::migrated().await;
    sqlx::query(SEEN).execute(&db.pool).await.unwrap();
    let queue = TestQueue::new().await;
    for n in 1..=2 {
        dispatch_step(&db.pool, 1, 2 * n - 1).await;
    }
    let refused = Arc::new(Mutex::new(HashSet::from([1, 3])));
    let running = Running::start(
        &queue,
        &db.pool,
        refusing_ledger(OnFailure::HoldKey, refused.clone()),
    );
    let context = crate::follow::Context::new(config(&db, &queue), Listeners::new());
    publish_shuffled(&db.pool, &queue, &mut fastrand::Rng::with_seed(1)).await;
    eventually(
        Duration::from_secs(20),
        "step 1 to hold its key",
        || async { failed_tasks(&db.pool).await.len() == 1 },
    )
    .await;
    let skipped = failed_tasks(&db.pool).await.remove(0);
    let skip = crate::operations::skip::Args {
        task_id: skipped.clone(),
    };
    crate::operations::skip::run(&context, &skip, crate::operations::output::Format::Text)
        .await
        .unwrap();
    eventually(
        Duration::from_secs(20),
        "step 3 to hold the key",
        || async { failed_tasks(&db.pool).await.len() == 2 },
    )
    .await;

    // Act: the cause is fixed, and the operator sends both back.
    refused.lock().unwrap().clear();
    retry_archived(&context).await;
    eventually(Duration::from_secs(20), "both steps to run", || async {
        seen(&db.pool).await.get(&1).map(Vec::len) == Some(2)
    })
    .await;
    running.stop().await;

    // Assert: the skipped step ran, after the step that held the key then.
    assert_eq!(seen(&db.pool).await.get(&1), Some(&vec![3, 1]));
    assert_eq!(
        chains(&db.pool, &queue).held().await.unwrap(),
        Held::default()
    );
    assert!(failed_tasks(&db.pool).await.is_empty());
}

#[tokio::test]
async fn a_run_a_listener_moved_past_runs_when_it_is_sent_back() {
    // Arrange: the listener moves on past a run that fails for good; key
    // 1's step 1 is refused, steps 3 and 5 run.
    let db = TestDatabase::migrated().await;
    sqlx::query(SEEN).execute(&db.pool).await.unwrap();
    let queue = TestQueue::new().await;
    for n in [1, 3, 5] {
        dispatch_step(&db.pool, 1, n).await;
    }
    let refused = Arc::new(Mutex::new(HashSet::from([1])));
    let listeners = refusing_ledger(OnFailure::MoveOn, refused.clone());
    let stop = CancellationToken::new();
    let consumer = super::ordering::worker(queue.client.clone(), &queue, &db.pool, listeners);
    let running = tokio::spawn(consumer.run(stop.clone().cancelled_owned()));
    let context = crate::follow::Context::new(config(&db, &queue), Listeners::new());
    publish_shuffled(&db.pool, &queue, &mut fastrand::Rng::with_seed(2)).await;
    eventually(Duration::from_secs(20), "steps 3 and 5", || async {
        seen(&db.pool).await.get(&1).map(Vec::len) == Some(2)
    })
    .await;

    // Act
    refused.lock().unwrap().clear();
    retry_archived(&context).await;
    eventually(Duration::from_secs(20), "step 1 to run", || async {
        seen(&db.pool).await.get(&1).map(Vec::len) == Some(3)
    })
    .await;
    stop.cancel();
    running.await.unwrap().unwrap();

    // Assert
    assert_eq!(seen(&db.pool).await.get(&1), Some(&vec![3, 5, 1]));
    assert_eq!(
        chains(&db.pool, &queue).held().await.unwrap(),
        Held::default()
    );
}

#[tokio::test]
async fn a_consuming_service_does_not_move_past_another_services_events() {
    // Arrange: a service (`shop`) publishes key 1's steps 1 to 3 to the queue
    // of another service that listens to them (`billing`, as the README's
    // "separate services"); steps 2 and 3 reach billing's worker first, and
    // wait for step 1, which billing's outbox never held.
    let shop = TestDatabase::migrated().await;
    let billing = TestDatabase::migrated().await;
    sqlx::query(SEEN).execute(&billing.pool).await.unwrap();
    let queue = TestQueue::new().await;
    let mut steps = Vec::new();
    for n in 1..=3 {
        steps.push(dispatch(&shop.pool, &Placed { key: 1, n }).await.unwrap());
    }
    let task = |n: usize| event_task(&queue, &steps[n - 1], steps[n - 1].id.to_string());
    for result in queue.client.enqueue(&[task(2), task(3)]).await.unwrap() {
        result.unwrap();
    }
    let running = Running::start(&queue, &billing.pool, ordered_ledger());
    let billing_chains = chains(&billing.pool, &queue);
    eventually(Duration::from_secs(20), "steps 2 and 3 to wait", || async {
        billing_chains.held().await.unwrap().waiting_events == 2
    })
    .await;

    // Act: billing's worker looks at the events that waited long; then
    // step 1 arrives.
    billing_chains
        .heal_stale_waits(Duration::ZERO)
        .await
        .unwrap();
    for result in queue.client.enqueue(&[task(1)]).await.unwrap() {
        result.unwrap();
    }
    eventually(Duration::from_secs(20), "three steps", || async {
        seen(&billing.pool).await.get(&1).map(Vec::len) == Some(3)
    })
    .await;
    running.stop().await;

    // Assert
    assert_eq!(seen(&billing.pool).await.get(&1), Some(&vec![1, 2, 3]));
}

/// What the takeover test's listener logs: each run's start and end, by
/// worker, beside `seen` (which has the work it did once).
const RUNS: &str = "CREATE TABLE runs (id bigserial PRIMARY KEY, worker text NOT NULL, \
                    n int NOT NULL, what text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())";

/// Where the takeover tests' listener waits in step 1.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Waits {
    /// Before its work.
    BeforeWork,
    /// After its work committed.
    AfterWork,
}

/// An ordered `ledger` of `worker` that logs its runs in `runs` and, in
/// step 1, waits for `gate` where `waits` says.
fn logged_ledger(worker: &'static str, gate: Arc<tokio::sync::Notify>, waits: Waits) -> Listeners {
    let mut listeners = Listeners::new();
    listeners.listen_with(
        "ledger",
        ListenerOptions::new().ordered(),
        move |event: Placed, context: ListenerContext| {
            let gate = gate.clone();
            async move {
                log_run(context.pool(), worker, event.n, "start").await;
                if event.n == 1 && waits == Waits::BeforeWork {
                    gate.notified().await;
                }
                record(&context, event.key, event.n).await?;
                if event.n == 1 && waits == Waits::AfterWork {
                    gate.notified().await;
                }
                log_run(context.pool(), worker, event.n, "end").await;
                Ok(())
            }
        },
    );
    listeners
}

async fn log_run(pool: &PgPool, worker: &str, n: u32, what: &str) {
    sqlx::query("INSERT INTO runs (worker, n, what) VALUES ($1, $2, $3)")
        .bind(worker)
        .bind(n as i32)
        .bind(what)
        .execute(pool)
        .await
        .unwrap();
}

/// `(worker, n, what)` of every line of `runs`, in their order.
async fn runs(pool: &PgPool) -> Vec<(String, i32, String)> {
    sqlx::query_as("SELECT worker, n, what FROM runs ORDER BY at, id")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// A consumer of `queue` as the worker wires it, with `listeners`, whose
/// leases last `lease` and are extended only just before they end.
fn consumer_leasing(
    queue: &TestQueue,
    pool: &PgPool,
    listeners: Listeners,
    lease: Duration,
) -> Consumer {
    let options = ConsumerOptions {
        queues: queue.name.parse().unwrap(),
        concurrency: 10,
        shutdown_timeout: Duration::from_secs(60),
        poll_interval: Duration::from_millis(50),
        forward_interval: Duration::from_millis(50),
        recover_interval: Duration::from_millis(100),
        lease_duration: lease,
        heartbeat_interval: lease - Duration::from_secs(1),
        retry_delay: |_| Duration::from_millis(20),
        ..ConsumerOptions::default()
    };
    super::ordering::worker_with(queue.client.clone(), &queue.name, pool, listeners, options)
}

/// Key 1's steps 1 to 3. Worker 1 runs step 1 and waits inside it (where
/// `worker_1_waits` says); then it stops taking tasks, and its lease on
/// step 1 ends in Valkey while it still runs (what a stall past the lease
/// does: a VM pause, a clock step). Worker 2 recovers step 1 and runs it
/// too, and waits before its work. Worker 1's run ends first; then worker
/// 2's. Asserts that step 1 was still its key's first run once worker 1 was
/// done, that nothing ran after it while worker 2 still ran it, and that
/// each step's work was done once. Returns the runs' log.
async fn lease_taken_over(worker_1_waits: Waits) -> Vec<(String, i32, String)> {
    // Arrange
    let db = TestDatabase::migrated().await;
    sqlx::query(SEEN).execute(&db.pool).await.unwrap();
    sqlx::query(RUNS).execute(&db.pool).await.unwrap();
    let queue = TestQueue::new().await;
    let mut steps = Vec::new();
    for n in 1..=3 {
        steps.push(dispatch(&db.pool, &Placed { key: 1, n }).await.unwrap());
    }
    let (gate_1, gate_2) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let stop_1 = CancellationToken::new();
    let worker_1 = tokio::spawn(
        consumer_leasing(
            &queue,
            &db.pool,
            logged_ledger("w1", gate_1.clone(), worker_1_waits),
            Duration::from_secs(60),
        )
        .run(stop_1.clone().cancelled_owned()),
    );
    publish_shuffled(&db.pool, &queue, &mut fastrand::Rng::with_seed(3)).await;
    let started = |worker: &'static str| {
        let pool = db.pool.clone();
        async move {
            runs(&pool)
                .await
                .contains(&(worker.to_string(), 1, "start".to_string()))
        }
    };
    eventually(Duration::from_secs(20), "worker 1 to run step 1", || {
        started("w1")
    })
    .await;
    stop_1.cancel();
    let run_1 = listener_task_id(steps[0].id, "ledger").to_string();
    let mut conn = queue.connection().await;
    let () = redis::cmd("ZADD")
        .arg(crate::queue::keys::lease(&queue.name))
        .arg(chrono::Utc::now().timestamp() - 120)
        .arg(&run_1)
        .query_async(&mut conn)
        .await
        .unwrap();
    let stop_2 = CancellationToken::new();
    let worker_2 = tokio::spawn(
        consumer_leasing(
            &queue,
            &db.pool,
            logged_ledger("w2", gate_2.clone(), Waits::BeforeWork),
            Duration::from_secs(30),
        )
        .run(stop_2.clone().cancelled_owned()),
    );
    eventually(Duration::from_secs(20), "worker 2 to run step 1", || {
        started("w2")
    })
    .await;

    // Act: worker 1's run of step 1 ends first, and worker 1 stops once it
    // has done all it does after a run; then worker 2's run ends.
    gate_1.notify_one();
    worker_1.await.unwrap().unwrap();
    let standing_after_worker_1 = chains(&db.pool, &queue)
        .standing(steps[0].id, "order:1")
        .await
        .unwrap();
    let after_worker_1 = runs(&db.pool).await;
    gate_2.notify_one();
    eventually(Duration::from_secs(20), "three steps", || async {
        seen(&db.pool).await.get(&1).map(Vec::len) == Some(3)
    })
    .await;
    stop_2.cancel();
    worker_2.await.unwrap().unwrap();

    // Assert: step 1 was still its key's first run once worker 1 was done,
    // nothing ran after it while worker 2 still ran it, and each step's work
    // was done once.
    assert_eq!(
        standing_after_worker_1.len(),
        1,
        "worker 1 moved the key on past step 1 while worker 2 ran it"
    );
    assert!(
        !after_worker_1.iter().any(|(_, n, _)| *n > 1),
        "step 2 started while worker 2 still ran step 1: {after_worker_1:?}"
    );
    let log = runs(&db.pool).await;
    let end_of_1 = log
        .iter()
        .position(|run| run == &("w2".to_string(), 1, "end".to_string()))
        .unwrap();
    let start_of_2 = log
        .iter()
        .position(|(_, n, what)| *n == 2 && what == "start")
        .unwrap();
    assert!(end_of_1 < start_of_2, "{log:?}");
    assert_eq!(seen(&db.pool).await.get(&1), Some(&vec![1, 2, 3]));
    log
}

#[tokio::test]
async fn a_run_whose_lease_another_worker_took_over_neither_commits_nor_moves_its_key_on() {
    let log = lease_taken_over(Waits::BeforeWork).await;
    assert!(
        !log.contains(&("w1".to_string(), 1, "end".to_string())),
        "worker 1 committed step 1's work after worker 2 took it over: {log:?}"
    );
}

#[tokio::test]
async fn a_run_that_did_its_work_then_lost_its_lease_does_not_move_its_key_on_under_the_next_run() {
    lease_taken_over(Waits::AfterWork).await;
}
