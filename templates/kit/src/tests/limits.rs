//! The limits on listeners (`crate::worker::limits`) and the consumer's
//! deferral they rest on, against real Valkey (`VALKEY_ADDR`) and Postgres
//! (`DATABASE_URL`).
//!
//! The limit tests run three consumers in the process, each with its own
//! `Client` (three workers), with the default forward interval (5 s), so
//! that a deferred task that runs on time was woken by the kit, not the
//! forwarder. Their handler asks a `Limiter` (one per worker), defers when
//! told to wait, and records the instants its run started and ended in a
//! Postgres table; the assertions are on those intervals. Each test has a
//! queue and a listener (so limit keys) of its own, deleted at the end;
//! each waits on conditions, never on fixed sleeps.
//!
//! `bench_a_rate_of_50_per_second_over_60_s` (ignored; `scripts/bench/limits`)
//! prints the rate three workers achieve under a 50/s limit.

#![cfg(feature = "worker")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use prost::Message as _;
use redis::AsyncCommands;
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::support::{TestDatabase, TestQueue, eventually, valkey_addr};
use crate::queue::message::TaskMessage;
use crate::queue::{
    Client, Consumer, ConsumerOptions, HandlerError, NewTask, QueueError, Task, keys,
};
use crate::worker::limits::{
    Acquired, LimitKind, LimitLabels, LimitMetrics, Limiter, Limits, Rate,
};

/// How long the tests of a rate wait for their runs before they fail. Far
/// more than the rate needs (5 s for 100 runs at 20/s): on a loaded machine
/// deferred runs come back late, and a run late by more than a quarter of
/// an interval loses its turn and takes one at the end of the queue, so the
/// runs may take many times the rate's time (the limiter's known weakness
/// under load; what these tests assert is the bound, never exceeded).
const RATED_RUNS_CEILING: Duration = Duration::from_secs(300);

/// The event of the tests' listeners; each test's listener has a name of
/// its own.
const EVENT: &str = "limitTested";

/// A client of its own, as a worker process has, whose enqueues and wake-ups
/// are published to the other workers (`OUTBOX_WAKE=valkey`).
async fn worker_client() -> Client {
    let client = Client::connect(&valkey_addr(), None, 0)
        .await
        .expect("these tests need Valkey or Redis at VALKEY_ADDR (default 127.0.0.1:6379)");
    client.enqueued().set_publish(true);
    client
}

/// A worker's consumer options for `queue`: the forward interval is Go's
/// 5 s on purpose.
fn options(queue: &str) -> ConsumerOptions {
    ConsumerOptions {
        queues: queue.parse().unwrap(),
        concurrency: 8,
        shutdown_timeout: Duration::from_secs(2),
        poll_interval: Duration::from_millis(200),
        wake_on_published: true,
        ..ConsumerOptions::default()
    }
}

/// Consumers running in the background until [`Workers::stop`].
struct Workers(Vec<(CancellationToken, JoinHandle<Result<(), QueueError>>)>);

impl Workers {
    fn start(consumers: Vec<Consumer>) -> Self {
        Self(
            consumers
                .into_iter()
                .map(|consumer| {
                    let shutdown = CancellationToken::new();
                    let handle = tokio::spawn(consumer.run(shutdown.clone().cancelled_owned()));
                    (shutdown, handle)
                })
                .collect(),
        )
    }

    async fn stop(self) {
        for (shutdown, _) in &self.0 {
            shutdown.cancel();
        }
        for (_, handle) in self.0 {
            handle
                .await
                .expect("the consumer does not panic")
                .expect("the consumer stops cleanly");
        }
    }
}

/// A listener of its own for one test: its name, and the deletion of its
/// limits' keys (and of the queue's woken set) on drop.
struct TestListener {
    name: String,
    queue: String,
}

impl TestListener {
    fn new(queue: &TestQueue) -> Self {
        Self {
            name: format!("l{}", uuid::Uuid::now_v7().simple()),
            queue: queue.name.clone(),
        }
    }

    fn task_type(&self) -> String {
        format!("listener:{EVENT}:{}", self.name)
    }

    /// `count` tasks of this listener, `partition(n)` as the n-th's payload.
    fn tasks(&self, count: usize, partition: impl Fn(usize) -> String) -> Vec<NewTask> {
        (0..count)
            .map(|n| {
                NewTask::new(
                    self.task_type(),
                    format!("task-{n:04}"),
                    partition(n).into_bytes(),
                )
                .queue(&self.queue)
            })
            .collect()
    }
}

impl Drop for TestListener {
    fn drop(&mut self) {
        let Ok(mut conn) = redis::Client::open(format!("redis://{}/", valkey_addr()))
            .and_then(|c| c.get_connection())
        else {
            return;
        };
        for pattern in [
            format!("limits:{{{}}}:*", self.task_type()),
            keys::woken(&self.queue),
        ] {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(&pattern)
                .query(&mut conn)
                .unwrap_or_default();
            if !keys.is_empty() {
                let _: redis::RedisResult<()> = redis::cmd("DEL").arg(keys).query(&mut conn);
            }
        }
    }
}

