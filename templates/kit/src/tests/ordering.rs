//! Ordered listeners against real Postgres and Valkey: the runs of a key
//! come in commit order whatever order the event tasks reach the workers in
//! and whatever fails on the way, a run that fails for good holds its key
//! (or moves on, when told), and keys do not wait for each other.

#![cfg(feature = "worker")]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::support::{TestDatabase, TestQueue, eventually, valkey_addr};
use crate::database::Transactor;
use crate::outbox::Event;
use crate::outbox::dispatch;
use crate::queue::{Client, Consumer, ConsumerOptions, NewTask, SkipRetry};
use crate::worker::handle_events;
use crate::worker::listeners::{
    ListenerContext, ListenerError, ListenerOptions, Listeners, OnFailure,
};
use crate::worker::metrics::ListenerMetrics;
use crate::worker::ordering::{self, End, Held};
use crate::worker::task_names::{listener_task_id, listener_task_type};

/// A step of an aggregate: its key and its number in the key, which the
/// test gives in the order the steps commit.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Placed {
    pub(super) key: u32,
    pub(super) n: u32,
}

impl Event for Placed {
    const NAME: &'static str = "testOrderPlaced";

    fn order_key(&self) -> Option<String> {
        Some(format!("order:{}", self.key))
    }
}

/// Another event type of the same keys: an ordered listener of both sees
/// them in one order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Cancelled {
    key: u32,
    n: u32,
}

impl Event for Cancelled {
    const NAME: &'static str = "testOrderCancelled";

    fn order_key(&self) -> Option<String> {
        Some(format!("order:{}", self.key))
    }
}

/// The table the listener writes each run it does into, in `ctx.once`.
pub(super) const SEEN: &str =
    "CREATE TABLE seen (id bigserial PRIMARY KEY, key int NOT NULL, n int NOT NULL)";

/// Records the step in `seen`, once per event.
pub(super) async fn record(
    context: &ListenerContext,
    key: u32,
    n: u32,
) -> Result<(), ListenerError> {
    context
        .once(async |tx| {
            sqlx::query("INSERT INTO seen (key, n) VALUES ($1, $2)")
                .bind(key as i32)
                .bind(n as i32)
                .execute(&mut *tx)
                .await?;
            Ok(())
        })
        .await?;
    Ok(())
}

/// A worker of the test: a consumer of `queue` with the worker's event
/// handlers, failure records and `listeners`, as the worker wires them.
pub(super) fn worker(
    client: Client,
    queue: &TestQueue,
    pool: &PgPool,
    listeners: Listeners,
) -> Consumer {
    let options = ConsumerOptions {
        queues: queue.name.parse().unwrap(),
        concurrency: 10,
        shutdown_timeout: Duration::from_secs(2),
        poll_interval: Duration::from_millis(50),
        forward_interval: Duration::from_millis(50),
        retry_delay: |_| Duration::from_millis(20),
        ..ConsumerOptions::default()
    };
    worker_with(client, &queue.name, pool, listeners, options)
}

/// [`worker`] of the queue `queue` with `options`.
pub(super) fn worker_with(
    client: Client,
    queue: &str,
    pool: &PgPool,
    listeners: Listeners,
    options: ConsumerOptions,
) -> Consumer {
    let listeners = Arc::new(listeners);
    let ordering = ordering::Ordering::new(
        pool.clone(),
        client.clone(),
        vec![queue.to_string()],
        Duration::from_secs(60),
    );
    let mut consumer = Consumer::new(client, options);
    crate::worker::before_archive::record_before_archive(
        &mut consumer,
        pool.clone(),
        listeners.failure_hook(),
        Some(crate::worker::ordered_failures(&listeners, &ordering)),
    );
    handle_events(
        &mut consumer,
        &ordering,
        Transactor::new(pool.clone()),
        listeners,
        ListenerMetrics::default(),
        Default::default(),
    );
    consumer
}

/// The event task of `step` in `queue`, with the id `task_id` (the event
/// id as the relay queues it, another for a replay).
pub(super) fn event_task(
    queue: &TestQueue,
    step: &crate::outbox::Envelope,
    task_id: String,
) -> NewTask {
    NewTask::new(
        format!("event:{}", step.name),
        task_id,
        serde_json::to_vec(step).unwrap(),
    )
    .queue(&queue.name)
}

/// Listeners with `ledger`, ordered, recording each [`Placed`] it runs.
pub(super) fn ordered_ledger() -> Listeners {
    let mut listeners = Listeners::new();
    listeners.listen_with(
        "ledger",
        ListenerOptions::new().ordered(),
        |event: Placed, context: ListenerContext| async move {
            record(&context, event.key, event.n).await
        },
    );
    listeners
}

/// A [`worker`] of the test running, until [`Running::stop`].
pub(super) struct Running {
    stop: CancellationToken,
    running: tokio::task::JoinHandle<Result<(), crate::queue::QueueError>>,
}

impl Running {
    /// Runs a worker of `queue` and `pool` with `listeners`.
    pub(super) fn start(queue: &TestQueue, pool: &PgPool, listeners: Listeners) -> Self {
        let stop = CancellationToken::new();
        let consumer = worker(queue.client.clone(), queue, pool, listeners);
        let running = tokio::spawn(consumer.run(stop.clone().cancelled_owned()));
        Self { stop, running }
    }

    /// Stops it, once it has finished its tasks in hand.
    pub(super) async fn stop(self) {
        self.stop.cancel();
        self.running.await.unwrap().unwrap();
    }
}

/// The chains of `pool`'s database, whose heads go to `queue`.
pub(super) fn chains(pool: &PgPool, queue: &TestQueue) -> ordering::Ordering {
    ordering::Ordering::new(
        pool.clone(),
        queue.client.clone(),
        vec![queue.name.clone()],
        Duration::from_secs(60),
    )
}