async fn enqueue(client: &Client, tasks: &[NewTask]) {
    for outcome in client
        .enqueue(tasks)
        .await
        .expect("the round trip succeeds")
    {
        outcome.expect("each task is accepted");
    }
}

/// The table the handlers record their runs in.
async fn runs_table(db: &TestDatabase) {
    sqlx::query(
        "CREATE TABLE runs (task_id text NOT NULL, part text NOT NULL, \
         started timestamptz NOT NULL, ended timestamptz NOT NULL)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
}

/// One recorded run: its task, partition, start and end.
type Run = (String, String, DateTime<Utc>, DateTime<Utc>);

async fn runs(pool: &PgPool) -> Vec<Run> {
    sqlx::query_as("SELECT task_id, part, started, ended FROM runs ORDER BY started")
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn run_count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM runs")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Three workers, each a consumer with its own client and limiter of
/// `listener` with `limits`, whose handler takes the limit for the
/// partition in the task's payload, works for `work`, and records the run.
async fn limited_workers(
    listener: &TestListener,
    limits: Limits,
    pool: &PgPool,
    work: Duration,
) -> Workers {
    let mut consumers = Vec::new();
    for _ in 0..3 {
        let client = worker_client().await;
        let limiter = Limiter::new(client.clone(), EVENT, &listener.name, limits);
        let mut consumer = Consumer::new(client, options(&listener.queue));
        let pool = pool.clone();
        consumer.handle(listener.task_type(), move |task: Task| {
            let (limiter, pool) = (limiter.clone(), pool.clone());
            async move {
                let partition = String::from_utf8_lossy(&task.payload).into_owned();
                let permit = match limiter.acquire(&partition, &task).await? {
                    Acquired::Granted(permit) => permit,
                    Acquired::Wait { until, .. } => return Err(HandlerError::defer(until)),
                };
                let started = Utc::now();
                tokio::time::sleep(work).await;
                let ended = Utc::now();
                permit.release().await;
                sqlx::query(
                    "INSERT INTO runs (task_id, part, started, ended) VALUES ($1, $2, $3, $4)",
                )
                .bind(&task.id)
                .bind(&partition)
                .bind(started)
                .bind(ended)
                .execute(&pool)
                .await?;
                Ok(())
            }
        });
        consumers.push(consumer);
    }
    Workers::start(consumers)
}

/// The most runs of `runs` that overlap at one instant (a run ending at
/// the instant another starts does not overlap it).
fn most_at_once<'a>(runs: impl IntoIterator<Item = &'a Run>) -> usize {
    let mut edges: Vec<(DateTime<Utc>, i32)> = runs
        .into_iter()
        .flat_map(|(_, _, started, ended)| [(*started, 1), (*ended, -1)])
        .collect();
    edges.sort();
    let (mut now, mut most) = (0, 0);
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    usize::try_from(most).unwrap()
}

/// Every task ran exactly once.
fn assert_each_ran_once(runs: &[Run], count: usize) {
    let mut ids: Vec<&str> = runs.iter().map(|(id, ..)| id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(
        (runs.len(), ids.len()),
        (count, count),
        "each task runs once"
    );
}

#[tokio::test]
async fn no_more_than_the_concurrency_limit_runs_at_once_across_three_workers() {
    // Arrange: 200 tasks of a listener limited to 4 at once, on three
    // workers of 8 slots each.
    let (db, queue) = (TestDatabase::empty().await, TestQueue::new().await);
    runs_table(&db).await;
    let listener = TestListener::new(&queue);
    let limits = Limits {
        concurrency: Some(4),
        rate: None,
    };
    let workers = limited_workers(&listener, limits, &db.pool, Duration::from_millis(15)).await;
    let started = Instant::now();

    // Act
    enqueue(&queue.client, &listener.tasks(200, |_| String::new())).await;
    eventually(Duration::from_secs(60), "200 runs", || async {
        run_count(&db.pool).await == 200
    })
    .await;
    let took = started.elapsed();
    workers.stop().await;

    // Assert
    let runs = runs(&db.pool).await;
    assert_each_ran_once(&runs, 200);
    let most = most_at_once(&runs);
    eprintln!("concurrency 4: 200 runs of 15 ms in {took:?}, at most {most} at once");
    assert!(most <= 4, "{most} ran at once");
    assert!(most >= 2, "the limit lets 4 run at once, not one: {most}");
}

#[tokio::test]
async fn a_concurrency_limit_per_partition_holds_for_each_partition_alone() {
    // Arrange: 3 tenants, 2 at once each.
    let (db, queue) = (TestDatabase::empty().await, TestQueue::new().await);
    runs_table(&db).await;
    let listener = TestListener::new(&queue);
    let limits = Limits {
        concurrency: Some(2),
        rate: None,
    };
    let workers = limited_workers(&listener, limits, &db.pool, Duration::from_millis(15)).await;

    // Act
    let tenants = ["tenant-a", "tenant-b", "tenant-c"];
    enqueue(
        &queue.client,
        &listener.tasks(90, |n| tenants[n % 3].to_string()),
    )
    .await;
    eventually(Duration::from_secs(60), "90 runs", || async {
        run_count(&db.pool).await == 90
    })
    .await;
    workers.stop().await;

    // Assert
    let runs = runs(&db.pool).await;
    assert_each_ran_once(&runs, 90);
    for tenant in tenants {
        let most = most_at_once(runs.iter().filter(|(_, part, ..)| part == tenant));
        assert!(most <= 2, "{tenant}: {most} ran at once");
    }
    let most = most_at_once(&runs);
    eprintln!("concurrency 2 per tenant, 3 tenants: at most {most} at once in all");
    assert!(
        most > 2,
        "the tenants' limits are their own: {most} at once in all"
    );
}

#[tokio::test]
async fn no_period_holds_more_starts_than_the_rate_and_its_burst_across_three_workers() {
    // Arrange: 100 tasks of a listener limited to 20/s with a burst of 5.
    let (db, queue) = (TestDatabase::empty().await, TestQueue::new().await);
    runs_table(&db).await;
    let listener = TestListener::new(&queue);
    let rate = Rate::per_second(20).with_burst(5);
    let limits = Limits {
        concurrency: None,
        rate: Some(rate),
    };
    let workers = limited_workers(&listener, limits, &db.pool, Duration::from_millis(5)).await;

    // Act
    enqueue(&queue.client, &listener.tasks(100, |_| String::new())).await;
    eventually(RATED_RUNS_CEILING, "100 runs", || async {
        run_count(&db.pool).await == 100
    })
    .await;
    workers.stop().await;

    // Assert: every window of one second from a start holds at most
    // 20 + 5 starts.
    let runs = runs(&db.pool).await;
    assert_each_ran_once(&runs, 100);
    let starts: Vec<DateTime<Utc>> = runs.iter().map(|(_, _, started, _)| *started).collect();
    let period = TimeDelta::from_std(rate.per).unwrap();
    let most = starts
        .iter()
        .map(|from| {
            starts
                .iter()
                .filter(|s| *s >= from && **s < *from + period)
                .count()
        })
        .max()
        .unwrap();
    let span = (starts[99] - starts[0]).to_std().unwrap();
    let steady = 95.0 / (starts[99] - starts[4]).to_std().unwrap().as_secs_f64();
    eprintln!(
        "rate 20/s, burst 5: 100 starts over {span:?}, at most {most} in a second, {steady:.1}/s after the burst"
    );
    assert!(most <= 25, "{most} starts in one second");
    // How close to the rate the runs came is a benchmark's figure
    // (scripts/bench/limits), not this test's: a loaded machine wakes runs
    // late, and a run late by a quarter of an interval takes a new turn.
}

#[tokio::test]
async fn concurrency_and_rate_limits_hold_together() {
    // Arrange: 2 at once and 20/s, runs of 60 ms: each limit binds in turn.
    let (db, queue) = (TestDatabase::empty().await, TestQueue::new().await);
    runs_table(&db).await;
    let listener = TestListener::new(&queue);
    let limits = Limits {
        concurrency: Some(2),
        rate: Some(Rate::per_second(20)),
    };
    let workers = limited_workers(&listener, limits, &db.pool, Duration::from_millis(60)).await;

    // Act
    enqueue(&queue.client, &listener.tasks(40, |_| String::new())).await;
    eventually(RATED_RUNS_CEILING, "40 runs", || async {
        run_count(&db.pool).await == 40
    })
    .await;
    workers.stop().await;

    // Assert
    let runs = runs(&db.pool).await;
    assert_each_ran_once(&runs, 40);
    assert!(most_at_once(&runs) <= 2, "{} at once", most_at_once(&runs));
    let starts: Vec<DateTime<Utc>> = runs.iter().map(|(_, _, started, _)| *started).collect();
    let most = starts
        .iter()
        .map(|from| {
            let to = *from + TimeDelta::seconds(1);
            starts.iter().filter(|s| *s >= from && **s < to).count()
        })
        .max()
        .unwrap();
    assert!(most <= 21, "{most} starts in one second");
}

#[tokio::test]
async fn a_deferred_task_waits_in_scheduled_with_its_retries_untouched_and_runs_again_on_time() {
    // Arrange: a handler that defers the first run by 1 s; a forwarder too
    // slow to be the one that wakes it.
    let queue = TestQueue::new().await;
    let runs: Arc<Mutex<Vec<(Instant, Task)>>> = Arc::default();
    // When the first run deferred the task to: the local instant and the time.
    type Due = Option<(Instant, DateTime<Utc>)>;
    let until: Arc<Mutex<Due>> = Arc::default();
    let mut consumer = Consumer::new(
        queue.client.clone(),
        ConsumerOptions {
            forward_interval: Duration::from_secs(60),
            ..options(&queue.name)
        },
    );
    consumer.handle("job:deferred", {
        let (runs, until) = (runs.clone(), until.clone());
        move |task: Task| {
            let (runs, until) = (runs.clone(), until.clone());
            async move {
                let first = {
                    let mut runs = runs.lock().unwrap();
                    runs.push((Instant::now(), task));
                    runs.len() == 1
                };
                if first {
                    let at = Utc::now() + TimeDelta::seconds(1);
                    *until.lock().unwrap() = Some((Instant::now() + Duration::from_secs(1), at));
                    return Err(HandlerError::defer(at));
                }
                Ok(())
            }
        }
    });
    let workers = Workers::start(vec![consumer]);

    // Act
    enqueue(
        &queue.client,
        &[NewTask::new("job:deferred", "deferred", b"{}".to_vec()).queue(&queue.name)],
    )
    .await;
    let mut redis = queue.connection().await;
    let scheduled = keys::scheduled(&queue.name);
    let waiting = Instant::now();
    let in_scheduled: Vec<(String, f64)> = loop {
        let found: Vec<(String, f64)> = redis.zrange_withscores(&scheduled, 0, -1).await.unwrap();
        if !found.is_empty() {
            break found;
        }
        assert!(
            waiting.elapsed() < Duration::from_secs(20),
            "timed out waiting for the task in :scheduled"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let state: String = redis
        .hget(keys::task(&queue.name, "deferred"), "state")
        .await
        .unwrap();
    let message: Vec<u8> = redis
        .hget(keys::task(&queue.name, "deferred"), "msg")
        .await
        .unwrap();
    let message = TaskMessage::decode(message.as_slice()).unwrap();
    let active: Vec<String> = redis
        .lrange(keys::active(&queue.name), 0, -1)
        .await
        .unwrap();
    let leased: Vec<String> = redis.zrange(keys::lease(&queue.name), 0, -1).await.unwrap();
    eventually(Duration::from_secs(5), "the second run", || async {
        runs.lock().unwrap().len() == 2
    })
    .await;
    workers.stop().await;

    // Assert: scheduled as Go's schedule leaves a task, due at the time
    // given (whole seconds, rounded up), no retry nor failure counted ...
    let (due_at, due) = until.lock().unwrap().unwrap();
    let due_score = due.timestamp() + i64::from(due.timestamp_subsec_nanos() > 0);
    assert_eq!(
        in_scheduled,
        vec![("deferred".to_string(), due_score as f64)]
    );
    assert_eq!(state, "scheduled");
    assert_eq!((message.retried, message.error_msg.as_str()), (0, ""));
    assert!(
        active.is_empty() && leased.is_empty(),
        "{active:?} {leased:?}"
    );
    let failed: Option<i64> = redis.get(keys::failed_total(&queue.name)).await.unwrap();
    assert_eq!(failed, None, "no failure counted");
    // ... and run again at that time, not at the forwarder's next round.
    let (second_at, second) = runs.lock().unwrap()[1].clone();
    assert_eq!((second.retried, second.failed_before), (0, false));
    let late = second_at.saturating_duration_since(due_at);
    assert!(
        second_at + Duration::from_millis(20) >= due_at,
        "ran {:?} early",
        due_at - second_at
    );
    // Woken by the consumer's own timer, not by the forwarder (60 s here).
    assert!(late < Duration::from_secs(20), "ran {late:?} late");
    assert_eq!(queue.pending_ids().await, Vec::<String>::new());
}

#[tokio::test]
async fn a_task_promoted_before_its_deferral_is_written_runs_again_at_once() {
    // Arrange: a handler whose first run is woken (as a limit's freed slot
    // wakes its waiter) while still active, then defers for a minute.
    let queue = TestQueue::new().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let gone: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut consumer = Consumer::new(
        queue.client.clone(),
        ConsumerOptions {
            forward_interval: Duration::from_secs(60),
            ..options(&queue.name)
        },
    );
    consumer.handle("job:woken", {
        let (client, runs, gone) = (queue.client.clone(), runs.clone(), gone.clone());
        move |task: Task| {
            let (client, runs, gone) = (client.clone(), runs.clone(), gone.clone());
            async move {
                if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                    let ids = [task.id.clone(), "no-such-task".to_string()];
                    *gone.lock().unwrap() = client.promote(&task.queue, &ids).await?;
                    return Err(HandlerError::defer(Utc::now() + TimeDelta::seconds(60)));
                }
                Ok(())
            }
        }
    });
    let workers = Workers::start(vec![consumer]);
    let started = Instant::now();

    // Act
    enqueue(
        &queue.client,
        &[NewTask::new("job:woken", "woken", b"{}".to_vec()).queue(&queue.name)],
    )
    .await;
    eventually(Duration::from_secs(5), "the second run", || async {
        runs.load(Ordering::SeqCst) == 2
    })
    .await;
    let took = started.elapsed();
    workers.stop().await;

    // Assert
    // At once, not after the deferral's 60 s.
    assert!(took < Duration::from_secs(30), "took {took:?}");
    assert_eq!(*gone.lock().unwrap(), vec!["no-such-task".to_string()]);
    let mut redis = queue.connection().await;
    let woken: Vec<String> = redis.zrange(keys::woken(&queue.name), 0, -1).await.unwrap();
    assert!(woken.is_empty(), "the mark is used up: {woken:?}");
}

/// A task as a handler would see it, for the limiter alone.
fn task(queue: &TestQueue, id: &str) -> Task {
    Task {
        task_type: "listener:limitTested:direct".into(),
        id: id.into(),
        payload: Vec::new(),
        headers: Default::default(),
        queue: queue.name.clone(),
        retried: 0,
        max_retry: 25,
        failed_before: false,
    }
}

#[tokio::test]
async fn a_slot_handed_to_a_waiter_that_is_gone_passes_on_and_a_killed_workers_slot_frees_itself() {
    // Arrange: one slot, leased for 1 s.
    let queue = TestQueue::new().await;
    let listener = TestListener::new(&queue);
    let limits = Limits {
        concurrency: Some(1),
        rate: None,
    };
    let limiter = Limiter::new(queue.client.clone(), EVENT, &listener.name, limits)
        .with_slot_lease(Duration::from_secs(1));
    let Acquired::Granted(first) = limiter.acquire("", &task(&queue, "a")).await.unwrap() else {
        panic!("the first run takes the free slot");
    };
    // A waiter whose task is not in the queue (deleted meanwhile).
    let waiting = limiter.acquire("", &task(&queue, "gone")).await.unwrap();
    assert!(matches!(
        waiting,
        Acquired::Wait {
            limit: LimitKind::Concurrency,
            ..
        }
    ));

    // Act: the slot freed is handed to the gone waiter, which passes it on.
    first.release().await;
    let third = limiter.acquire("", &task(&queue, "c")).await.unwrap();

    // Assert
    let Acquired::Granted(third) = third else {
        panic!("the slot came back: {third:?}");
    };

    // Arrange: a worker killed while it holds the slot (its runtime, with
    // the lease's renewal, is gone; nothing released it).
    third.release().await;
    let killed = {
        let (name, task) = (listener.name.clone(), task(&queue, "killed"));
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let client = worker_client().await;
                let limiter = Limiter::new(client, EVENT, &name, limits)
                    .with_slot_lease(Duration::from_secs(1));
                let acquired = limiter.acquire("", &task).await.unwrap();
                assert!(matches!(acquired, Acquired::Granted(_)), "{acquired:?}");
                std::mem::forget(acquired);
            });
        })
    };
    tokio::task::spawn_blocking(move || killed.join().unwrap())
        .await
        .unwrap();
    let started = Instant::now();
    assert!(matches!(
        limiter.acquire("", &task(&queue, "d")).await.unwrap(),
        Acquired::Wait { .. }
    ));

    // Act + Assert: within the lease, the slot is free again.
    eventually(
        Duration::from_secs(20),
        "the killed worker's slot",
        || async {
            matches!(
                limiter.acquire("", &task(&queue, "d")).await.unwrap(),
                Acquired::Granted(_)
            )
        },
    )
    .await;
    // Freed by its lease (1 s), not held for ever.
    let took = started.elapsed();
    eprintln!("the killed worker's slot was free again after {took:?}");
}

#[tokio::test]
async fn a_permit_dropped_unreleased_frees_its_slot_at_once() {
    // Arrange: one slot, leased for the default 30 s, taken by a run whose
    // handler is dropped (a timeout, a panic) with its permit.
    let queue = TestQueue::new().await;
    let listener = TestListener::new(&queue);
    let limits = Limits {
        concurrency: Some(1),
        rate: None,
    };
    let limiter = Limiter::new(queue.client.clone(), EVENT, &listener.name, limits);
    let acquired = limiter.acquire("", &task(&queue, "dropped")).await.unwrap();
    assert!(matches!(acquired, Acquired::Granted(_)), "{acquired:?}");

    // Act
    drop(acquired);

    // Assert: free again well within its lease.
    eventually(Duration::from_secs(2), "the dropped run's slot", || async {
        matches!(
            limiter.acquire("", &task(&queue, "next")).await.unwrap(),
            Acquired::Granted(_)
        )
    })
    .await;
}

#[tokio::test]
async fn a_listener_without_limits_is_granted_without_writing_to_valkey() {
    let queue = TestQueue::new().await;
    let listener = TestListener::new(&queue);
    let limiter = Limiter::new(
        queue.client.clone(),
        EVENT,
        &listener.name,
        Limits::default(),
    );

    let acquired = limiter
        .acquire("tenant", &task(&queue, "free"))
        .await
        .unwrap();

    let Acquired::Granted(permit) = acquired else {
        panic!("{acquired:?}");
    };
    permit.release().await;
    let mut redis = queue.connection().await;
    let written: Vec<String> = redis
        .keys(format!("limits:{{{}}}:*", listener.task_type()))
        .await
        .unwrap();
    assert!(written.is_empty(), "{written:?}");
}