/// Queues the event task of every outbox row, in a random order (as
/// several relays and the queue may deliver them), as the relay does.
pub(super) async fn publish_shuffled(pool: &PgPool, queue: &TestQueue, rng: &mut fastrand::Rng) {
    let rows: Vec<(
        uuid::Uuid,
        String,
        serde_json::Value,
        serde_json::Value,
        chrono::DateTime<chrono::Utc>,
    )> = sqlx::query_as(
        "UPDATE outbox_events SET published_at = now() WHERE published_at IS NULL \
             RETURNING event_id, event_name, payload, metadata, created_at",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut tasks: Vec<NewTask> = rows
        .into_iter()
        .map(|(id, name, payload, metadata, occurred_at)| {
            let envelope = crate::outbox::Envelope {
                id,
                name: name.clone(),
                payload,
                metadata: serde_json::from_value(metadata).unwrap(),
                occurred_at,
            };
            crate::outbox::relay::event_task(
                &envelope,
                id.to_string(),
                &queue.name,
                Duration::from_secs(60),
            )
        })
        .collect();
    rng.shuffle(&mut tasks);
    for chunk in tasks.chunks(200) {
        for result in queue.client.enqueue(chunk).await.unwrap() {
            result.unwrap();
        }
    }
}

/// The steps the listener saw, by key, in the order it saw them.
pub(super) async fn seen(pool: &PgPool) -> BTreeMap<u32, Vec<u32>> {
    let rows: Vec<(i32, i32)> = sqlx::query_as("SELECT key, n FROM seen ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap();
    let mut by_key: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (key, n) in rows {
        by_key.entry(key as u32).or_default().push(n as u32);
    }
    by_key
}

/// Dispatches `Placed` or `Cancelled` (by `n`'s parity) for `key` in a
/// transaction of its own.
pub(super) async fn dispatch_step(pool: &PgPool, key: u32, n: u32) {
    let mut tx = pool.begin().await.unwrap();
    if n.is_multiple_of(2) {
        dispatch(&mut *tx, &Cancelled { key, n }).await.unwrap();
    } else {
        dispatch(&mut *tx, &Placed { key, n }).await.unwrap();
    }
    tx.commit().await.unwrap();
}

#[tokio::test]
async fn an_ordered_listener_sees_each_key_in_commit_order_whatever_arrives_first_or_fails() {
    // Arrange: 200 keys of 1 to 6 steps, dispatched interleaved, in
    // transactions of their own; every twentieth key's first step commits late,
    // behind rows of other keys dispatched after it (lower row id, later
    // commit). Three workers; the listener fails a quarter of its runs at
    // random, some after its work committed (a retry then finds it done).
    let seed = fastrand::u64(..);
    eprintln!("seed {seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let db = TestDatabase::migrated().await;
    sqlx::query(SEEN).execute(&db.pool).await.unwrap();
    // Room for the transactions held open and those waiting behind them.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(40)
        .connect_with(db.options.clone())
        .await
        .unwrap();
    let queue = TestQueue::new().await;
    let steps: Vec<u32> = (0..200).map(|_| rng.u32(1..=6)).collect();
    let total: u32 = steps.iter().sum();

    let late: Vec<_> = (0..steps.len() as u32).step_by(20).collect();
    let mut held_open = Vec::new();
    for &key in &late {
        let mut tx = pool.begin().await.unwrap();
        dispatch(&mut *tx, &Placed { key, n: 1 }).await.unwrap();
        held_open.push(tx);
    }
    let mut next: Vec<u32> = steps.iter().map(|_| 1).collect();
    for &key in &late {
        next[key as usize] = 2;
    }
    let mut later_steps_of_late_keys = Vec::new();
    loop {
        let open: Vec<u32> = (0..steps.len() as u32)
            .filter(|&key| next[key as usize] <= steps[key as usize])
            .collect();
        if open.is_empty() {
            break;
        }
        let key = open[rng.usize(..open.len())];
        let n = next[key as usize];
        next[key as usize] += 1;
        if late.contains(&key) {
            // Waits for the lock of the key's row, held by the open
            // transaction of its first step.
            later_steps_of_late_keys.push((key, n));
        } else {
            dispatch_step(&pool, key, n).await;
        }
    }
    let waiting: Vec<_> = {
        let pool = pool.clone();
        let mut by_key: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for (key, n) in later_steps_of_late_keys {
            by_key.entry(key).or_default().push(n);
        }
        by_key
            .into_iter()
            .map(|(key, ns)| {
                let pool = pool.clone();
                tokio::spawn(async move {
                    for n in ns {
                        dispatch_step(&pool, key, n).await;
                    }
                })
            })
            .collect()
    };
    // The late ones commit now, behind every row above.
    for tx in held_open {
        tx.commit().await.unwrap();
    }
    for dispatching in waiting {
        dispatching.await.unwrap();
    }

    let mut listeners = Listeners::new();
    let fails = Arc::new(std::sync::Mutex::new(fastrand::Rng::with_seed(seed ^ 1)));
    let fails_placed = fails.clone();
    listeners.listen_with(
        "ledger",
        ListenerOptions::new().ordered(),
        move |event: Placed, context: ListenerContext| {
            let roll = fails_placed.lock().unwrap().u32(0..8);
            async move { run_step(roll, &context, event.key, event.n).await }
        },
    );
    listeners.listen_with(
        "ledger",
        ListenerOptions::new().ordered(),
        move |event: Cancelled, context: ListenerContext| {
            let roll = fails.lock().unwrap().u32(0..8);
            async move { run_step(roll, &context, event.key, event.n).await }
        },
    );
    let stop = CancellationToken::new();
    let mut workers = Vec::new();
    for _ in 0..3 {
        let client = Client::connect(&valkey_addr(), None, 0).await.unwrap();
        let consumer = worker(client, &queue, &pool, listeners.clone());
        workers.push(tokio::spawn(consumer.run(stop.clone().cancelled_owned())));
    }

    // Act
    publish_shuffled(&db.pool, &queue, &mut rng).await;
    eventually(Duration::from_secs(90), "every step to be seen", || async {
        let count: i64 = sqlx::query_scalar("SELECT count(*) FROM seen")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        count >= i64::from(total)
    })
    .await;
    stop.cancel();
    for worker in workers {
        worker.await.unwrap().unwrap();
    }

    // Assert
    let seen = seen(&db.pool).await;
    for (key, &count) in steps.iter().enumerate() {
        let expected: Vec<u32> = (1..=count).collect();
        assert_eq!(
            seen.get(&(key as u32)),
            Some(&expected),
            "key {key}: the steps in the order the listener saw them (seed {seed})"
        );
    }
    let held = chains(&db.pool, &queue).held().await.unwrap();
    assert_eq!(held, Held::default(), "nothing is left waiting");
}

/// A run of the test's listener: fails before its work when `roll` is 0,
/// after it when `roll` is 1 (a retry finds it done), else succeeds.
async fn run_step(
    roll: u32,
    context: &ListenerContext,
    key: u32,
    n: u32,
) -> Result<(), ListenerError> {
    if roll == 0 {
        return Err(anyhow::anyhow!("failed before the work of {key}/{n}"));
    }
    record(context, key, n).await?;
    if roll == 1 {
        return Err(anyhow::anyhow!("failed after the work of {key}/{n}"));
    }
    Ok(())
}

/// A listener that gives up on step 2 of key 1: `SkipRetry`.
fn giving_up_on_key_1_step_2(on_failure: OnFailure) -> Listeners {
    let mut listeners = Listeners::new();
    listeners.listen_with(
        "ledger",
        ListenerOptions::new().ordered().on_failure(on_failure),
        |event: Placed, context: ListenerContext| async move {
            if (event.key, event.n) == (1, 2) {
                return Err(
                    SkipRetry(format!("step {} of key {} is refused", event.n, event.key)).into(),
                );
            }
            record(&context, event.key, event.n).await
        },
    );
    listeners
}

/// Dispatches steps 1 to 3 of keys 1 and 2 (all `Placed`).
pub(super) async fn three_steps_of_two_keys(pool: &PgPool) {
    for n in 1..=3 {
        for key in 1..=2 {
            let mut tx = pool.begin().await.unwrap();
            dispatch(&mut *tx, &Placed { key, n }).await.unwrap();
            tx.commit().await.unwrap();
        }
    }
}

/// Key 1 held by its step 2, which failed for good (`giving_up_on_key_1_step_2`):
/// steps 1 to 3 of keys 1 and 2, their event tasks queued in the order of
/// `seed`, and a worker running until key 1 is blocked and key 2 done.
struct HeldKey {
    db: TestDatabase,
    queue: TestQueue,
    listeners: Listeners,
    stop: CancellationToken,
    running: tokio::task::JoinHandle<Result<(), crate::queue::QueueError>>,
    /// The task id of key 1's failed step 2, its chain's head.
    head: String,
}

impl HeldKey {
    async fn new(on_failure: OnFailure, seed: u64) -> Self {
        let db = TestDatabase::migrated().await;
        sqlx::query(SEEN).execute(&db.pool).await.unwrap();
        let queue = TestQueue::new().await;
        three_steps_of_two_keys(&db.pool).await;
        let listeners = giving_up_on_key_1_step_2(on_failure);
        let consumer = worker(queue.client.clone(), &queue, &db.pool, listeners.clone());
        let stop = CancellationToken::new();
        let running = tokio::spawn(consumer.run(stop.clone().cancelled_owned()));
        publish_shuffled(&db.pool, &queue, &mut fastrand::Rng::with_seed(seed)).await;
        eventually(Duration::from_secs(20), "key 1 to be blocked", || async {
            chains(&db.pool, &queue).held().await.unwrap().blocked_keys == 1
                && seen(&db.pool).await.get(&2).map(Vec::len) == Some(3)
        })
        .await;
        let (head,): (String,) = sqlx::query_as("SELECT task_id FROM listener_failures")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        Self {
            db,
            queue,
            listeners,
            stop,
            running,
            head,
        }
    }

    /// The chains of its database, whose heads go to its queue.
    fn ordering(&self) -> ordering::Ordering {
        chains(&self.db.pool, &self.queue)
    }

    /// The event of key 1's step 3, waiting behind the failed step 2, and
    /// its run's task id, as the chain tells.
    async fn waiting_step_3(&self) -> (uuid::Uuid, String) {
        let event_id: uuid::Uuid = sqlx::query_scalar(
            "SELECT event_id FROM outbox_events WHERE payload ->> 'key' = '1' AND payload ->> 'n' = '3'",
        )
        .fetch_one(&self.db.pool)
        .await
        .unwrap();
        let standing = self.ordering().standing(event_id, "order:1").await.unwrap();
        assert_eq!(standing.len(), 1, "{standing:?}");
        assert_eq!(standing[0].after, 1);
        assert_eq!(standing[0].waits_for.as_ref(), Some(&self.head));
        (event_id, standing[0].task_id.clone())
    }

    /// The service's configuration, on its database and queue (what the
    /// `outbox` commands and the console read).
    fn config(&self) -> crate::config::Config {
        let mut config = crate::testing::config(&self.db.url());
        config.valkey.addr = Some(valkey_addr());
        config.outbox.queues = self.queue.name.parse().unwrap();
        config.worker.queues = self.queue.name.parse().unwrap();
        config
    }

    /// Stops its worker.
    async fn stop(&mut self) {
        self.stop.cancel();
        (&mut self.running).await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn a_run_that_fails_for_good_holds_its_key_until_it_is_moved_past() {
    // Arrange
    let mut held = HeldKey::new(OnFailure::HoldKey, 7).await;
    let db = &held.db;

    // Act
    let blocked = held.ordering().held().await.unwrap();
    let seen_while_blocked = seen(&db.pool).await;
    crate::outbox::cleanup::delete_expired(&db.pool, Duration::ZERO)
        .await
        .unwrap();
    let kept: Vec<serde_json::Value> = sqlx::query_scalar(
        "SELECT payload FROM outbox_events WHERE payload ->> 'key' = '1' ORDER BY payload ->> 'n'",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    // What `outbox skip` does.
    held.ordering()
        .move_on(
            &held.queue.name,
            "ledger",
            "order:1",
            &held.head,
            None,
            End::Skip,
            None,
        )
        .await
        .unwrap();
    eventually(Duration::from_secs(20), "key 1 to move on", || async {
        seen(&db.pool).await.get(&1).map(Vec::len) == Some(2)
    })
    .await;
    held.stop().await;
    let db = &held.db;

    // Assert
    assert_eq!(
        blocked,
        Held {
            blocked_keys: 1,
            waiting_runs: 1,
            waiting_events: 0
        }
    );
    assert_eq!(seen_while_blocked.get(&1), Some(&vec![1]), "step 3 waited");
    assert_eq!(
        kept,
        [
            serde_json::json!({"key": 1, "n": 2}),
            serde_json::json!({"key": 1, "n": 3})
        ],
        "the cleanup keeps the events a held key holds"
    );
    assert_eq!(
        seen_while_blocked.get(&2),
        Some(&vec![1, 2, 3]),
        "key 2 did not wait"
    );
    assert_eq!(seen(&db.pool).await.get(&1), Some(&vec![1, 3]));
    assert_eq!(held.ordering().held().await.unwrap(), Held::default());
}

#[tokio::test]
async fn a_listener_told_to_move_on_moves_past_a_run_that_failed_for_good() {
    // Arrange
    let db = TestDatabase::migrated().await;
    sqlx::query(SEEN).execute(&db.pool).await.unwrap();
    let queue = TestQueue::new().await;
    three_steps_of_two_keys(&db.pool).await;
    let consumer = worker(
        queue.client.clone(),
        &queue,
        &db.pool,
        giving_up_on_key_1_step_2(OnFailure::MoveOn),
    );
    let stop = CancellationToken::new();
    let running = tokio::spawn(consumer.run(stop.clone().cancelled_owned()));

    // Act
    publish_shuffled(&db.pool, &queue, &mut fastrand::Rng::with_seed(7)).await;
    eventually(Duration::from_secs(20), "both keys to be done", || async {
        let seen = seen(&db.pool).await;
        seen.get(&1).map(Vec::len) == Some(2) && seen.get(&2).map(Vec::len) == Some(3)
    })
    .await;
    stop.cancel();
    running.await.unwrap().unwrap();

    // Assert
    assert_eq!(seen(&db.pool).await.get(&1), Some(&vec![1, 3]));
    let failures: i64 = sqlx::query_scalar("SELECT count(*) FROM listener_failures")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(failures, 1, "the failure is recorded all the same");
    assert_eq!(
        chains(&db.pool, &queue).held().await.unwrap(),
        Held::default()
    );
}

/// Dispatches `steps` (key, n) in transactions of their own, 16 at a time,
/// each key's steps one after the other in the order given.
async fn dispatch_all(pool: &PgPool, steps: &[(u32, u32)]) {
    let mut lanes: Vec<Vec<(u32, u32)>> = vec![Vec::new(); 16];
    for &(key, n) in steps {
        lanes[key as usize % 16].push((key, n));
    }
    let dispatching: Vec<_> = lanes
        .into_iter()
        .map(|lane| {
            let pool = pool.clone();
            tokio::spawn(async move {
                for (key, n) in lane {
                    dispatch_step(&pool, key, n).await;
                }
            })
        })
        .collect();
    for lane in dispatching {
        lane.await.unwrap();
    }
}

/// Names the database and queue of the kill test's worker processes: the
/// test binary runs the test again as a worker when it is set.
const WORKER_OF: &str = "KIT_TEST_ORDERED_WORKER";
/// A file the kill test's worker appends a line to as each run of its
/// listener starts (`+`) and ends (`-`), when it is given one.
const RUNS_LOG: &str = "KIT_TEST_ORDERED_RUNS_LOG";
/// The kill test, which its worker processes run.
const KILL_TEST: &str =
    "tests::ordering::ordered_runs_keep_their_order_when_a_worker_is_killed_midway";

/// A worker process of the kill test: a relay and a consumer of `queue` on
/// the database at `url`, with the random listener, until it is killed. Its
/// leases are short, so that what a killed worker held runs again soon.
async fn act_as_worker(url: &str, queue: &str) {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(12)
        .connect(url)
        .await
        .unwrap();
    let client = Client::connect(&valkey_addr(), None, 0).await.unwrap();
    let mut config = crate::testing::config(url);
    config.outbox.poll_interval = Duration::from_millis(50);
    let relay = crate::outbox::relay::Relay::new(
        pool.clone(),
        client.clone(),
        &config.outbox,
        crate::worker::metrics::Metrics::new().relay,
    )
    .with_queue(queue.to_string());
    let stop = CancellationToken::new();
    tokio::spawn(relay.run(stop.clone()));
    let mut listeners = Listeners::new();
    let rng = Arc::new(std::sync::Mutex::new(fastrand::Rng::new()));
    let placed = rng.clone();
    let log: Option<Arc<std::fs::File>> = std::env::var_os(RUNS_LOG).map(|path| {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        Arc::new(file)
    });
    let placed_log = log.clone();
    listeners.listen_with(
        "ledger",
        ListenerOptions::new().ordered(),
        move |event: Placed, context: ListenerContext| {
            let roll = placed.lock().unwrap().u32(0..8);
            let log = placed_log.clone();
            async move { logged(log, run_step(roll, &context, event.key, event.n)).await }
        },
    );
    listeners.listen_with(
        "ledger",
        ListenerOptions::new().ordered(),
        move |event: Cancelled, context: ListenerContext| {
            let roll = rng.lock().unwrap().u32(0..8);
            let log = log.clone();
            async move { logged(log, run_step(roll, &context, event.key, event.n)).await }
        },
    );
    let options = ConsumerOptions {
        queues: queue.parse().unwrap(),
        concurrency: 10,
        poll_interval: Duration::from_millis(50),
        forward_interval: Duration::from_millis(50),
        lease_duration: Duration::from_secs(2),
        heartbeat_interval: Duration::from_millis(300),
        recover_interval: Duration::from_millis(300),
        retry_delay: |_| Duration::from_millis(20),
        ..ConsumerOptions::default()
    };
    worker_with(client, queue, &pool, listeners, options)
        .run(std::future::pending::<()>())
        .await
        .expect("the consumer runs until the worker is killed");
}

/// Runs `run`, with a line in `log` (if any) as it starts and as it ends:
/// a run whose start has no end in the log of a dead process was in
/// flight when it died.
async fn logged(
    log: Option<Arc<std::fs::File>>,
    run: impl Future<Output = Result<(), ListenerError>>,
) -> Result<(), ListenerError> {
    use std::io::Write as _;
    if let Some(file) = &log {
        (&**file).write_all(b"+\n").unwrap();
    }
    let result = run.await;
    if let Some(file) = &log {
        (&**file).write_all(b"-\n").unwrap();
    }
    result
}

/// The runs started and not ended in the runs log at `path`.
fn runs_in_flight(path: &std::path::Path) -> usize {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    let started = log.lines().filter(|line| *line == "+").count();
    started - log.lines().filter(|line| *line == "-").count()
}

/// Sends `signal` (`-STOP`, `-CONT`) to the process `pid`.
fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal} {pid} failed");
}

/// The kill test's worker processes, killed when the test ends, also when
/// it fails.
struct WorkerProcesses(Vec<std::process::Child>);

impl Drop for WorkerProcesses {
    fn drop(&mut self) {
        for worker in &mut self.0 {
            let _ = worker.kill();
            let _ = worker.wait();
        }
    }
}

#[tokio::test]
async fn ordered_runs_keep_their_order_when_a_worker_is_killed_midway() {
    if let Ok(worker) = std::env::var(WORKER_OF) {
        let (url, queue) = worker.split_once(' ').unwrap();
        return act_as_worker(url, queue).await;
    }
    // Arrange: 1,000 keys of 1 to 4 steps; half dispatched before the
    // workers start, half while they run; every fortieth key's first step
    // commits late (behind rows of other keys). Three worker processes
    // relay and run the listener, which fails a quarter of its runs.
    let seed = fastrand::u64(..);
    eprintln!("seed {seed}");
    let mut rng = fastrand::Rng::with_seed(seed);
    let db = TestDatabase::migrated().await;
    sqlx::query(SEEN).execute(&db.pool).await.unwrap();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(60)
        .connect_with(db.options.clone())
        .await
        .unwrap();
    let queue = TestQueue::new().await;
    let steps: Vec<u32> = (0..1000).map(|_| rng.u32(1..=4)).collect();
    let total: u32 = steps.iter().sum();
    let mut order: Vec<(u32, u32)> = Vec::new();
    let mut next: Vec<u32> = steps.iter().map(|_| 1).collect();
    loop {
        let open: Vec<u32> = (0..steps.len() as u32)
            .filter(|&key| next[key as usize] <= steps[key as usize])
            .collect();
        if open.is_empty() {
            break;
        }
        let key = open[rng.usize(..open.len())];
        order.push((key, next[key as usize]));
        next[key as usize] += 1;
    }
    let (before, during) = order.split_at(order.len() / 2);
    let late: Vec<u32> = (0..steps.len() as u32).step_by(40).collect();
    let mut held_open = Vec::new();
    for &key in &late {
        let mut tx = pool.begin().await.unwrap();
        dispatch(&mut *tx, &Placed { key, n: 1 }).await.unwrap();
        held_open.push(tx);
    }
    let mut behind_late: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    let mut first_half = Vec::new();
    for &(key, n) in before {
        if late.contains(&key) {
            if n > 1 {
                behind_late.entry(key).or_default().push(n);
            }
        } else {
            first_half.push((key, n));
        }
    }
    dispatch_all(&pool, &first_half).await;
    let waiting: Vec<_> = behind_late
        .into_iter()
        .map(|(key, ns)| {
            let pool = pool.clone();
            tokio::spawn(async move {
                for n in ns {
                    dispatch_step(&pool, key, n).await;
                }
            })
        })
        .collect();
    // The worker to be killed logs its runs, so that the test kills it in
    // the middle of one.
    let runs_log = std::env::temp_dir().join(format!("kit-kill-{}", queue.name));
    let mut workers = WorkerProcesses(
        (0..3)
            .map(|n| {
                let mut worker = std::process::Command::new(std::env::current_exe().unwrap());
                worker
                    .args([KILL_TEST, "--exact", "--nocapture", "--test-threads=1"])
                    .env(WORKER_OF, format!("{} {}", db.url(), queue.name))
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null());
                if n == 0 {
                    worker.env(RUNS_LOG, &runs_log);
                }
                worker.spawn().unwrap()
            })
            .collect(),
    );
    for tx in held_open {
        tx.commit().await.unwrap();
    }
    for dispatching in waiting {
        dispatching.await.unwrap();
    }

    // Act: the second half while the workers run; a worker is SIGKILLed
    // once a third of the steps were seen, in the middle of a run (stopped,
    // SIGSTOP, until one is in flight). (The heads it held run again once
    // their lease is 30 s past its end, as in Go asynq: most of the test's
    // time, spent waiting.)
    let second_half: Vec<(u32, u32)> = during
        .iter()
        .copied()
        .filter(|&(key, n)| !(late.contains(&key) && n == 1))
        .collect();
    dispatch_all(&pool, &second_half).await;
    let count = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM seen")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    eventually(Duration::from_secs(60), "a third of the steps", || async {
        count().await >= i64::from(total / 3)
    })
    .await;
    let killed = workers.0[0].id();
    eventually(
        Duration::from_secs(60),
        "the worker to kill to be in the middle of a run",
        || async {
            signal(killed, "-STOP");
            let held = runs_in_flight(&runs_log) > 0;
            if !held {
                signal(killed, "-CONT");
            }
            held
        },
    )
    .await;
    let held_at_kill = runs_in_flight(&runs_log);
    workers.0[0].kill().unwrap();
    workers.0[0].wait().unwrap();
    std::fs::remove_file(&runs_log).unwrap();
    let seen_at_kill = count().await;
    let done = tokio::time::timeout(Duration::from_secs(90), async {
        while count().await < i64::from(total) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    drop(workers);
    eprintln!(
        "killed a worker in the middle of {held_at_kill} runs, with {seen_at_kill} of {total} \
         steps seen; {} seen in the end",
        count().await
    );
    assert!(
        held_at_kill > 0,
        "the killed worker held no run (seed {seed})"
    );
    assert!(done.is_ok(), "not every step was seen (seed {seed})");

    // Assert: each key's steps in commit order, none skipped, none twice.
    let seen = seen(&pool).await;
    for (key, &count) in steps.iter().enumerate() {
        let expected: Vec<u32> = (1..=count).collect();
        assert_eq!(
            seen.get(&(key as u32)),
            Some(&expected),
            "key {key}: the steps in the order the listener saw them (seed {seed})"
        );
    }
}

/// What the benchmark's listener counts: its runs.
static BENCH_RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A no-op event of the benchmark, keyed (`key` is `Some`) or not.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Tick {
    key: Option<u32>,
}

impl Event for Tick {
    const NAME: &'static str = "benchTick";

    fn order_key(&self) -> Option<String> {
        self.key.map(|key| format!("tick:{key}"))
    }
}

/// One round of the benchmark: `events` `Tick`s (keyed over `keys` keys
/// when `ordered`, and run by an ordered listener; else neither) committed
/// in the outbox; then one worker (its relay, and its consumer at
/// concurrency 10) publishes them and runs the no-op listener on every one,
/// as `scripts/bench-outbox`'s end-to-end step does. Runs per second, from
/// the worker's start to the last run.
async fn bench_round(ordered: bool, events: u32, keys: u32) -> f64 {
    let db = TestDatabase::migrated().await;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(12)
        .connect_with(db.options.clone())
        .await
        .unwrap();
    let queue = TestQueue::new().await;
    for chunk in (0..events).collect::<Vec<_>>().chunks(500) {
        let mut tx = pool.begin().await.unwrap();
        for &i in chunk {
            let key = ordered.then_some(i % keys);
            dispatch(&mut *tx, &Tick { key }).await.unwrap();
        }
        tx.commit().await.unwrap();
    }
    let mut config = crate::testing::config("postgres://unused@localhost/unused");
    config.outbox.poll_interval = Duration::from_millis(50);
    let relay = crate::outbox::relay::Relay::new(
        pool.clone(),
        queue.client.clone(),
        &config.outbox,
        crate::worker::metrics::Metrics::new().relay,
    )
    .with_queue(queue.name.clone());
    let mut listeners = Listeners::new();
    let options = if ordered {
        ListenerOptions::new().ordered()
    } else {
        ListenerOptions::new()
    };
    listeners.listen_with("noop", options, |_: Tick, _: ListenerContext| async {
        BENCH_RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    });
    BENCH_RUNS.store(0, std::sync::atomic::Ordering::Relaxed);
    let consumer = worker(queue.client.clone(), &queue, &pool, listeners);
    let stop = CancellationToken::new();
    let started = Instant::now();
    let relaying = tokio::spawn(relay.run(stop.clone()));
    let running = tokio::spawn(consumer.run(stop.clone().cancelled_owned()));
    while BENCH_RUNS.load(std::sync::atomic::Ordering::Relaxed) < events as usize {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = started.elapsed();
    stop.cancel();
    running.await.unwrap().unwrap();
    relaying.await.unwrap();
    f64::from(events) / took.as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark of about a minute: scripts/bench/ordering"]
async fn bench_ordered_runs_against_unordered_ones() {
    let events = 6_000;
    let keys = 1_000;
    let rounds = 5;
    let (mut unordered, mut ordered) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        unordered.push(bench_round(false, events, keys).await);
        ordered.push(bench_round(true, events, keys).await);
        eprintln!(
            "round {round}: unordered {:.0}/s, ordered over {keys} keys {:.0}/s",
            unordered[round - 1],
            ordered[round - 1]
        );
    }
    let median = |runs: &mut Vec<f64>| {
        runs.sort_by(f64::total_cmp);
        (runs[runs.len() / 2], runs[0], runs[runs.len() - 1])
    };
    let (u, u_min, u_max) = median(&mut unordered);
    let (o, o_min, o_max) = median(&mut ordered);
    println!(
        "{events} events from a committed backlog, one worker (relay and consumer at concurrency 10), \
         {rounds} alternating rounds:\n\
         unordered no-op listener: median {u:.0} runs/s (min {u_min:.0}, max {u_max:.0})\n\
         ordered, {keys} keys:       median {o:.0} runs/s (min {o_min:.0}, max {o_max:.0})\n\
         ordered / unordered: {:.2}",
        o / u
    );
}

#[tokio::test]
async fn a_head_whose_task_valkey_lost_is_queued_again() {
    // Arrange: key 1 held by its failed step 2, then moved past it (what
    // `outbox skip` does), which queues step 3; then Valkey loses the queue.
    let mut held = HeldKey::new(OnFailure::HoldKey, 1).await;
    held.stop().await;
    let HeldKey {
        db,
        queue,
        listeners,
        head,
        ..
    } = &held;
    let ordering = held.ordering();
    ordering
        .move_on(
            &queue.name,
            "ledger",
            "order:1",
            head,
            None,
            End::Past,
            None,
        )
        .await
        .unwrap();
    queue.delete_keys();

    // Act: step 3 is the head, and not in the queue; queue old heads again.
    let requeued = ordering
        .look_at_old_heads(Duration::ZERO, &listeners.ordered())
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let consumer = worker(queue.client.clone(), queue, &db.pool, listeners.clone());
    let running = tokio::spawn(consumer.run(stop.clone().cancelled_owned()));
    eventually(Duration::from_secs(20), "step 3 to run", || async {
        seen(&db.pool).await.get(&1).map(Vec::len) == Some(2)
    })
    .await;
    stop.cancel();
    running.await.unwrap().unwrap();

    // Assert
    assert_eq!(requeued, 1);
    assert_eq!(seen(&db.pool).await.get(&1), Some(&vec![1, 3]));
    assert_eq!(
        ordering
            .look_at_old_heads(Duration::ZERO, &listeners.ordered())
            .await
            .unwrap(),
        0,
        "no head is left"
    );
}

#[tokio::test]
async fn a_replay_of_an_event_never_fanned_out_takes_its_turn() {
    // Arrange: steps 1 to 3 of key 1; Valkey lost step 2's event task, and
    // the recovery replays it (a new task id), before step 1 was fanned out.
    let db = TestDatabase::migrated().await;
    sqlx::query(SEEN).execute(&db.pool).await.unwrap();
    let queue = TestQueue::new().await;
    let mut steps = Vec::new();
    for n in 1..=3 {
        steps.push(dispatch(&db.pool, &Placed { key: 1, n }).await.unwrap());
    }
    let tasks = [
        event_task(&queue, &steps[2], steps[2].id.to_string()),
        event_task(&queue, &steps[1], uuid::Uuid::now_v7().to_string()),
        event_task(&queue, &steps[0], steps[0].id.to_string()),
    ];
    for result in queue.client.enqueue(&tasks).await.unwrap() {
        result.unwrap();
    }
    let listeners = ordered_ledger();

    // Act
    let running = Running::start(&queue, &db.pool, listeners);
    eventually(Duration::from_secs(20), "three steps", || async {
        seen(&db.pool).await.get(&1).map(Vec::len) == Some(3)
    })
    .await;
    running.stop().await;

    // Assert
    assert_eq!(seen(&db.pool).await.get(&1), Some(&vec![1, 2, 3]));
}

#[cfg(feature = "testing")]
#[tokio::test]
async fn the_console_shows_a_run_that_waits_for_its_keys_earlier_one() {
    // Arrange: key 1 held by its failed step 2, step 3 waiting behind it;
    // the console of the service, whose listener task of step 3 is in no
    // queue yet.
    let mut held = HeldKey::new(OnFailure::HoldKey, 5).await;
    held.stop().await;
    let (event_id, _) = held.waiting_step_3().await;
    let console = crate::console::Console::new(held.config(), held.listeners.clone()).router();
    let client = crate::testing::TestClient::new(console);

    // Act
    let page = client.get(&format!("/events/{event_id}")).await;

    // Assert: its row says it waits, for how many runs and for which one.
    assert_eq!(page.status(), 200, "{}", page.text());
    let text = page.text();
    let row = text
        .split("<tr data-listener=\"ledger\">")
        .nth(1)
        .and_then(|rest| rest.split("</tr>").next())
        .unwrap_or_else(|| panic!("no row for the listener `ledger`: {text}"));
    assert!(
        row.contains(&format!(
            "<span class=\"state state-waiting\">waiting</span> for 1 earlier run(s) of key \
             <code>order:1</code> (the first: task <code>{}</code>)",
            held.head
        )),
        "{row}"
    );
    assert!(!row.contains("missing"), "{row}");
}

#[tokio::test]
async fn outbox_skip_releases_a_held_key_and_refuses_any_other_run() {
    // Arrange: key 1 held by its failed step 2, step 3 waiting behind it.
    let mut held = HeldKey::new(OnFailure::HoldKey, 3).await;
    let (_, waiting) = held.waiting_step_3().await;
    let HeldKey { db, head, .. } = &held;
    let context = crate::follow::Context::new(held.config(), Listeners::new());
    let skip = |task_id: &str| crate::operations::skip::Args {
        task_id: task_id.to_string(),
    };
    let text = crate::operations::output::Format::Text;

    // Act
    let unknown = crate::operations::skip::run(&context, &skip("no-such-task"), text).await;
    let not_first = crate::operations::skip::run(&context, &skip(&waiting), text).await;
    let skipped = crate::operations::skip::run(&context, &skip(head), text).await;
    eventually(Duration::from_secs(20), "key 1 to move on", || async {
        seen(&db.pool).await.get(&1).map(Vec::len) == Some(2)
    })
    .await;
    held.stop().await;
    let db = &held.db;

    // Assert
    let unknown = unknown.unwrap_err().to_string();
    assert!(
        unknown.contains(
            "is not a run of an ordered listener waiting in its key's order; nothing was changed"
        ),
        "{unknown}"
    );
    let not_first = not_first.unwrap_err().to_string();
    assert!(
        not_first.contains("is not the first of key `order:1`: 1 earlier run(s) come before it"),
        "{not_first}"
    );
    assert!(skipped.is_ok(), "{skipped:?}");
    assert_eq!(seen(&db.pool).await.get(&1), Some(&vec![1, 3]));
    assert_eq!(held.ordering().held().await.unwrap(), Held::default());
    let failures: i64 = sqlx::query_scalar("SELECT count(*) FROM listener_failures")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(failures, 1, "the failure record stays");
}

#[tokio::test]
async fn chains_left_in_postgres_by_template_set_21_move_to_valkey_in_their_order() {
    // Arrange: key 1's steps 1 to 5, dispatched as template set 21 did (no
    // epoch); a worker of that set fanned out steps 1, 2 and 4 into Postgres
    // (the migration's `outbox_fan_out`: step 1 the head, its task queued;
    // step 2 behind it; step 4 waiting for step 3) and stopped.
    let db = TestDatabase::migrated().await;
    sqlx::query(SEEN).execute(&db.pool).await.unwrap();
    let queue = TestQueue::new().await;
    let mut steps = Vec::new();
    for n in 1..=5 {
        steps.push(dispatch(&db.pool, &Placed { key: 1, n }).await.unwrap());
    }
    sqlx::query("UPDATE outbox_keys SET epoch = 0")
        .execute(&db.pool)
        .await
        .unwrap();
    for step in &mut steps {
        step.metadata.remove(crate::outbox::order::ORDER_EPOCH);
    }
    let task_type = listener_task_type(&steps[0].name, "ledger");
    let run_id = |step: &crate::outbox::Envelope| listener_task_id(step.id, "ledger").to_string();
    for (seq, step) in [(1, &steps[0]), (2, &steps[1]), (4, &steps[3])] {
        sqlx::query("SELECT * FROM outbox_fan_out($1, $2, false, $3, $4, $5, '{}', $6, $7, $8)")
            .bind("order:1")
            .bind(seq)
            .bind(&queue.name)
            .bind(step.id)
            .bind(serde_json::to_vec(step).unwrap())
            .bind(vec!["ledger"])
            .bind(vec![&task_type])
            .bind(vec![run_id(step)])
            .execute(&db.pool)
            .await
            .unwrap();
    }
    let head = NewTask::new(
        task_type.clone(),
        run_id(&steps[0]),
        serde_json::to_vec(&steps[0]).unwrap(),
    )
    .queue(&queue.name)
    .headers([(ordering::ORDERED_HEADER.to_string(), "order:1".to_string())].into());
    let later = [
        head,
        event_task(&queue, &steps[4], steps[4].id.to_string()),
        event_task(&queue, &steps[2], steps[2].id.to_string()),
    ];
    for result in queue.client.enqueue(&later).await.unwrap() {
        result.unwrap();
    }
    let listeners = ordered_ledger();
    let chains = chains(&db.pool, &queue);

    // Act: the worker of set 22 moves them before it consumes.
    let moved = chains.move_from_postgres().await.unwrap();
    let running = Running::start(&queue, &db.pool, listeners);
    eventually(Duration::from_secs(20), "five steps", || async {
        seen(&db.pool).await.get(&1).map(Vec::len) == Some(5)
    })
    .await;
    running.stop().await;

    // Assert
    assert_eq!(moved, 4, "one key's number, one waiting event, two runs");
    assert_eq!(seen(&db.pool).await.get(&1), Some(&vec![1, 2, 3, 4, 5]));
    let left: (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM ordered_runs) + (SELECT count(*) FROM ordered_keys), \
           (SELECT count(*) FROM outbox_key_waits), (SELECT max(fanned_out) FROM outbox_keys)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(left, (0, 0, 0), "nothing is left in Postgres");
    assert_eq!(chains.move_from_postgres().await.unwrap(), 0);
    assert_eq!(chains.held().await.unwrap(), Held::default());
}

#[tokio::test]
async fn a_key_idle_for_the_retention_numbers_its_events_again_in_a_new_epoch() {
    // Arrange: key 1's steps 1 and 2 run; then the key is idle for the
    // retention, and its row in Postgres goes.
    let db = TestDatabase::migrated().await;
    sqlx::query(SEEN).execute(&db.pool).await.unwrap();
    let queue = TestQueue::new().await;
    let listeners = ordered_ledger();
    let running = Running::start(&queue, &db.pool, listeners);
    let mut steps = Vec::new();
    for n in 1..=2 {
        steps.push(dispatch(&db.pool, &Placed { key: 1, n }).await.unwrap());
    }
    publish_shuffled(&db.pool, &queue, &mut fastrand::Rng::with_seed(2)).await;
    eventually(Duration::from_secs(20), "steps 1 and 2", || async {
        seen(&db.pool).await.get(&1).map(Vec::len) == Some(2)
    })
    .await;
    let first_epoch = crate::outbox::order::Place::of(&steps[0].metadata)
        .unwrap()
        .epoch;
    let fanned = format!("ordered:{{{}}}:fan:{first_epoch}:order:1", queue.name);
    let mut conn = queue.connection().await;
    let fanned_before_idle: Option<i64> = redis::cmd("GET")
        .arg(&fanned)
        .query_async(&mut conn)
        .await
        .unwrap();
    let idle = chains(&db.pool, &queue)
        .delete_idle(Duration::ZERO)
        .await
        .unwrap();
    let fanned_after_idle: Option<i64> = redis::cmd("GET")
        .arg(&fanned)
        .query_async(&mut conn)
        .await
        .unwrap();

    // Act: its next event numbers from 1 again.
    steps.push(dispatch(&db.pool, &Placed { key: 1, n: 3 }).await.unwrap());
    publish_shuffled(&db.pool, &queue, &mut fastrand::Rng::with_seed(3)).await;
    eventually(Duration::from_secs(20), "step 3", || async {
        seen(&db.pool).await.get(&1).map(Vec::len) == Some(3)
    })
    .await;
    running.stop().await;

    // Assert: the old numbering is gone from Valkey too.
    assert_eq!(idle, 1);
    assert_eq!(fanned_before_idle, Some(2));
    assert_eq!(fanned_after_idle, None);
    let place =
        |step: &crate::outbox::Envelope| crate::outbox::order::Place::of(&step.metadata).unwrap();
    assert_eq!((place(&steps[1]).seq, place(&steps[2]).seq), (2, 1));
    assert!(place(&steps[2]).epoch > place(&steps[1]).epoch, "{steps:?}");
    assert_eq!(seen(&db.pool).await.get(&1), Some(&vec![1, 2, 3]));
}

#[tokio::test]
async fn after_valkey_loses_its_data_the_replayed_events_of_a_key_run_in_order() {
    // Arrange: key 1's steps 1 and 2 run; steps 3 and 4 are published, and
    // then Valkey loses all it had (its queue, and what the chains knew).
    let db = TestDatabase::migrated().await;
    sqlx::query(SEEN).execute(&db.pool).await.unwrap();
    let queue = TestQueue::new().await;
    let listeners = ordered_ledger();
    let running = Running::start(&queue, &db.pool, listeners.clone());
    let mut steps = Vec::new();
    for n in 1..=2 {
        steps.push(dispatch(&db.pool, &Placed { key: 1, n }).await.unwrap());
    }
    publish_shuffled(&db.pool, &queue, &mut fastrand::Rng::with_seed(4)).await;
    eventually(Duration::from_secs(20), "steps 1 and 2", || async {
        seen(&db.pool).await.get(&1).map(Vec::len) == Some(2)
    })
    .await;
    running.stop().await;
    for n in 3..=4 {
        steps.push(dispatch(&db.pool, &Placed { key: 1, n }).await.unwrap());
    }
    publish_shuffled(&db.pool, &queue, &mut fastrand::Rng::with_seed(5)).await;
    queue.delete_keys();
    let mut conn = queue.connection().await;
    let chain_keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("ordered:{{{}}}:*", queue.name))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!chain_keys.is_empty());
    let () = redis::cmd("DEL")
        .arg(&chain_keys)
        .query_async(&mut conn)
        .await
        .unwrap();

    // Act: the README's recovery replays the events since the loss (new
    // task ids; here the later first), and they wait for the earlier ones,
    // which Valkey no longer knows; the worker looks at them, and the relay
    // publishes again what it was told to.
    let replay = |step| event_task(&queue, step, uuid::Uuid::now_v7().to_string());
    for result in queue
        .client
        .enqueue(&[replay(&steps[3]), replay(&steps[2])])
        .await
        .unwrap()
    {
        result.unwrap();
    }
    let running = Running::start(&queue, &db.pool, listeners);
    let chains = chains(&db.pool, &queue);
    eventually(Duration::from_secs(20), "steps 3 and 4 to wait", || async {
        chains.held().await.unwrap().waiting_events == 2
    })
    .await;
    let looked_at = chains.heal_stale_waits(Duration::ZERO).await.unwrap();
    publish_shuffled(&db.pool, &queue, &mut fastrand::Rng::with_seed(6)).await;
    eventually(Duration::from_secs(20), "steps 3 and 4", || async {
        seen(&db.pool).await.get(&1).map(Vec::len) == Some(4)
    })
    .await;
    running.stop().await;

    // Assert: in order, each step's work once (steps 1 and 2 ran again,
    // `ctx.once` kept their work once).
    assert_eq!(looked_at, 2);
    assert_eq!(seen(&db.pool).await.get(&1), Some(&vec![1, 2, 3, 4]));
    assert_eq!(chains.held().await.unwrap(), Held::default());
}