#[tokio::test]
async fn a_rate_tells_each_waiting_run_its_own_turn() {
    // Arrange: 5/s, evenly spaced (turns 200 ms apart, further off than
    // the 100 ms a run sleeps rather than waits), and five runs at once.
    let queue = TestQueue::new().await;
    let listener = TestListener::new(&queue);
    let limits = Limits {
        concurrency: None,
        rate: Some(Rate::per_second(5)),
    };
    let metrics = LimitMetrics::default();
    let limiter = Limiter::new(queue.client.clone(), EVENT, &listener.name, limits)
        .with_metrics(metrics.clone());

    // Act: each call timed, since a run's turn comes back as a wait from
    // Valkey's clock, which the limiter adds to its own clock on the reply.
    let mut waits = Vec::new();
    let mut took = Vec::new();
    for n in 0..5 {
        let called = Instant::now();
        let acquired = limiter
            .acquire("", &task(&queue, &format!("t{n}")))
            .await
            .unwrap();
        took.push(called.elapsed());
        waits.push(match acquired {
            Acquired::Granted(_) => None,
            Acquired::Wait { until, limit } => {
                assert_eq!(limit, LimitKind::Rate);
                Some(until)
            }
        });
    }
    // One back early is told to wait the rest of its turn, not a new one.
    let called = Instant::now();
    let again = limiter.acquire("", &task(&queue, "t4")).await.unwrap();
    took.push(called.elapsed());

    // Assert: the first runs, the others 200 ms apart. A turn told to the
    // run is off its place on Valkey's clock by at most the time its call
    // took (Valkey's `TIME` and the reply both fall within it), so two
    // turns are 200 ms apart give or take the time their two calls took.
    assert!(waits[0].is_none(), "{waits:?}");
    let turns: Vec<DateTime<Utc>> = waits[1..].iter().map(|w| w.unwrap()).collect();
    let slack = |a: usize, b: usize| (took[a] + took[b]).as_millis() as i64 + 1;
    for (n, pair) in turns.windows(2).enumerate() {
        let gap = (pair[1] - pair[0]).num_milliseconds();
        let slack = slack(n + 1, n + 2);
        assert!(
            (gap - 200).abs() <= slack,
            "turns {gap} ms apart, calls taking {took:?}: {turns:?}"
        );
    }
    let Acquired::Wait { until, .. } = again else {
        panic!("{again:?}");
    };
    let drift = (until - turns[3]).num_milliseconds().abs();
    assert!(
        drift <= slack(4, 5),
        "the same turn, {drift} ms apart, calls taking {took:?}"
    );
    let labels = LimitLabels {
        event: EVENT.into(),
        listener: listener.name.clone(),
        limit: "rate".into(),
    };
    assert_eq!(metrics.deferred.get_or_create(&labels).get(), 5);
}

/// The benchmark of the rate limit (not run by default: 60 s): three
/// workers run a listener limited to 50/s, with a backlog, for 60 s; the
/// rate achieved over the 60 s after the first start, and its deviation
/// second by second, are printed. `scripts/bench/limits` runs it.
#[tokio::test]
#[ignore = "a 60 s benchmark: scripts/bench/limits"]
async fn bench_a_rate_of_50_per_second_over_60_s() {
    let queue = TestQueue::new().await;
    let listener = TestListener::new(&queue);
    let limits = Limits {
        concurrency: None,
        rate: Some(Rate::per_second(50)),
    };
    let starts: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let metrics = LimitMetrics::default();
    let mut consumers = Vec::new();
    for _ in 0..3 {
        let client = worker_client().await;
        let limiter = Limiter::new(client.clone(), EVENT, &listener.name, limits)
            .with_metrics(metrics.clone());
        let mut consumer = Consumer::new(client, options(&queue.name));
        let starts = starts.clone();
        consumer.handle(listener.task_type(), move |task: Task| {
            let (limiter, starts) = (limiter.clone(), starts.clone());
            async move {
                match limiter.acquire("", &task).await? {
                    Acquired::Granted(permit) => {
                        starts.lock().unwrap().push(Instant::now());
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        permit.release().await;
                        Ok(())
                    }
                    Acquired::Wait { until, .. } => Err(HandlerError::defer(until)),
                }
            }
        });
        consumers.push(consumer);
    }
    // More than 60 s of work at 50/s, so that the limit, not the backlog,
    // sets the pace throughout.
    enqueue(&queue.client, &listener.tasks(3_300, |_| String::new())).await;
    let workers = Workers::start(consumers);
    eventually(Duration::from_secs(30), "the first start", || async {
        !starts.lock().unwrap().is_empty()
    })
    .await;
    let first = starts.lock().unwrap()[0];
    let window = Duration::from_secs(60);
    tokio::time::sleep_until((first + window + Duration::from_millis(100)).into()).await;
    workers.stop().await;

    let starts = starts.lock().unwrap();
    let mut per_second = vec![0_u32; 60];
    for start in starts.iter() {
        let second = start.duration_since(first).as_secs() as usize;
        if second < 60 {
            per_second[second] += 1;
        }
    }
    let total: u32 = per_second.iter().sum();
    let mean = f64::from(total) / 60.0;
    let deviation = (per_second
        .iter()
        .map(|n| (f64::from(*n) - mean).powi(2))
        .sum::<f64>()
        / 60.0)
        .sqrt();
    let in_window: Vec<Instant> = starts
        .iter()
        .copied()
        .filter(|s| s.duration_since(first) < window)
        .collect();
    let gaps: Vec<f64> = in_window
        .windows(2)
        .map(|pair| pair[1].duration_since(pair[0]).as_secs_f64() * 1000.0)
        .collect();
    let gap_mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
    let gap_deviation =
        (gaps.iter().map(|g| (g - gap_mean).powi(2)).sum::<f64>() / gaps.len() as f64).sqrt();
    let deferred = metrics
        .deferred
        .get_or_create(&LimitLabels {
            event: EVENT.into(),
            listener: listener.name.clone(),
            limit: "rate".into(),
        })
        .get();
    println!(
        "limits bench: rate 50/s, 3 workers, 60 s: {total} starts, {mean:.2}/s achieved \
         ({:+.2} % of the limit); per second: sd {deviation:.2}, min {}, max {}; \
         gap between starts: mean {gap_mean:.2} ms, sd {gap_deviation:.2} ms; \
         {deferred} deferrals in all",
        (mean / 50.0 - 1.0) * 100.0,
        per_second.iter().min().unwrap(),
        per_second.iter().max().unwrap(),
    );
    assert!(total <= 50 * 60 + 1, "{total} starts in 60 s");
}

/// An event of the registration test, of tenant `tenant`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Mailed {
    tenant: String,
}

use crate::dispatch::Event as _;

impl crate::dispatch::Event for Mailed {
    const NAME: &'static str = "limitMailed";
}

/// Three workers with the worker's own handlers (`handle_events`) and
/// `listeners`, on `queue`.
fn workers_with(
    queue: &TestQueue,
    clients: Vec<Client>,
    pool: &PgPool,
    listeners: crate::worker::listeners::Listeners,
) -> Workers {
    let listeners = Arc::new(listeners);
    let consumers = clients
        .into_iter()
        .map(|client| {
            let mut consumer = Consumer::new(client.clone(), options(&queue.name));
            crate::worker::handle_events(
                &mut consumer,
                &crate::worker::ordering::Ordering::new(
                    pool.clone().clone(),
                    client,
                    Vec::new(),
                    Duration::from_secs(60),
                ),
                crate::database::Transactor::new(pool.clone()),
                Arc::clone(&listeners),
                crate::worker::metrics::ListenerMetrics::default(),
                LimitMetrics::default(),
            );
            consumer
        })
        .collect();
    Workers::start(consumers)
}

#[tokio::test]
async fn a_listener_registered_with_limits_keeps_them_on_every_worker() {
    // Arrange: a listener registered with at most 2 at once and 10/s with
    // a burst of 3, both per tenant; 90 events of three tenants (30 each,
    // more than a second's 10 + 3), through the worker's own fan-out and
    // listener handlers on three workers.
    use crate::worker::listeners::{ListenerContext, ListenerOptions, Listeners};
    let (db, queue) = (TestDatabase::empty().await, TestQueue::new().await);
    runs_table(&db).await;
    let mut listeners = Listeners::new();
    let rate = Rate::per_second(10).with_burst(3);
    let options = ListenerOptions::new()
        .concurrency(2)
        .rate(rate)
        .partition_by(|event: &Mailed| event.tenant.clone());
    listeners.listen_with(
        "email",
        options,
        |event: Mailed, ctx: ListenerContext| async move {
            let started = Utc::now();
            tokio::time::sleep(Duration::from_millis(40)).await;
            sqlx::query(
                "INSERT INTO runs (task_id, part, started, ended) VALUES ($1, $2, $3, now())",
            )
            .bind(ctx.event_id().to_string())
            .bind(&event.tenant)
            .bind(started)
            .execute(ctx.pool())
            .await?;
            Ok(())
        },
    );
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(worker_client().await);
    }
    let workers = workers_with(&queue, clients, &db.pool, listeners);
    let tasks: Vec<NewTask> = (0..90)
        .map(|i| {
            let envelope = crate::outbox::Envelope::new(
                Mailed::NAME,
                serde_json::json!({"tenant": format!("tenant-{}", i % 3)}),
            );
            NewTask::new(
                format!("event:{}", Mailed::NAME),
                envelope.id.to_string(),
                serde_json::to_vec(&envelope).unwrap(),
            )
            .queue(&queue.name)
        })
        .collect();

    // Act
    enqueue(&queue.client, &tasks).await;
    eventually(RATED_RUNS_CEILING, "90 runs", || async {
        run_count(&db.pool).await == 90
    })
    .await;
    workers.stop().await;

    // Assert
    let runs = runs(&db.pool).await;
    assert_each_ran_once(&runs, 90);
    for tenant in ["tenant-0", "tenant-1", "tenant-2"] {
        let most = most_at_once(runs.iter().filter(|(_, part, ..)| part == tenant));
        assert!(most <= 2, "{tenant}: {most} ran at once");
    }
    let starts: Vec<DateTime<Utc>> = runs.iter().map(|(_, _, started, _)| *started).collect();
    // Per tenant: the rate is per partition too, so no second holds more
    // than 10 + 3 of a tenant's starts (without the rate, its concurrency
    // alone would start its 30 runs of 40 ms within a second).
    let period = TimeDelta::from_std(rate.per).unwrap();
    let bound = usize::try_from(rate.count + rate.burst).unwrap();
    for tenant in ["tenant-0", "tenant-1", "tenant-2"] {
        let mine: Vec<DateTime<Utc>> = runs
            .iter()
            .filter(|(_, part, ..)| part == tenant)
            .map(|(_, _, started, _)| *started)
            .collect();
        let most = mine
            .iter()
            .map(|from| {
                mine.iter()
                    .filter(|s| *s >= from && **s < *from + period)
                    .count()
            })
            .max()
            .unwrap();
        assert!(
            most <= bound,
            "{tenant}: {most} starts in one second, more than {bound}"
        );
    }
    let overall = most_at_once(&runs);
    eprintln!(
        "limits through the listener: {} runs, at most {overall} at once overall",
        starts.len()
    );
    assert!(
        overall > 2,
        "the concurrency limit is per tenant: {overall} at once overall"
    );
}

#[test]
fn worker_limits_replace_a_listeners_own_and_name_an_unknown_listener() {
    use crate::worker::limits::parse_overrides;
    use crate::worker::listeners::{ListenerContext, ListenerOptions, Listeners};
    let mut listeners = Listeners::new();
    listeners.listen_with(
        "email",
        ListenerOptions::new().concurrency(5),
        |_: Mailed, _: ListenerContext| async { Ok(()) },
    );
    listeners
        .override_limits(&parse_overrides("limitMailed.email=rate:10/s").unwrap())
        .unwrap();
    let email = &listeners.of(Mailed::NAME)[0];
    assert_eq!(email.limits().concurrency, None, "replaced, not merged");
    assert_eq!(email.limits().rate, Some(Rate::per_second(10)));

    let err = listeners
        .override_limits(&parse_overrides("limitMailed.sms=rate:1/s").unwrap())
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "WORKER_LIMITS names `limitMailed.sms`, which is no listener of this service \
         (its listeners: limitMailed.email)"
    );
}

/// A killed worker's slot frees itself when its lease runs out, also while
/// another run holds a slot of the same limit and keeps renewing it (so
/// that the holders' key itself never expires): each holder's lease is
/// its own.
#[tokio::test]
async fn a_killed_workers_slot_frees_itself_while_another_run_keeps_renewing_its_own() {
    // Arrange: two slots, leased for 1 s; one held by a live run.
    let queue = TestQueue::new().await;
    let listener = TestListener::new(&queue);
    let limits = Limits {
        concurrency: Some(2),
        rate: None,
    };
    let limiter = Limiter::new(queue.client.clone(), EVENT, &listener.name, limits)
        .with_slot_lease(Duration::from_secs(1));
    let Acquired::Granted(live) = limiter.acquire("", &task(&queue, "live")).await.unwrap() else {
        panic!("the live run takes a free slot");
    };
    // The other, by a worker killed while it holds it (its runtime, with
    // the lease's renewal, is gone; nothing released it).
    let killed = {
        let (name, task) = (listener.name.clone(), task(&queue, "killed"));
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let client = worker_client().await;
                let limiter = Limiter::new(client, EVENT, &name, limits)
                    .with_slot_lease(Duration::from_secs(1));
                let acquired = limiter.acquire("", &task).await.unwrap();
                assert!(matches!(acquired, Acquired::Granted(_)), "{acquired:?}");
                std::mem::forget(acquired);
            });
        })
    };
    tokio::task::spawn_blocking(move || killed.join().unwrap())
        .await
        .unwrap();
    assert!(matches!(
        limiter.acquire("", &task(&queue, "next")).await.unwrap(),
        Acquired::Wait { .. }
    ));

    // Act + Assert: the killed worker's slot comes free, the live run's
    // lease renewed all along.
    eventually(
        Duration::from_secs(20),
        "the killed worker's slot, beside a renewed one",
        || async {
            matches!(
                limiter.acquire("", &task(&queue, "next")).await.unwrap(),
                Acquired::Granted(_)
            )
        },
    )
    .await;
    live.release().await;
}
