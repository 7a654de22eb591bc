//! The queue layer against a real Valkey (or Redis): what is stored is what
//! Go asynq stores, and tasks move between states as a Go worker moves them.
//!
//! The server is `VALKEY_ADDR` (default 127.0.0.1:6379). Each test works in
//! its own queue, `test_<uuid>`, and deletes that queue's keys when it ends,
//! also when it fails; nothing else on the server is touched. The test that
//! pauses the server starts one of its own (`VALKEY_SERVER`, or
//! `valkey-server` or `redis-server` on PATH; skipped without one, and
//! failed under `CI=true`).
//!
//! The last tests run the worker's own event handlers (the fan-out and the
//! listener tasks) on the consumer.

#![cfg(feature = "worker")]

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message as _;
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::database::Transactor;
use crate::dispatch::Event;
use crate::outbox::Envelope;
use crate::queue::message::ServerInfo;
use crate::queue::message::TaskMessage;
use crate::queue::message::WorkerInfo;
use crate::queue::{
    Client, Consumer, ConsumerOptions, EnqueueOutcome, HandlerError, NewTask, QueueError,
    RunOutcome, Task, keys, scripts,
};
use crate::worker::handle_events;
use crate::worker::listeners::ListenerContext;
use crate::worker::listeners::Listeners;
use crate::worker::listeners::SkipRetry;
use crate::worker::metrics::{ListenerLabels, ListenerMetrics};
use crate::worker::task_names::listener_task_id;

use super::support::{self, OwnServer, eventually, valkey_addr};

/// A queue of its own for one test. Dropping it deletes the queue's keys.
struct TestQueue {
    name: String,
    client: Client,
    redis: redis::aio::MultiplexedConnection,
}

impl TestQueue {
    async fn new() -> Self {
        Self::on(&valkey_addr()).await
    }

    /// A queue of its own on the server at `addr`.
    async fn on(addr: &str) -> Self {
        let name = format!("test_{}", uuid::Uuid::now_v7().simple());
        let client = Client::connect(addr, None, 0)
            .await
            .expect("these tests need Valkey or Redis at VALKEY_ADDR (default 127.0.0.1:6379)");
        let redis = redis::Client::open(format!("redis://{addr}/"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        Self {
            name,
            client,
            redis,
        }
    }

    fn task(&self, task_type: &str, id: &str) -> NewTask {
        NewTask::new(task_type, id, format!("payload of {id}").into_bytes()).queue(&self.name)
    }

    async fn enqueue(&self, tasks: &[NewTask]) -> Vec<EnqueueOutcome> {
        self.client
            .enqueue(tasks)
            .await
            .expect("the round trip succeeds")
            .into_iter()
            .map(|outcome| outcome.expect("each task is accepted"))
            .collect()
    }

    async fn state(&self, id: &str) -> Option<String> {
        self.redis
            .clone()
            .hget(keys::task(&self.name, id), "state")
            .await
            .unwrap()
    }

    /// The stored message, split into protobuf fields by [`proto_fields`].
    async fn stored_fields(&self, id: &str) -> Fields {
        let msg: Vec<u8> = self
            .redis
            .clone()
            .hget(keys::task(&self.name, id), "msg")
            .await
            .unwrap();
        proto_fields(&msg)
    }

    async fn pending(&self) -> Vec<String> {
        self.redis
            .clone()
            .lrange(keys::pending(&self.name), 0, -1)
            .await
            .unwrap()
    }

    async fn zset(&self, key: String) -> Vec<(String, f64)> {
        self.redis
            .clone()
            .zrange_withscores(key, 0, -1)
            .await
            .unwrap()
    }

    async fn counter(&self, key: String) -> i64 {
        let value: Option<i64> = self.redis.clone().get(key).await.unwrap();
        value.unwrap_or(0)
    }

    /// Consumer options for this queue, with intervals short enough for tests.
    fn options(&self) -> ConsumerOptions {
        ConsumerOptions {
            queues: self.name.parse().unwrap(),
            concurrency: 4,
            shutdown_timeout: Duration::from_secs(2),
            poll_interval: Duration::from_millis(50),
            forward_interval: Duration::from_millis(100),
            recover_interval: Duration::from_millis(100),
            retry_delay: |_| Duration::ZERO,
            ..ConsumerOptions::default()
        }
    }
}

impl Drop for TestQueue {
    fn drop(&mut self) {
        let Ok(mut conn) = redis::Client::open(format!("redis://{}/", valkey_addr()))
            .and_then(|client| client.get_connection())
        else {
            return;
        };
        let pattern = format!("{}*", keys::queue_prefix(&self.name));
        let keys: Vec<String> = redis::Commands::scan_match(&mut conn, &pattern)
            .map(|iter| iter.filter_map(Result::ok).collect())
            .unwrap_or_default();
        for key in keys {
            let _: redis::RedisResult<()> = redis::Commands::del(&mut conn, key);
        }
        let _: redis::RedisResult<()> =
            redis::Commands::srem(&mut conn, keys::ALL_QUEUES, &self.name);
    }
}

/// A consumer running in the background until [`Running::stop`].
struct Running {
    shutdown: CancellationToken,
    handle: JoinHandle<Result<(), QueueError>>,
}

impl Running {
    fn start(consumer: Consumer) -> Self {
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn(consumer.run(shutdown.clone().cancelled_owned()));
        Self { shutdown, handle }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.handle
            .await
            .expect("the consumer does not panic")
            .expect("the consumer stops cleanly");
    }
}

/// Protobuf fields by number: varints as integers, the rest as bytes.
type Fields = HashMap<u64, Vec<u8>>;

/// Splits a protobuf message into its fields without using the crate's
/// own schema, so that the tags are checked against asynq.proto itself.
fn proto_fields(mut bytes: &[u8]) -> Fields {
    fn varint(bytes: &mut &[u8]) -> u64 {
        let mut value = 0;
        for shift in (0..64).step_by(7) {
            let byte = bytes[0];
            *bytes = &bytes[1..];
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
        }
        value
    }
    let mut fields = Fields::new();
    while !bytes.is_empty() {
        let key = varint(&mut bytes);
        let value = match key & 7 {
            0 => varint(&mut bytes).to_string().into_bytes(),
            2 => {
                let len = varint(&mut bytes) as usize;
                let (value, rest) = bytes.split_at(len);
                bytes = rest;
                value.to_vec()
            }
            other => panic!("unexpected wire type {other}"),
        };
        fields.insert(key >> 3, value);
    }
    fields
}

fn text(fields: &Fields, number: u64) -> String {
    String::from_utf8(fields.get(&number).cloned().unwrap_or_default()).unwrap()
}

/// A TCP proxy to the server that delays every client write by `delay`
/// and counts the connections made through it.
fn slow_proxy(delay: Duration) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let connections = Arc::new(AtomicUsize::new(0));
    let counter = connections.clone();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            counter.fetch_add(1, Ordering::SeqCst);
            let server = TcpStream::connect(valkey_addr()).unwrap();
            let (client_read, server_write) =
                (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || pipe_bytes(client_read, server_write, delay));
            std::thread::spawn(move || pipe_bytes(server, client, Duration::ZERO));
        }
    });
    (addr, connections)
}

fn pipe_bytes(mut from: TcpStream, mut to: TcpStream, delay: Duration) {
    let mut buffer = vec![0; 64 * 1024];
    while let Ok(read) = from.read(&mut buffer) {
        if read == 0 {
            break;
        }
        std::thread::sleep(delay);
        if to.write_all(&buffer[..read]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

#[tokio::test]
async fn a_batch_of_1000_tasks_is_enqueued_in_one_pipelined_round_trip() {
    // Arrange: every write to the server is delayed by 100 ms, so one
    // round trip per task would take 100 s.
    let queue = TestQueue::new().await;
    let (proxy, connections) = slow_proxy(Duration::from_millis(100));
    let client = Client::connect(&proxy, None, 0).await.unwrap();
    let tasks: Vec<NewTask> = (0..1000)
        .map(|n| queue.task("event:orderPlaced", &format!("order-{n}")))
        .collect();

    // Act
    let start = Instant::now();
    let outcomes = client.enqueue(&tasks).await.unwrap();
    let elapsed = start.elapsed();

    // Assert
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
    assert_eq!(
        connections.load(Ordering::SeqCst),
        1,
        "one shared connection"
    );
    assert_eq!(outcomes.len(), 1000);
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Ok(EnqueueOutcome::Enqueued)))
    );
    let mut pending = queue.pending().await;
    pending.sort();
    let mut expected: Vec<String> = (0..1000).map(|n| format!("order-{n}")).collect();
    expected.sort();
    assert_eq!(pending, expected);
}

#[tokio::test]
async fn a_repeated_enqueue_is_reported_duplicate_per_task() {
    // Arrange
    let queue = TestQueue::new().await;
    queue.enqueue(&[queue.task("event:a", "first")]).await;

    // Act
    let outcomes = queue
        .client
        .enqueue(&[
            queue.task("event:a", "first"),
            queue.task("event:a", "second"),
            queue.task("event:a", ""),
            queue.task("event:a", "second"),
        ])
        .await
        .unwrap();

    // Assert
    assert!(matches!(outcomes[0], Ok(EnqueueOutcome::Duplicate)));
    assert!(matches!(outcomes[1], Ok(EnqueueOutcome::Enqueued)));
    assert!(matches!(outcomes[2], Err(QueueError::InvalidTask(_))));
    assert!(matches!(outcomes[3], Ok(EnqueueOutcome::Duplicate)));
    assert_eq!(queue.pending().await.len(), 2);
}

#[tokio::test]
async fn twenty_concurrent_enqueues_of_one_id_enqueue_it_once() {
    // Arrange: twenty clients, twenty connections.
    let queue = TestQueue::new().await;
    let mut clients = Vec::new();
    for _ in 0..20 {
        clients.push(Client::connect(&valkey_addr(), None, 0).await.unwrap());
    }

    // Act
    let mut racers = tokio::task::JoinSet::new();
    for client in clients {
        let task = queue.task("event:a", "contested");
        racers.spawn(async move { client.enqueue(&[task]).await.unwrap().remove(0).unwrap() });
    }
    let outcomes = racers.join_all().await;

    // Assert
    let enqueued = outcomes
        .iter()
        .filter(|o| **o == EnqueueOutcome::Enqueued)
        .count();
    assert_eq!(enqueued, 1);
    assert_eq!(queue.pending().await, vec!["contested".to_string()]);
}

#[tokio::test]
async fn a_stored_task_is_what_a_go_asynq_worker_expects() {
    // Arrange
    let queue = TestQueue::new().await;
    let task = queue
        .task("event:orderPlaced", "0191-order")
        .max_retry(7)
        .timeout(Duration::from_secs(90))
        .retention(Duration::from_secs(3600));

    // Act
    queue.enqueue(&[task]).await;

    // Assert: asynq.proto field numbers.
    let fields = queue.stored_fields("0191-order").await;
    assert_eq!(text(&fields, 1), "event:orderPlaced", "type");
    assert_eq!(text(&fields, 2), "payload of 0191-order", "payload");
    assert_eq!(text(&fields, 3), "0191-order", "id");
    assert_eq!(text(&fields, 4), queue.name, "queue");
    assert_eq!(text(&fields, 5), "7", "retry");
    assert_eq!(text(&fields, 8), "90", "timeout");
    assert_eq!(text(&fields, 12), "3600", "retention");
    for unset in [6, 7, 9, 10, 11, 13, 14, 15] {
        assert!(!fields.contains_key(&unset), "field {unset} is unset");
    }
    assert_eq!(queue.state("0191-order").await.as_deref(), Some("pending"));
    let pending_since: i64 = queue
        .redis
        .clone()
        .hget(keys::task(&queue.name, "0191-order"), "pending_since")
        .await
        .unwrap();
    let now_ns = chrono::Utc::now().timestamp_nanos_opt().unwrap();
    assert!(
        (now_ns - pending_since).abs() < 60_000_000_000,
        "nanoseconds"
    );
    let registered: bool = queue
        .redis
        .clone()
        .sismember(keys::ALL_QUEUES, &queue.name)
        .await
        .unwrap();
    assert!(registered, "the queue is listed in asynq:queues");
}

#[tokio::test]
async fn the_consumer_runs_handlers_and_completes_tasks() {
    // Arrange
    let queue = TestQueue::new().await;
    let ran = Arc::new(Mutex::new(Vec::new()));
    let mut consumer = Consumer::new(queue.client.clone(), queue.options());
    let log = ran.clone();
    consumer.handle("event:orderPlaced", move |task: Task| {
        let log = log.clone();
        async move {
            log.lock()
                .unwrap()
                .push((task.id, task.payload, task.retried));
            Ok(())
        }
    });
    let kept = queue
        .task("event:orderPlaced", "kept")
        .retention(Duration::from_secs(3600));
    let dropped = queue.task("event:orderPlaced", "dropped");
    queue.enqueue(&[kept.clone(), dropped.clone()]).await;

    // Act
    let running = Running::start(consumer);
    eventually(Duration::from_secs(10), "both tasks to finish", || async {
        queue.state("kept").await.as_deref() == Some("completed")
            && queue.state("dropped").await.is_none()
    })
    .await;
    running.stop().await;

    // Assert
    let mut ran = ran.lock().unwrap().clone();
    ran.sort();
    assert_eq!(
        ran,
        vec![
            ("dropped".to_string(), b"payload of dropped".to_vec(), 0),
            ("kept".to_string(), b"payload of kept".to_vec(), 0),
        ]
    );
    let completed = queue.zset(keys::completed(&queue.name)).await;
    assert_eq!(completed.len(), 1);
    assert_eq!(completed[0].0, "kept");
    let expires_in = completed[0].1 - chrono::Utc::now().timestamp() as f64;
    assert!((3500.0..=3600.0).contains(&expires_in), "{expires_in}");
    assert_eq!(queue.counter(keys::processed_total(&queue.name)).await, 2);
    assert!(queue.zset(keys::lease(&queue.name)).await.is_empty());
    // The retained id still deduplicates; the deleted one can be reused.
    assert_eq!(
        queue.enqueue(&[kept, dropped]).await,
        vec![EnqueueOutcome::Duplicate, EnqueueOutcome::Enqueued]
    );
}

/// A consumer of `queue` that polls only every 15-45 s and reports when
/// its `job:ping` handler ran; its consumer runs on `client`.
fn sleepy_consumer(
    queue: &TestQueue,
    client: Client,
    wake_on_published: bool,
) -> (Running, tokio::sync::mpsc::UnboundedReceiver<Instant>) {
    let (ran, runs) = tokio::sync::mpsc::unbounded_channel();
    let options = ConsumerOptions {
        poll_interval: Duration::from_secs(30),
        wake_on_published,
        ..queue.options()
    };
    let mut consumer = Consumer::new(client, options);
    consumer.handle("job:ping", move |_task: Task| {
        let ran = ran.clone();
        async move {
            ran.send(Instant::now()).ok();
            Ok(())
        }
    });
    (Running::start(consumer), runs)
}

/// What the consumer logs once a poll found every queue empty: from then
/// on it sleeps until an enqueue wakes it or its next poll.
const IDLE: &str = "every queue empty: idle until an enqueue or the next poll";

/// Waits until the consumer logging to `logs` has found its queues empty
/// and gone to sleep.
async fn until_idle(logs: &CapturedLogs) {
    eventually(
        Duration::from_secs(10),
        "the consumer to find its queue empty",
        || async { logs.contains(IDLE) },
    )
    .await;
}

#[tokio::test]
async fn an_idle_consumer_wakes_when_its_own_process_enqueues() {
    let logs = CapturedLogs::default();
    let _captured = logs.capture();
    let queue = TestQueue::new().await;
    let (running, mut runs) = sleepy_consumer(&queue, queue.client.clone(), false);
    // Once it found the queue empty, it sleeps for its 15-45 s poll.
    until_idle(&logs).await;

    let enqueued = Instant::now();
    queue.enqueue(&[queue.task("job:ping", "a")]).await;
    let ran = ran_before_the_next_poll(&mut runs).await;
    running.stop().await;

    assert_woke_at_once(ran - enqueued);
}

/// The sleepy consumer's next run, which must come before its first poll
/// could (15 s at the earliest): only a wake-up runs it that soon.
async fn ran_before_the_next_poll(
    runs: &mut tokio::sync::mpsc::UnboundedReceiver<Instant>,
) -> Instant {
    tokio::time::timeout(Duration::from_secs(14), runs.recv())
        .await
        .expect("the handler ran before the consumer's next poll")
        .unwrap()
}

/// A wake-up runs the task at once, not merely before the poll.
fn assert_woke_at_once(took: Duration) {
    assert!(
        took < Duration::from_secs(3),
        "the task ran {took:?} after its enqueue: the wake-up was slow"
    );
}

#[tokio::test]
async fn an_idle_consumer_wakes_when_another_process_publishes_its_enqueue() {
    // A server of the test's own: its one subscriber is this consumer.
    let server = OwnServer::start().await;
    if !support::require(
        "valkey-server or redis-server",
        server.is_some(),
        "set VALKEY_SERVER (gpkit's scripts/test installs valkey-server)",
    ) {
        return;
    }
    let server = server.unwrap();
    let logs = CapturedLogs::default();
    let _captured = logs.capture();
    let queue = TestQueue::on(&server.addr()).await;
    let (running, mut runs) = sleepy_consumer(&queue, queue.client.clone(), true);
    // Another process: a client of its own, publishing its enqueues.
    let other = Client::connect(&server.addr(), None, 0).await.unwrap();
    other.enqueued().set_publish(true);
    // Once it subscribed and found the queue empty, only a published
    // enqueue can wake it before its 15-45 s poll.
    let conn = server.redis().await;
    eventually(
        Duration::from_secs(10),
        "the consumer to subscribe to enqueues",
        || async {
            let (_, subscribers): (String, u64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(crate::queue::wakeup::CHANNEL)
                .query_async(&mut conn.clone())
                .await
                .unwrap();
            subscribers == 1
        },
    )
    .await;
    until_idle(&logs).await;

    let enqueued = Instant::now();
    let outcome = other.enqueue(&[queue.task("job:ping", "b")]).await.unwrap();
    assert_eq!(outcome[0].as_ref().unwrap(), &EnqueueOutcome::Enqueued);
    let ran = ran_before_the_next_poll(&mut runs).await;
    running.stop().await;

    assert_woke_at_once(ran - enqueued);
}

#[tokio::test]
async fn a_failing_handler_is_retried_then_archived() {
    // Arrange
    let queue = TestQueue::new().await;
    let attempts = Arc::new(AtomicUsize::new(0));
    let mut consumer = Consumer::new(queue.client.clone(), queue.options());
    let counter = attempts.clone();
    consumer.handle("job:flaky", move |_task: Task| {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            Err(HandlerError::from(anyhow::anyhow!("payment provider down")))
        }
    });
    queue
        .enqueue(&[queue.task("job:flaky", "flaky").max_retry(2)])
        .await;

    // Act
    let running = Running::start(consumer);
    eventually(
        Duration::from_secs(10),
        "the task to be archived",
        || async { queue.state("flaky").await.as_deref() == Some("archived") },
    )
    .await;
    running.stop().await;

    // Assert: the first run and two retries.
    assert_eq!(attempts.load(Ordering::SeqCst), 3);
    let fields = queue.stored_fields("flaky").await;
    assert_eq!(text(&fields, 6), "2", "retried");
    assert_eq!(text(&fields, 7), "payment provider down", "error_msg");
    let archived = queue.zset(keys::archived(&queue.name)).await;
    assert_eq!(archived.len(), 1);
    assert_eq!(queue.counter(keys::failed_total(&queue.name)).await, 3);
}

#[tokio::test]
async fn a_handler_that_panics_fails_with_the_panic_and_the_consumer_goes_on() {
    // Arrange: a handler that panics on its first run only.
    let queue = TestQueue::new().await;
    let attempts = Arc::new(AtomicUsize::new(0));
    let mut consumer = Consumer::new(queue.client.clone(), queue.options());
    let counter = attempts.clone();
    consumer.handle("job:buggy", move |_task: Task| {
        let first = counter.fetch_add(1, Ordering::SeqCst) == 0;
        async move {
            if first {
                panic!("index out of bounds");
            }
            Ok::<(), HandlerError>(())
        }
    });
    queue.enqueue(&[queue.task("job:buggy", "buggy")]).await;

    // Act
    let running = Running::start(consumer);
    eventually(
        Duration::from_secs(10),
        "the retried run to succeed",
        || async { attempts.load(Ordering::SeqCst) == 2 && queue.state("buggy").await.is_none() },
    )
    .await;
    running.stop().await;

    // Assert: the panic was a failure, recorded as such, then retried.
    assert_eq!(queue.counter(keys::failed_total(&queue.name)).await, 1);
    assert_eq!(queue.counter(keys::processed_total(&queue.name)).await, 2);
}

#[tokio::test]
async fn shutdown_puts_an_unfinished_task_back_to_pending_and_returns() {
    // Arrange
    let queue = TestQueue::new().await;
    let started = Arc::new(tokio::sync::Notify::new());
    let mut options = queue.options();
    options.shutdown_timeout = Duration::from_millis(500);
    let mut consumer = Consumer::new(queue.client.clone(), options);
    let signal = started.clone();
    consumer.handle("job:slow", move |_task: Task| {
        let signal = signal.clone();
        async move {
            signal.notify_one();
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(())
        }
    });
    queue.enqueue(&[queue.task("job:slow", "slow")]).await;
    let running = Running::start(consumer);
    tokio::time::timeout(Duration::from_secs(10), started.notified())
        .await
        .expect("the handler starts");

    // Act
    let start = Instant::now();
    running.stop().await;

    // Assert
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(queue.pending().await, vec!["slow".to_string()]);
    assert_eq!(queue.state("slow").await.as_deref(), Some("pending"));
    assert!(queue.zset(keys::lease(&queue.name)).await.is_empty());
    let active: Vec<String> = queue
        .redis
        .clone()
        .lrange(keys::active(&queue.name), 0, -1)
        .await
        .unwrap();
    assert!(active.is_empty());
    let fields = queue.stored_fields("slow").await;
    assert!(!fields.contains_key(&6), "an interruption is not a failure");
}

#[tokio::test]
async fn a_task_whose_lease_expired_is_recovered_and_runs_again() {
    // Arrange: a worker took the task and died two minutes ago.
    let queue = TestQueue::new().await;
    queue.enqueue(&[queue.task("job:orphan", "orphan")]).await;
    let mut redis = queue.redis.clone();
    let _: () = redis::pipe()
        .rpoplpush(keys::pending(&queue.name), keys::active(&queue.name))
        .hset(keys::task(&queue.name, "orphan"), "state", "active")
        .zadd(
            keys::lease(&queue.name),
            "orphan",
            chrono::Utc::now().timestamp() - 120,
        )
        .query_async(&mut redis)
        .await
        .unwrap();
    let retried = Arc::new(Mutex::new(Vec::new()));
    let mut consumer = Consumer::new(queue.client.clone(), queue.options());
    let log = retried.clone();
    consumer.handle("job:orphan", move |task: Task| {
        let log = log.clone();
        async move {
            log.lock().unwrap().push(task.retried);
            Ok::<(), HandlerError>(())
        }
    });

    // Act
    let running = Running::start(consumer);
    eventually(Duration::from_secs(10), "the orphan to run", || async {
        queue.state("orphan").await.is_none()
    })
    .await;
    running.stop().await;

    // Assert: recovered as a failed run, then run once more.
    assert_eq!(*retried.lock().unwrap(), vec![1]);
}

#[tokio::test]
async fn the_lease_of_a_running_task_is_extended() {
    // Arrange: a 3 s lease, extended every 500 ms, and a 4 s handler.
    let queue = TestQueue::new().await;
    let mut options = queue.options();
    options.lease_duration = Duration::from_secs(3);
    options.heartbeat_interval = Duration::from_millis(500);
    let mut consumer = Consumer::new(queue.client.clone(), options);
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    consumer.handle("job:long", move |_task: Task| {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_secs(4)).await;
            Ok(())
        }
    });
    queue.enqueue(&[queue.task("job:long", "long")]).await;

    // Act
    let running = Running::start(consumer);
    eventually(Duration::from_secs(5), "the task to start", || async {
        queue.state("long").await.as_deref() == Some("active")
    })
    .await;
    let first = queue.zset(keys::lease(&queue.name)).await[0].1;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let later = queue.zset(keys::lease(&queue.name)).await[0].1;
    eventually(Duration::from_secs(10), "the task to finish", || async {
        queue.state("long").await.is_none()
    })
    .await;
    running.stop().await;

    // Assert
    assert!(
        later >= first + 2.0,
        "lease {first} was not extended ({later})"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the lease was never lost");
    assert_eq!(queue.counter(keys::processed_total(&queue.name)).await, 1);
}

#[tokio::test]
async fn a_handler_can_fan_out_follow_up_tasks() {
    // Arrange: the event handler enqueues one task per listener, with ids
    // derived from the event's, as the listener fan-out does.
    let queue = TestQueue::new().await;
    let mut consumer = Consumer::new(queue.client.clone(), queue.options());
    let client = queue.client.clone();
    let queue_name = queue.name.clone();
    consumer.handle("event:orderPlaced", move |task: Task| {
        let (client, queue_name) = (client.clone(), queue_name.clone());
        async move {
            let listeners: Vec<NewTask> = ["sendEmail", "reserveStock"]
                .iter()
                .map(|listener| {
                    NewTask::new(
                        format!("listener:orderPlaced:{listener}"),
                        format!("{}:{listener}", task.id),
                        task.payload.clone(),
                    )
                    .queue(&queue_name)
                })
                .collect();
            for outcome in client.enqueue(&listeners).await? {
                outcome?;
            }
            Ok(())
        }
    });
    let ran = Arc::new(Mutex::new(Vec::new()));
    for listener in ["sendEmail", "reserveStock"] {
        let log = ran.clone();
        consumer.handle(
            format!("listener:orderPlaced:{listener}"),
            move |task: Task| {
                let log = log.clone();
                async move {
                    log.lock().unwrap().push(task.id);
                    Ok(())
                }
            },
        );
    }
    queue
        .enqueue(&[queue.task("event:orderPlaced", "evt-1")])
        .await;

    // Act
    let running = Running::start(consumer);
    eventually(Duration::from_secs(10), "both listeners to run", || async {
        ran.lock().unwrap().len() == 2
    })
    .await;
    running.stop().await;

    // Assert
    let mut ran = ran.lock().unwrap().clone();
    ran.sort();
    assert_eq!(ran, vec!["evt-1:reserveStock", "evt-1:sendEmail"]);
}

#[tokio::test]
async fn a_wrong_password_fails_at_connect_without_showing_it() {
    // Arrange
    let password = secrecy::SecretString::from("hunter2-not-the-password");

    // Act
    let err = match Client::connect(&valkey_addr(), Some(&password), 0).await {
        Ok(_) => panic!("the server requires no password or a different one"),
        Err(err) => err,
    };

    // Assert
    let shown = format!("{err} {err:?}");
    assert!(matches!(err, QueueError::Connect { .. }), "{shown}");
    assert!(!shown.contains("hunter2"), "{shown}");
}

#[tokio::test]
async fn an_unreachable_server_fails_at_connect() {
    // Arrange: a port nothing listens on.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();

    // Act
    let start = Instant::now();
    let result = Client::connect(&format!("127.0.0.1:{port}"), None, 0).await;

    // Assert
    assert!(matches!(result, Err(QueueError::Connect { .. })));
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "{:?}",
        start.elapsed()
    );
}

/// What the code under test logs, captured for a test that waits for a
/// logged event. Only for `#[tokio::test]` (one thread), where every task
/// logs to the subscriber set on the test's thread.
#[derive(Clone, Default)]
struct CapturedLogs(Arc<Mutex<Vec<u8>>>);

impl CapturedLogs {
    fn capture(&self) -> tracing::subscriber::DefaultGuard {
        let subscriber = tracing_subscriber::fmt()
            .with_writer(self.clone())
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    fn contains(&self, text: &str) -> bool {
        String::from_utf8_lossy(&self.0.lock().unwrap()).contains(text)
    }
}

impl Write for CapturedLogs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for CapturedLogs {
    type Writer = Self;

    fn make_writer(&'a self) -> Self {
        self.clone()
    }
}

/// What a run across a server pause left: the server (killed when
/// dropped), a connection to it, and how many times the handler ran.
struct AfterPause {
    _server: OwnServer,
    redis: redis::aio::MultiplexedConnection,
    runs: usize,
}

/// Runs the task `blip` of queue `blip` on a server of the test's own, with
/// a handler that returns `result` only once the test has paused the
/// server; resumes the server once the write that moves the task on has
/// failed, and waits until the task has left `active`. `None` when there
/// is no server binary to run.
async fn finish_a_task_while_the_server_is_paused(
    result: fn() -> Result<(), HandlerError>,
) -> Option<AfterPause> {
    // Arrange
    let logs = CapturedLogs::default();
    let _logging = logs.capture();
    let server = OwnServer::start().await;
    if !support::require(
        "valkey-server or redis-server to pause",
        server.is_some(),
        "set VALKEY_SERVER (gpkit's scripts/test installs valkey-server)",
    ) {
        return None;
    }
    let server = server.unwrap();
    let client = Client::connect(&server.addr(), None, 0).await.unwrap();
    let redis = server.redis().await;
    let (started, finish) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let runs = Arc::new(AtomicUsize::new(0));
    let mut consumer = Consumer::new(
        client.clone(),
        ConsumerOptions {
            queues: "blip".parse().unwrap(),
            poll_interval: Duration::from_millis(50),
            recover_interval: Duration::from_millis(100),
            ..ConsumerOptions::default()
        },
    );
    let (signal, wait, counter) = (started.clone(), finish.clone(), runs.clone());
    consumer.handle("job:blip", move |_task: Task| {
        let (signal, wait, counter) = (signal.clone(), wait.clone(), counter.clone());
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            signal.notify_one();
            wait.notified().await;
            result()
        }
    });
    let task = NewTask::new("job:blip", "blip", vec![]).queue("blip");
    client.enqueue(&[task]).await.unwrap().remove(0).unwrap();
    let running = Running::start(consumer);
    tokio::time::timeout(Duration::from_secs(10), started.notified())
        .await
        .expect("the handler starts");

    // Act: the handler ends while the server answers nothing; the server
    // comes back once the write has failed.
    server.pause();
    finish.notify_one();
    eventually(Duration::from_secs(30), "the write to fail", || async {
        logs.contains("will retry")
    })
    .await;
    server.resume();
    eventually(Duration::from_secs(30), "the task to leave active", || {
        let mut redis = redis.clone();
        async move {
            let active: Vec<String> = redis.lrange(keys::active("blip"), 0, -1).await.unwrap();
            active.is_empty()
        }
    })
    .await;
    running.stop().await;
    Some(AfterPause {
        _server: server,
        redis,
        runs: runs.load(Ordering::SeqCst),
    })
}

#[tokio::test]
async fn a_success_acknowledged_while_the_server_is_paused_completes_once() {
    // Arrange, Act
    let Some(AfterPause {
        _server,
        mut redis,
        runs,
    }) = finish_a_task_while_the_server_is_paused(|| Ok(())).await
    else {
        return;
    };

    // Assert: deleted exactly once, and never run again.
    assert_eq!(runs, 1);
    let exists: bool = redis.exists(keys::task("blip", "blip")).await.unwrap();
    assert!(!exists);
    let processed: i64 = redis.get(keys::processed_total("blip")).await.unwrap();
    assert_eq!(processed, 1);
    let failed: Option<i64> = redis.get(keys::failed_total("blip")).await.unwrap();
    assert_eq!(failed, None);
    let leased: Vec<String> = redis.zrange(keys::lease("blip"), 0, -1).await.unwrap();
    assert!(leased.is_empty());
}

#[tokio::test]
async fn a_failure_recorded_while_the_server_is_paused_is_retried_once() {
    // Arrange, Act
    let Some(AfterPause {
        _server,
        mut redis,
        runs,
    }) = finish_a_task_while_the_server_is_paused(|| {
        Err(HandlerError::from(anyhow::anyhow!("card declined")))
    })
    .await
    else {
        return;
    };

    // Assert: in `:retry` with one failure counted, and not run again.
    assert_eq!(runs, 1);
    let state: Option<String> = redis
        .hget(keys::task("blip", "blip"), "state")
        .await
        .unwrap();
    assert_eq!(state.as_deref(), Some("retry"));
    let msg: Vec<u8> = redis.hget(keys::task("blip", "blip"), "msg").await.unwrap();
    let fields = proto_fields(&msg);
    assert_eq!(text(&fields, 6), "1", "retried");
    assert_eq!(text(&fields, 7), "card declined", "error_msg");
    let failed: i64 = redis.get(keys::failed_total("blip")).await.unwrap();
    assert_eq!(failed, 1);
    let leased: Vec<String> = redis.zrange(keys::lease("blip"), 0, -1).await.unwrap();
    assert!(leased.is_empty());
}

#[tokio::test]
async fn a_task_that_cannot_be_recovered_does_not_stop_the_recovery_of_others() {
    // Arrange: two expired leases. The older one's task is not in the
    // active list (an inconsistent state), so moving it fails; the other
    // is a worker's orphan.
    let queue = TestQueue::new().await;
    queue
        .enqueue(&[
            queue.task("job:orphan", "broken"),
            queue.task("job:orphan", "orphan"),
        ])
        .await;
    let now = chrono::Utc::now().timestamp();
    let mut redis = queue.redis.clone();
    let _: () = redis::pipe()
        .lrem(keys::pending(&queue.name), 0, "broken")
        .lrem(keys::pending(&queue.name), 0, "orphan")
        .rpush(keys::active(&queue.name), "orphan")
        .hset(keys::task(&queue.name, "orphan"), "state", "active")
        .hset(keys::task(&queue.name, "broken"), "state", "active")
        .zadd(keys::lease(&queue.name), "broken", now - 200)
        .zadd(keys::lease(&queue.name), "orphan", now - 120)
        .query_async(&mut redis)
        .await
        .unwrap();
    let runs = Arc::new(Mutex::new(Vec::new()));
    let mut consumer = Consumer::new(queue.client.clone(), queue.options());
    let log = runs.clone();
    consumer.handle("job:orphan", move |task: Task| {
        let log = log.clone();
        async move {
            log.lock().unwrap().push(task.id);
            Ok(())
        }
    });

    // Act
    let running = Running::start(consumer);
    eventually(Duration::from_secs(10), "the orphan to run", || async {
        queue.state("orphan").await.is_none()
    })
    .await;
    running.stop().await;

    // Assert: the orphan was recovered and ran; the broken task was left.
    assert_eq!(*runs.lock().unwrap(), vec!["orphan".to_string()]);
    let leased = queue.zset(keys::lease(&queue.name)).await;
    assert_eq!(leased.len(), 1);
    assert_eq!(leased[0].0, "broken");
}

#[tokio::test]
async fn a_task_past_its_deadline_fails_without_running() {
    // Arrange: a task whose deadline passed a minute ago, with one retry.
    let queue = TestQueue::new().await;
    let message = TaskMessage {
        r#type: "job:late".into(),
        id: "late".into(),
        queue: queue.name.clone(),
        retry: 1,
        deadline: chrono::Utc::now().timestamp() - 60,
        ..TaskMessage::default()
    };
    let now_ns = chrono::Utc::now().timestamp_nanos_opt().unwrap();
    let _: i64 = scripts::ENQUEUE
        .key(keys::task(&queue.name, "late"))
        .key(keys::pending(&queue.name))
        .arg(message.encode_to_vec())
        .arg("late")
        .arg(now_ns)
        .invoke_async(&mut queue.redis.clone())
        .await
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut consumer = Consumer::new(queue.client.clone(), queue.options());
    let counter = runs.clone();
    consumer.handle("job:late", move |_task: Task| {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    });

    // Act
    let running = Running::start(consumer);
    eventually(
        Duration::from_secs(10),
        "the task to be archived",
        || async { queue.state("late").await.as_deref() == Some("archived") },
    )
    .await;
    running.stop().await;

    // Assert: failed twice (the run and its retry), never started.
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let fields = queue.stored_fields("late").await;
    assert_eq!(text(&fields, 7), "context deadline exceeded", "error_msg");
    assert_eq!(text(&fields, 6), "1", "retried");
    assert_eq!(queue.counter(keys::failed_total(&queue.name)).await, 2);
}

/// A handler still running when the task's timeout is up is stopped, and
/// the run counts as a failure with Go's error text: retried, then archived.
#[tokio::test]
async fn a_handler_that_outlives_its_timeout_is_stopped_and_fails() {
    // Arrange: a 1 s timeout, one retry, a handler that would take a minute.
    let queue = TestQueue::new().await;
    queue
        .enqueue(&[NewTask::new("job:slow", "slow", b"".to_vec())
            .queue(queue.name.as_str())
            .timeout(Duration::from_secs(1))
            .max_retry(1)])
        .await;
    let (started, finished) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut consumer = Consumer::new(queue.client.clone(), queue.options());
    let (on_start, on_finish) = (started.clone(), finished.clone());
    consumer.handle("job:slow", move |_task: Task| {
        let (on_start, on_finish) = (on_start.clone(), on_finish.clone());
        async move {
            on_start.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_secs(60)).await;
            on_finish.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    });

    // Act
    let running = Running::start(consumer);
    eventually(
        Duration::from_secs(60),
        "the task to be archived",
        || async { queue.state("slow").await.as_deref() == Some("archived") },
    )
    .await;
    running.stop().await;

    // Assert: started twice (the run and its retry), stopped both times.
    assert_eq!(started.load(Ordering::SeqCst), 2);
    assert_eq!(finished.load(Ordering::SeqCst), 0);
    let fields = queue.stored_fields("slow").await;
    assert_eq!(text(&fields, 7), "context deadline exceeded", "error_msg");
    assert_eq!(queue.counter(keys::failed_total(&queue.name)).await, 2);
}

#[tokio::test]
async fn a_handler_reads_the_headers_of_its_task() {
    // Arrange
    let queue = TestQueue::new().await;
    let headers = BTreeMap::from([
        ("tenant".to_string(), "acme".to_string()),
        ("source".to_string(), "go-service".to_string()),
    ]);
    let seen = Arc::new(Mutex::new(None));
    let mut consumer = Consumer::new(queue.client.clone(), queue.options());
    let log = seen.clone();
    consumer.handle("job:headers", move |task: Task| {
        let log = log.clone();
        async move {
            *log.lock().unwrap() = Some(task.headers);
            Ok(())
        }
    });
    let task = queue
        .task("job:headers", "with-headers")
        .headers(headers.clone())
        .retention(Duration::from_secs(60));
    queue.enqueue(&[task]).await;
    let stored = queue.stored_fields("with-headers").await;
    assert!(stored.contains_key(&15), "headers are TaskMessage field 15");

    // Act
    let running = Running::start(consumer);
    eventually(Duration::from_secs(10), "the task to complete", || async {
        queue.state("with-headers").await.as_deref() == Some("completed")
    })
    .await;
    running.stop().await;

    // Assert
    assert_eq!(seen.lock().unwrap().clone(), Some(headers));
}

#[tokio::test]
async fn a_cancelled_task_is_dropped_and_retried() {
    // Arrange: a handler that never ends unless dropped, and retries far
    // off so the cancelled task stays in `:retry`.
    let queue = TestQueue::new().await;
    let mut options = queue.options();
    options.retry_delay = |_| Duration::from_secs(3600);
    let mut consumer = Consumer::new(queue.client.clone(), options);
    let started = Arc::new(Notify::new());
    let dropped = Arc::new(AtomicUsize::new(0));
    let (signal, drops) = (started.clone(), dropped.clone());
    consumer.handle("job:endless", move |_task: Task| {
        let (signal, drops) = (signal.clone(), drops.clone());
        async move {
            let _guard = DropCounter(drops);
            signal.notify_one();
            std::future::pending::<()>().await;
            Ok(())
        }
    });
    queue.enqueue(&[queue.task("job:endless", "endless")]).await;
    let running = Running::start(consumer);
    tokio::time::timeout(Duration::from_secs(10), started.notified())
        .await
        .expect("the handler starts");

    // Act: what asynqmon's Cancel and Go's Inspector.CancelProcessing send
    // (again until received: the subscription may still be on its way).
    eventually(Duration::from_secs(15), "the task to be cancelled", || {
        let (mut redis, queue) = (queue.redis.clone(), &queue);
        async move {
            let _: i64 = redis
                .publish(keys::CANCEL_CHANNEL, "endless")
                .await
                .unwrap();
            queue.state("endless").await.as_deref() == Some("retry")
        }
    })
    .await;
    running.stop().await;

    // Assert: the handler was dropped, and the task failed as in Go.
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
    let fields = queue.stored_fields("endless").await;
    assert_eq!(text(&fields, 7), "context canceled", "error_msg");
    assert_eq!(text(&fields, 6), "1", "retried");
    assert_eq!(queue.counter(keys::failed_total(&queue.name)).await, 1);
}

/// Counts the drops of the future that holds it.
struct DropCounter(Arc<AtomicUsize>);

impl Drop for DropCounter {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// The `ServerInfo` of the consumer that serves `queue`, with the score of
/// its key in `asynq:servers`, if it is written.
async fn server_state(queue: &TestQueue) -> Option<(String, ServerInfo, f64)> {
    let mut redis = queue.redis.clone();
    let servers: Vec<(String, f64)> = redis
        .zrange_withscores(keys::ALL_SERVERS, 0, -1)
        .await
        .unwrap();
    for (key, score) in servers {
        let Some(bytes): Option<Vec<u8>> = redis.get(&key).await.unwrap() else {
            continue;
        };
        let Ok(info) = ServerInfo::decode(bytes.as_slice()) else {
            continue;
        };
        if info.queues.contains_key(&queue.name) {
            return Some((key, info, score));
        }
    }
    None
}

#[tokio::test]
async fn a_consumer_runs_at_most_its_concurrency_and_takes_nothing_ahead_of_running_handlers() {
    // Arrange: six tasks whose handlers wait for a gate, on a consumer of
    // concurrency 2.
    let queue = TestQueue::new().await;
    let mut options = queue.options();
    options.concurrency = 2;
    let mut consumer = Consumer::new(queue.client.clone(), options);
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    {
        let (gate, running, most, done) =
            (gate.clone(), running.clone(), most.clone(), done.clone());
        consumer.handle("job:gated", move |_task: Task| {
            let (gate, running, most, done) =
                (gate.clone(), running.clone(), most.clone(), done.clone());
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                gate.acquire().await.unwrap().forget();
                running.fetch_sub(1, Ordering::SeqCst);
                done.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        });
    }
    let gated = |range: std::ops::Range<usize>| -> Vec<NewTask> {
        range
            .map(|n| queue.task("job:gated", &format!("gated-{n}")))
            .collect()
    };
    queue.enqueue(&gated(0..6)).await;

    // Act: two handlers start and block; then a second consumer takes what
    // the first left in the queue.
    let consumer = Running::start(consumer);
    eventually(Duration::from_secs(10), "two handlers to run", || async {
        running.load(Ordering::SeqCst) == 2
    })
    .await;
    let taken = Arc::new(Mutex::new(Vec::new()));
    let mut other = Consumer::new(queue.client.clone(), queue.options());
    let log = taken.clone();
    other.handle("job:gated", move |task: Task| {
        log.lock().unwrap().push(task.id);
        async { Ok(()) }
    });
    let other = Running::start(other);

    // Assert: no task was taken ahead while both handlers still run (a
    // task is taken ahead only for a slot whose completion is on its way):
    // the other consumer ran the four the first did not start.
    eventually(
        Duration::from_secs(10),
        "the other consumer to run the four tasks the first left",
        || async { taken.lock().unwrap().len() == 4 },
    )
    .await;
    other.stop().await;
    let mut redis = queue.redis.clone();
    let active: usize = redis.llen(keys::active(&queue.name)).await.unwrap();
    assert_eq!(active, 2, "the first consumer holds its two running tasks");

    // And released one at a time, its two and four more run, never more
    // than two at once.
    queue.enqueue(&gated(6..10)).await;
    for released in 1..=6 {
        gate.add_permits(1);
        eventually(
            Duration::from_secs(10),
            "the released task to finish",
            || async { done.load(Ordering::SeqCst) == released },
        )
        .await;
    }
    eventually(
        Duration::from_secs(10),
        "every task to be completed",
        || async {
            let mut redis = queue.redis.clone();
            let active: usize = redis.llen(keys::active(&queue.name)).await.unwrap();
            active == 0
        },
    )
    .await;
    assert_eq!(
        most.load(Ordering::SeqCst),
        2,
        "the most handlers running at once"
    );
    consumer.stop().await;
}

#[tokio::test]
async fn a_batch_dequeue_leaves_the_queue_as_one_go_dequeue_per_task_leaves_it() {
    // Arrange: the same six tasks on two queues.
    let ours = TestQueue::new().await;
    let go = TestQueue::new().await;
    for queue in [&ours, &go] {
        let tasks: Vec<NewTask> = (0..6)
            .map(|n| queue.task("job:held", &format!("held-{n}")))
            .collect();
        queue.enqueue(&tasks).await;
    }
    let mut options = ours.options();
    options.concurrency = 3;
    let mut consumer = Consumer::new(ours.client.clone(), options);
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let running = Arc::new(AtomicUsize::new(0));
    {
        let (gate, running) = (gate.clone(), running.clone());
        consumer.handle("job:held", move |_task: Task| {
            let (gate, running) = (gate.clone(), running.clone());
            async move {
                running.fetch_add(1, Ordering::SeqCst);
                gate.acquire().await.unwrap().forget();
                Ok(())
            }
        });
    }

    // Act: a consumer of concurrency 3 takes three tasks in one script call
    // (its handlers hold them) ...
    let consumer = Running::start(consumer);
    eventually(Duration::from_secs(10), "three handlers to run", || async {
        running.load(Ordering::SeqCst) == 3
    })
    .await;
    // ... and on the other queue, the commands of Go asynq's DEQUEUE
    // script, one task per call.
    let mut redis = go.redis.clone();
    for _ in 0..3 {
        let id: String = redis
            .rpoplpush(keys::pending(&go.name), keys::active(&go.name))
            .await
            .unwrap();
        let task = keys::task(&go.name, &id);
        let _: () = redis::pipe()
            .hset(&task, "state", "active")
            .hdel(&task, "pending_since")
            .zadd(
                keys::lease(&go.name),
                &id,
                chrono::Utc::now().timestamp() + 30,
            )
            .query_async(&mut redis)
            .await
            .unwrap();
    }

    // Assert: the same lists, in the same order, the same leased ids and the
    // same fields in each task's hash.
    let list = |queue: &TestQueue, key: String| {
        let mut redis = queue.redis.clone();
        async move {
            let ids: Vec<String> = redis.lrange(key, 0, -1).await.unwrap();
            ids
        }
    };
    assert_eq!(ours.pending().await, go.pending().await, "pending");
    assert_eq!(
        ours.pending().await,
        vec!["held-5", "held-4", "held-3"],
        "the three newest are left"
    );
    assert_eq!(
        list(&ours, keys::active(&ours.name)).await,
        list(&go, keys::active(&go.name)).await,
        "active, newest taken first"
    );
    let leased = |entries: Vec<(String, f64)>| -> Vec<String> {
        entries.into_iter().map(|(id, _)| id).collect()
    };
    assert_eq!(
        leased(ours.zset(keys::lease(&ours.name)).await),
        leased(go.zset(keys::lease(&go.name)).await),
        "leased ids"
    );
    for n in 0..6 {
        let id = format!("held-{n}");
        let fields = |queue: &TestQueue| {
            let mut redis = queue.redis.clone();
            let task = keys::task(&queue.name, &id);
            async move {
                let mut names: Vec<String> = redis.hkeys(&task).await.unwrap();
                names.sort();
                let state: String = redis.hget(&task, "state").await.unwrap();
                (names, state)
            }
        };
        assert_eq!(fields(&ours).await, fields(&go).await, "the hash of {id}");
    }
    gate.add_permits(6);
    consumer.stop().await;
}

#[tokio::test]
async fn a_running_consumer_publishes_its_server_state_for_asynqmon() {
    // Arrange: a consumer of the test's queue, weight 3, running one task.
    let queue = TestQueue::new().await;
    let mut options = queue.options();
    options.queues = format!("{}=3", queue.name).parse().unwrap();
    options.concurrency = 3;
    options.heartbeat_interval = Duration::from_secs(1);
    let mut consumer = Consumer::new(queue.client.clone(), options);
    let finish = Arc::new(Notify::new());
    let wait = finish.clone();
    consumer.handle("job:observed", move |_task: Task| {
        let wait = wait.clone();
        async move {
            wait.notified().await;
            Ok(())
        }
    });
    queue
        .enqueue(&[queue.task("job:observed", "observed")])
        .await;
    let before = chrono::Utc::now().timestamp();

    // Act
    let running = Running::start(consumer);
    eventually(
        Duration::from_secs(10),
        "one worker to be shown",
        || async {
            server_state(&queue)
                .await
                .is_some_and(|(_, info, _)| info.active_worker_count == 1)
        },
    )
    .await;
    let (key, info, score) = server_state(&queue).await.unwrap();
    let workers_key = key.replacen("asynq:servers:", "asynq:workers:", 1);
    let workers: HashMap<String, Vec<u8>> =
        queue.redis.clone().hgetall(&workers_key).await.unwrap();

    // Assert: Go asynq's ServerInfo and WorkerInfo.
    let host = hostname::get().unwrap().into_string().unwrap();
    let pid = std::process::id();
    assert_eq!(key, keys::server_info(&host, pid, &info.server_id));
    assert_eq!(info.host, host);
    assert_eq!(info.pid, i32::try_from(pid).unwrap());
    assert!(
        uuid::Uuid::parse_str(&info.server_id).is_ok(),
        "{}",
        info.server_id
    );
    assert_eq!(info.concurrency, 3);
    assert_eq!(info.queues, HashMap::from([(queue.name.clone(), 3)]));
    assert_eq!(info.status, "active");
    let started = info.start_time.unwrap().seconds;
    assert!((before - 1..=before + 10).contains(&started), "{started}");
    let expires_in = score - chrono::Utc::now().timestamp() as f64;
    assert!(
        (0.0..=2.0).contains(&expires_in),
        "the TTL is twice the heartbeat: {expires_in}"
    );
    assert_eq!(workers.len(), 1);
    let worker = WorkerInfo::decode(workers["observed"].as_slice()).unwrap();
    assert_eq!(worker.task_id, "observed");
    assert_eq!(worker.task_type, "job:observed");
    assert_eq!(worker.queue, queue.name);
    assert_eq!(worker.task_payload, b"payload of observed");
    assert_eq!(worker.server_id, info.server_id);
    let deadline = worker.deadline.unwrap().seconds - worker.start_time.unwrap().seconds;
    assert!(
        (1799..=1800).contains(&deadline),
        "the default 30 min timeout: {deadline}"
    );

    // And at shutdown the state is deleted.
    finish.notify_one();
    running.stop().await;
    let mut redis = queue.redis.clone();
    let listed: Option<f64> = redis.zscore(keys::ALL_SERVERS, &key).await.unwrap();
    assert_eq!(listed, None);
    let listed: Option<f64> = redis.zscore(keys::ALL_WORKERS, &workers_key).await.unwrap();
    assert_eq!(listed, None);
    let left: bool = redis.exists(&key).await.unwrap();
    assert!(!left);
}

/// The event of the listener tests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Pinged {
    count: u32,
}

impl Event for Pinged {
    const NAME: &'static str = "testPinged";
}

/// The runs of the test listener: each event with its context.
type ListenerRuns = Arc<Mutex<Vec<(Pinged, ListenerContext)>>>;

/// A consumer of `queue` with the worker's own event handlers and one
/// listener of [`Pinged`], which records each run.
fn consumer_with_listener(queue: &TestQueue, options: ConsumerOptions) -> (Consumer, ListenerRuns) {
    let runs = Arc::new(Mutex::new(Vec::new()));
    let log = runs.clone();
    let mut listeners = Listeners::new();
    listeners.listen("record", move |event: Pinged, context: ListenerContext| {
        let log = log.clone();
        async move {
            log.lock().unwrap().push((event, context));
            Ok(())
        }
    });
    // The listener does not use the database; the pool never connects.
    let pool = sqlx::PgPool::connect_lazy("postgres://unused@127.0.0.1:1/unused").unwrap();
    let mut consumer = Consumer::new(queue.client.clone(), options);
    handle_events(
        &mut consumer,
        &crate::worker::ordering::Ordering::new(
            pool.clone(),
            queue.client.clone(),
            Vec::new(),
            Duration::ZERO,
        ),
        Transactor::new(pool),
        Arc::new(listeners),
        ListenerMetrics::default(),
        Default::default(),
    );
    (consumer, runs)
}

/// An `event:` task carrying `envelope`, as the relay queues it.
fn event_task(queue: &TestQueue, envelope: &Envelope) -> NewTask {
    NewTask::new(
        format!("event:{}", envelope.name),
        envelope.id.to_string(),
        serde_json::to_vec(envelope).unwrap(),
    )
    .queue(&queue.name)
}

#[tokio::test]
async fn the_fan_out_passes_the_event_headers_to_the_listener_tasks() {
    // Arrange
    let queue = TestQueue::new().await;
    let (consumer, runs) = consumer_with_listener(&queue, queue.options());
    let envelope = Envelope::new(Pinged::NAME, serde_json::json!({"count": 3}));
    let headers = BTreeMap::from([("tenant".to_string(), "acme".to_string())]);
    queue
        .enqueue(&[event_task(&queue, &envelope).headers(headers.clone())])
        .await;

    // Act
    let running = Running::start(consumer);
    eventually(Duration::from_secs(10), "the listener to run", || async {
        !runs.lock().unwrap().is_empty()
    })
    .await;
    running.stop().await;

    // Assert
    let runs = runs.lock().unwrap();
    assert_eq!(runs.len(), 1);
    let (event, context) = &runs[0];
    assert_eq!(*event, Pinged { count: 3 });
    assert_eq!(context.event_id(), envelope.id);
    assert_eq!(context.headers(), &headers);
}

#[tokio::test]
async fn an_event_that_does_not_decode_into_the_listener_type_is_retried_not_archived() {
    // Arrange: an event whose payload has the wrong shape, and retries far
    // off so the listener task stays in `:retry`.
    let queue = TestQueue::new().await;
    let mut options = queue.options();
    options.retry_delay = |_| Duration::from_secs(3600);
    let (consumer, runs) = consumer_with_listener(&queue, options);
    let envelope = Envelope::new(Pinged::NAME, serde_json::json!({"count": "three"}));
    queue.enqueue(&[event_task(&queue, &envelope)]).await;
    let listener_task = listener_task_id(envelope.id, "record").to_string();

    // Act
    let running = Running::start(consumer);
    eventually(
        Duration::from_secs(10),
        "the listener task to fail",
        || async { queue.state(&listener_task).await.as_deref() == Some("retry") },
    )
    .await;
    running.stop().await;

    // Assert: the listener never saw it; it will be tried again.
    assert!(runs.lock().unwrap().is_empty());
    let fields = queue.stored_fields(&listener_task).await;
    assert_eq!(text(&fields, 6), "1", "retried");
    let error = text(&fields, 7);
    assert!(error.contains("does not decode into"), "{error}");
    assert!(error.contains("Pinged"), "{error}");
}

#[tokio::test]
async fn a_task_that_is_not_an_event_envelope_is_archived_at_once() {
    // Arrange
    let queue = TestQueue::new().await;
    let (consumer, _runs) = consumer_with_listener(&queue, queue.options());
    queue
        .enqueue(&[queue.task("listener:testPinged:record", "garbage")])
        .await;

    // Act
    let running = Running::start(consumer);
    eventually(
        Duration::from_secs(10),
        "the task to be archived",
        || async { queue.state("garbage").await.as_deref() == Some("archived") },
    )
    .await;
    running.stop().await;

    // Assert: archived without retries (asynq's SkipRetry).
    let fields = queue.stored_fields("garbage").await;
    assert!(!fields.contains_key(&6), "never retried");
    assert!(text(&fields, 7).contains("not an event envelope"));
}

#[tokio::test]
async fn an_event_task_under_a_new_id_reaches_the_listeners_again_with_the_same_event_id() {
    // Arrange: the relay's task (id = event id), and a replay of the same
    // envelope under a new task id, as `outbox replay` queues it.
    let queue = TestQueue::new().await;
    let (consumer, runs) = consumer_with_listener(&queue, queue.options());
    let envelope = Envelope::new(Pinged::NAME, serde_json::json!({"count": 1}));
    let mut replay = event_task(&queue, &envelope);
    replay.id = uuid::Uuid::now_v7().to_string();
    queue.enqueue(&[event_task(&queue, &envelope)]).await;

    // Act
    let running = Running::start(consumer);
    eventually(Duration::from_secs(10), "the first run", || async {
        runs.lock().unwrap().len() == 1
    })
    .await;
    queue.enqueue(&[replay]).await;
    eventually(Duration::from_secs(10), "the replayed run", || async {
        runs.lock().unwrap().len() == 2
    })
    .await;
    running.stop().await;

    // Assert: two runs, one event id for the listener to deduplicate on.
    let runs = runs.lock().unwrap();
    assert!(
        runs.iter()
            .all(|(_, context)| context.event_id() == envelope.id)
    );
}

/// A consumer with the worker's listener handlers on `db`, archiving a
/// listener task only once its failure is recorded there.
fn failure_recording_consumer(
    queue: &TestQueue,
    db: &support::TestDatabase,
    listeners: Listeners,
) -> Consumer {
    let listeners = Arc::new(listeners);
    let mut consumer = Consumer::new(queue.client.clone(), queue.options());
    crate::worker::before_archive::record_before_archive(
        &mut consumer,
        db.pool.clone(),
        listeners.failure_hook(),
        None,
    );
    handle_events(
        &mut consumer,
        &crate::worker::ordering::Ordering::new(
            db.pool.clone().clone(),
            queue.client.clone(),
            Vec::new(),
            Duration::from_secs(60),
        ),
        Transactor::new(db.pool.clone()),
        listeners,
        ListenerMetrics::default(),
        Default::default(),
    );
    consumer
}

/// The recorded failures: (task id, event id, event, listener, error,
/// attempts).
async fn recorded(
    db: &support::TestDatabase,
) -> Vec<(String, Option<uuid::Uuid>, String, String, String, i32)> {
    sqlx::query_as(
        "SELECT task_id, event_id, event_name, listener, error, attempts FROM listener_failures",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_failure_for_good_is_recorded_before_the_archive_and_forgotten_when_the_task_succeeds() {
    // Arrange: a listener that gives up once, then succeeds, and a hook
    // that keeps the failures it is given.
    let queue = TestQueue::new().await;
    let db = support::TestDatabase::migrated().await;
    let attempts = Arc::new(Mutex::new(0));
    let counted = attempts.clone();
    let given = Arc::new(Mutex::new(Vec::new()));
    let mut listeners = Listeners::new();
    listeners.listen("once", move |_: Pinged, _: ListenerContext| {
        let counted = counted.clone();
        async move {
            let mut attempts = counted.lock().unwrap();
            *attempts += 1;
            if *attempts == 1 {
                return Err(SkipRetry("not now".into()).into());
            }
            Ok(())
        }
    });
    let keep = given.clone();
    listeners.on_failure(move |failure| {
        let keep = keep.clone();
        async move { keep.lock().unwrap().push(failure) }
    });
    let consumer = failure_recording_consumer(&queue, &db, listeners);
    let envelope = Envelope::new(Pinged::NAME, serde_json::json!({"count": 1}));
    queue.enqueue(&[event_task(&queue, &envelope)]).await;
    let task = listener_task_id(envelope.id, "once").to_string();

    // Act: archived, then run again (asynqmon's "run") and succeeding.
    let running = Running::start(consumer);
    eventually(
        Duration::from_secs(10),
        "the task to be archived",
        || async { queue.state(&task).await.as_deref() == Some("archived") },
    )
    .await;
    let at_archive = recorded(&db).await;
    let hooked = given.lock().unwrap().clone();
    queue.client.run_task(&queue.name, &task).await.unwrap();
    eventually(Duration::from_secs(10), "the task to complete", || async {
        queue.state(&task).await.as_deref() == Some("completed")
    })
    .await;
    eventually(
        Duration::from_secs(10),
        "the record to be forgotten",
        || async { recorded(&db).await.is_empty() },
    )
    .await;
    running.stop().await;

    // Assert: recorded when archived, and the hook given the same.
    assert_eq!(
        at_archive,
        [(
            task.clone(),
            Some(envelope.id),
            Pinged::NAME.to_string(),
            "once".to_string(),
            "not now (not retried)".to_string(),
            1
        )]
    );
    assert_eq!(hooked.len(), 1, "{hooked:?}");
    let failure = &hooked[0];
    assert_eq!(
        (
            failure.task_id.as_str(),
            failure.event_id,
            failure.listener.as_str(),
            failure.error.as_str(),
            failure.attempts
        ),
        (
            task.as_str(),
            Some(envelope.id),
            "once",
            "not now (not retried)",
            1
        )
    );
}

/// The task the fan-out queues for the one listener of [`Pinged`] in
/// `listeners` on `envelope`, to be queued as it is.
fn pinged_listener_task(queue: &TestQueue, listeners: &Listeners, envelope: &Envelope) -> NewTask {
    let listener = &listeners.of(Pinged::NAME)[0];
    NewTask::new(
        listener.task_type(),
        listener_task_id(envelope.id, listener.name()).to_string(),
        serde_json::to_vec(envelope).unwrap(),
    )
    .queue(&queue.name)
}

#[tokio::test]
async fn a_failure_whose_retries_are_spent_is_recorded_before_the_archive() {
    // Arrange: a listener that always fails, on a task of one retry.
    let queue = TestQueue::new().await;
    let db = support::TestDatabase::migrated().await;
    let mut listeners = Listeners::new();
    listeners.listen("spent", |_: Pinged, _: ListenerContext| async {
        Err(anyhow::anyhow!("provider down"))
    });
    let envelope = Envelope::new(Pinged::NAME, serde_json::json!({"count": 1}));
    let listener_task = pinged_listener_task(&queue, &listeners, &envelope).max_retry(1);
    let task = listener_task.id.clone();
    queue.enqueue(&[listener_task]).await;
    let consumer = failure_recording_consumer(&queue, &db, listeners);

    // Act
    let running = Running::start(consumer);
    eventually(
        Duration::from_secs(10),
        "the task to be archived",
        || async { queue.state(&task).await.as_deref() == Some("archived") },
    )
    .await;
    let at_archive = recorded(&db).await;
    running.stop().await;

    // Assert: the failure of its last run, recorded when it was archived.
    assert_eq!(
        at_archive,
        [(
            task,
            Some(envelope.id),
            Pinged::NAME.to_string(),
            "spent".to_string(),
            "provider down".to_string(),
            2
        )]
    );
}

#[tokio::test]
async fn a_failure_whose_lease_expired_with_no_retry_left_is_recorded_before_the_archive() {
    // Arrange: a listener task of no retry, taken by a worker that died two
    // minutes ago.
    let queue = TestQueue::new().await;
    let db = support::TestDatabase::migrated().await;
    let ran = Arc::new(AtomicUsize::new(0));
    let counted = ran.clone();
    let mut listeners = Listeners::new();
    listeners.listen("stalled", move |_: Pinged, _: ListenerContext| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Ok(()) }
    });
    let envelope = Envelope::new(Pinged::NAME, serde_json::json!({"count": 1}));
    let listener_task = pinged_listener_task(&queue, &listeners, &envelope).max_retry(0);
    let task = listener_task.id.clone();
    queue.enqueue(&[listener_task]).await;
    let mut redis = queue.redis.clone();
    let _: () = redis::pipe()
        .rpoplpush(keys::pending(&queue.name), keys::active(&queue.name))
        .hset(keys::task(&queue.name, &task), "state", "active")
        .zadd(
            keys::lease(&queue.name),
            &task,
            chrono::Utc::now().timestamp() - 120,
        )
        .query_async(&mut redis)
        .await
        .unwrap();
    let consumer = failure_recording_consumer(&queue, &db, listeners);

    // Act: the recoverer finds the lease expired.
    let running = Running::start(consumer);
    eventually(
        Duration::from_secs(10),
        "the task to be archived",
        || async { queue.state(&task).await.as_deref() == Some("archived") },
    )
    .await;
    let at_archive = recorded(&db).await;
    running.stop().await;

    // Assert: recorded with the recoverer's error, and never run here.
    assert_eq!(
        at_archive,
        [(
            task,
            Some(envelope.id),
            Pinged::NAME.to_string(),
            "stalled".to_string(),
            "asynq: task lease expired".to_string(),
            1
        )]
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0, "the listener never ran");
}

#[tokio::test]
async fn a_failure_that_cannot_be_recorded_is_retried_instead_of_archived() {
    // Arrange: a listener that always gives up, and no table to record in.
    let queue = TestQueue::new().await;
    let db = support::TestDatabase::migrated().await;
    sqlx::query("DROP TABLE listener_failures")
        .execute(&db.pool)
        .await
        .unwrap();
    let mut listeners = Listeners::new();
    listeners.listen("never", |_: Pinged, _: ListenerContext| async {
        Err(SkipRetry("no".into()).into())
    });
    let consumer = failure_recording_consumer(&queue, &db, listeners);
    let envelope = Envelope::new(Pinged::NAME, serde_json::json!({"count": 1}));
    queue.enqueue(&[event_task(&queue, &envelope)]).await;
    let task = listener_task_id(envelope.id, "never").to_string();

    // Act
    let running = Running::start(consumer);
    eventually(
        Duration::from_secs(10),
        "the failed run to be settled",
        || async { queue.state(&task).await.as_deref() == Some("retry") },
    )
    .await;
    running.stop().await;

    // Assert: waiting for a retry, its error saying why it is not archived.
    let info = queue
        .client
        .task_info(&queue.name, &task)
        .await
        .unwrap()
        .unwrap();
    let error = info.last_error.unwrap_or_default();
    assert!(
        error.starts_with(
            "no (not retried) (not archived: cannot record the failure in listener_failures"
        ),
        "{error}"
    );
    assert!(
        queue
            .client
            .archived_tasks(&queue.name, None)
            .await
            .unwrap()
            .is_empty(),
        "a failure that was not recorded is in the archive"
    );
}

#[tokio::test]
async fn a_listener_that_skips_retry_is_archived_and_runs_again_when_run() {
    // Arrange: a listener that gives up once, then succeeds.
    let queue = TestQueue::new().await;
    let attempts = Arc::new(Mutex::new(0));
    let counted = attempts.clone();
    let mut listeners = Listeners::new();
    listeners.listen("once", move |_: Pinged, _: ListenerContext| {
        let counted = counted.clone();
        async move {
            let mut attempts = counted.lock().unwrap();
            *attempts += 1;
            if *attempts == 1 {
                return Err(SkipRetry("not now".into()).into());
            }
            Ok(())
        }
    });
    let pool = sqlx::PgPool::connect_lazy("postgres://unused@127.0.0.1:1/unused").unwrap();
    let mut consumer = Consumer::new(queue.client.clone(), queue.options());
    let metrics = ListenerMetrics::default();
    handle_events(
        &mut consumer,
        &crate::worker::ordering::Ordering::new(
            pool.clone(),
            queue.client.clone(),
            Vec::new(),
            Duration::from_secs(60),
        ),
        Transactor::new(pool),
        Arc::new(listeners),
        metrics.clone(),
        Default::default(),
    );
    let envelope = Envelope::new(Pinged::NAME, serde_json::json!({"count": 1}));
    queue.enqueue(&[event_task(&queue, &envelope)]).await;
    let task = listener_task_id(envelope.id, "once").to_string();

    // Act: archived at once; asynq's "run" puts it back.
    let running = Running::start(consumer);
    eventually(
        Duration::from_secs(10),
        "the task to be archived",
        || async { queue.state(&task).await.as_deref() == Some("archived") },
    )
    .await;
    let archived = queue
        .client
        .archived_tasks(&queue.name, None)
        .await
        .unwrap();
    let info = queue
        .client
        .task_info(&queue.name, &task)
        .await
        .unwrap()
        .unwrap();
    let outcome = queue.client.run_task(&queue.name, &task).await.unwrap();
    eventually(Duration::from_secs(10), "the task to complete", || async {
        queue.state(&task).await.as_deref() == Some("completed")
    })
    .await;
    running.stop().await;

    // Assert
    assert_eq!(archived.len(), 1);
    assert_eq!(archived[0].0.id, task);
    assert_eq!((info.state.as_str(), info.retried), ("archived", 0));
    assert_eq!(info.last_error.as_deref(), Some("not now (not retried)"));
    assert!(info.archived_at.is_some());
    assert_eq!(outcome, RunOutcome::Queued);
    assert_eq!(*attempts.lock().unwrap(), 2);
    let counts = queue.client.queue_counts(&queue.name).await.unwrap();
    // The listener task is kept for its retention; the event task had none.
    assert_eq!((counts.archived, counts.completed), (0, 1));
    let labels = ListenerLabels {
        event: Pinged::NAME.into(),
        listener: "once".into(),
    };
    assert_eq!(metrics.failed.get_or_create(&labels).get(), 1);
    assert_eq!(metrics.succeeded.get_or_create(&labels).get(), 1);
    assert_eq!(
        queue
            .client
            .run_task(&queue.name, "no-such-task")
            .await
            .unwrap(),
        RunOutcome::Missing
    );
}

/// Runs every task of the queue with a consumer of its own (a client of
/// its own too, as another worker process has), recording which consumer
/// ran each task id.
fn recording_consumer(
    client: Client,
    options: ConsumerOptions,
    name: &'static str,
    runs: Arc<Mutex<Vec<(&'static str, String)>>>,
) -> Consumer {
    let mut consumer = Consumer::new(client, options);
    consumer.handle("job:", move |task: Task| {
        let runs = runs.clone();
        async move {
            runs.lock().unwrap().push((name, task.id));
            Ok::<(), HandlerError>(())
        }
    });
    consumer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_sharing_a_queue_each_keep_taking_tasks_and_run_each_once() {
    // Arrange: 3,000 tasks, and two consumers (with clients of their own,
    // as two worker processes have) ready to start together.
    let queue = TestQueue::new().await;
    let tasks: Vec<NewTask> = (0..3_000)
        .map(|n| queue.task("job:shared", &format!("shared-{n}")))
        .collect();
    queue.enqueue(&tasks).await;
    let runs = Arc::new(Mutex::new(Vec::new()));
    let mut options = queue.options();
    options.concurrency = 10;
    // The default idle pause, so that a miss taken for an empty queue costs
    // what it costs in production.
    options.poll_interval = Duration::from_secs(1);
    let mut ready = Vec::new();
    for name in ["first", "second"] {
        let client = Client::connect(&valkey_addr(), None, 0).await.unwrap();
        ready.push(recording_consumer(
            client,
            options.clone(),
            name,
            runs.clone(),
        ));
    }

    // Act
    let consumers: Vec<Running> = ready.into_iter().map(Running::start).collect();
    eventually(Duration::from_secs(60), "every task to run", || async {
        runs.lock().unwrap().len() >= 3_000 && queue.pending().await.is_empty()
    })
    .await;
    for running in consumers {
        running.stop().await;
    }

    // Assert: each id once, and each consumer did a fair part (a consumer
    // that counted its misses as an empty queue slept beside a full one).
    let runs = runs.lock().unwrap().clone();
    let mut per_id: HashMap<&str, usize> = HashMap::new();
    for (_, id) in &runs {
        *per_id.entry(id.as_str()).or_default() += 1;
    }
    assert_eq!(per_id.len(), 3_000);
    assert!(per_id.values().all(|&n| n == 1), "a task ran twice");
    let first = runs.iter().filter(|(name, _)| *name == "first").count();
    eprintln!("first ran {first} of 3,000, second {}", 3_000 - first);
    assert!(
        (900..=2_100).contains(&first),
        "one consumer ran {first} of 3,000 tasks"
    );
}

/// A stored message whose id (field 3) is not UTF-8, as the pending list
/// and the task's key hold it.
fn message_with_raw_id(queue: &str, id: &[u8]) -> Vec<u8> {
    let mut encoded = TaskMessage {
        r#type: "job:raw".into(),
        payload: b"raw".to_vec(),
        queue: queue.into(),
        retry: 25,
        timeout: 60,
        ..TaskMessage::default()
    }
    .encode_to_vec();
    encoded.push(3 << 3 | 2);
    encoded.push(u8::try_from(id.len()).unwrap());
    encoded.extend_from_slice(id);
    encoded
}

#[tokio::test]
async fn a_task_whose_hash_is_not_a_hash_is_left_in_active_as_go_leaves_it_and_the_tasks_after_it_run()
 {
    // Arrange: three tasks, the second one's hash replaced by a string (a
    // key of another type: every write to it fails).
    let queue = TestQueue::new().await;
    queue
        .enqueue(&[
            queue.task("job:around", "before"),
            queue.task("job:around", "broken"),
            queue.task("job:around", "after"),
        ])
        .await;
    let mut redis = queue.redis.clone();
    let broken = keys::task(&queue.name, "broken");
    let _: () = redis::pipe()
        .del(&broken)
        .set(&broken, "not a hash")
        .query_async(&mut redis)
        .await
        .unwrap();
    let runs = Arc::new(Mutex::new(Vec::new()));
    let consumer = recording_consumer(queue.client.clone(), queue.options(), "one", runs.clone());

    // Act: the dequeue that meets the broken task fails; the next one takes
    // the task after it.
    let running = Running::start(consumer);
    eventually(
        Duration::from_secs(10),
        "the task after it to run",
        || async { runs.lock().unwrap().len() == 1 },
    )
    .await;
    running.stop().await;

    // Assert: the task after it ran; the broken one is in active without a
    // lease (where Go's script leaves it); the one before it, taken by the
    // failed dequeue, is in active under its lease, for recovery to run.
    let ran: Vec<String> = runs
        .lock()
        .unwrap()
        .iter()
        .map(|(_, id)| id.clone())
        .collect();
    assert_eq!(ran, vec!["after".to_string()]);
    let active: Vec<String> = redis
        .lrange(keys::active(&queue.name), 0, -1)
        .await
        .unwrap();
    assert_eq!(active, vec!["broken".to_string(), "before".to_string()]);
    let leased: Vec<String> = queue
        .zset(keys::lease(&queue.name))
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(leased, vec!["before".to_string()]);
    assert!(queue.pending().await.is_empty());
}

#[tokio::test]
async fn a_task_whose_id_is_not_utf8_is_archived_and_the_tasks_after_it_run() {
    // Arrange: the oldest pending task has an id of bytes that are not
    // UTF-8 (laid out as a Go producer writes a task: its hash and the id
    // in the pending list; Go's protobuf refuses to encode such an id, so
    // the test writes the bytes itself); two ordinary tasks come after it.
    let queue = TestQueue::new().await;
    let raw_id: &[u8] = b"raw-\xff\xfe-id";
    let mut redis = queue.redis.clone();
    let _: () = redis::pipe()
        .hset(
            keys::task_of(&queue.name, raw_id),
            "msg",
            message_with_raw_id(&queue.name, raw_id),
        )
        .hset(keys::task_of(&queue.name, raw_id), "state", "pending")
        .lpush(keys::pending(&queue.name), raw_id)
        .query_async(&mut redis)
        .await
        .unwrap();
    queue
        .enqueue(&[
            queue.task("job:after", "after-1"),
            queue.task("job:after", "after-2"),
        ])
        .await;
    let runs = Arc::new(Mutex::new(Vec::new()));
    let consumer = recording_consumer(queue.client.clone(), queue.options(), "one", runs.clone());

    // Act
    let running = Running::start(consumer);
    eventually(
        Duration::from_secs(10),
        "the tasks after it to run",
        || async { runs.lock().unwrap().len() == 2 },
    )
    .await;
    running.stop().await;

    // Assert: the two ran; the undecodable one is archived, its bytes kept.
    let mut ran: Vec<String> = runs
        .lock()
        .unwrap()
        .iter()
        .map(|(_, id)| id.clone())
        .collect();
    ran.sort();
    assert_eq!(ran, ["after-1", "after-2"]);
    let archived: Vec<Vec<u8>> = redis
        .zrange(keys::archived(&queue.name), 0, -1)
        .await
        .unwrap();
    assert_eq!(archived, [raw_id.to_vec()]);
    let state: String = redis
        .hget(keys::task_of(&queue.name, raw_id), "state")
        .await
        .unwrap();
    assert_eq!(state, "archived");
    let active: Vec<Vec<u8>> = redis
        .lrange(keys::active(&queue.name), 0, -1)
        .await
        .unwrap();
    assert!(active.is_empty(), "left active: {active:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_whose_final_write_keeps_failing_gives_up_at_its_lease_end_and_frees_its_slot() {
    // Arrange: one slot, a 2 s lease extended every 200 ms, and a handler
    // that breaks the queue's active list (a string where the list was),
    // so that every try of its completion fails (WRONGTYPE) while the
    // heartbeat's lease extension still works.
    let queue = TestQueue::new().await;
    let mut options = queue.options();
    options.concurrency = 1;
    options.lease_duration = Duration::from_secs(2);
    options.heartbeat_interval = Duration::from_millis(200);
    options.recover_interval = Duration::from_secs(3600);
    let mut consumer = Consumer::new(queue.client.clone(), options);
    let active = keys::active(&queue.name);
    let breaker = queue.redis.clone();
    let broken = active.clone();
    consumer.handle("job:stuck", move |_task: Task| {
        let (mut redis, broken) = (breaker.clone(), broken.clone());
        async move {
            let _: () = redis::pipe()
                .del(&broken)
                .set(&broken, "not a list")
                .query_async(&mut redis)
                .await?;
            Ok(())
        }
    });
    let next_ran = Arc::new(AtomicUsize::new(0));
    let counter = next_ran.clone();
    consumer.handle("job:next", move |_task: Task| {
        counter.fetch_add(1, Ordering::SeqCst);
        async { Ok::<(), HandlerError>(()) }
    });
    queue.enqueue(&[queue.task("job:stuck", "stuck")]).await;
    let running = Running::start(consumer);

    // Act: the lease runs out although the heartbeat goes on, ...
    let mut redis = queue.redis.clone();
    let lease = keys::lease(&queue.name);
    eventually(
        Duration::from_secs(10),
        "the stuck task's lease to run out",
        || {
            let (mut redis, lease) = (redis.clone(), lease.clone());
            async move {
                let score: Option<i64> = redis.zscore(&lease, "stuck").await.unwrap();
                score.is_some_and(|score| score < chrono::Utc::now().timestamp())
            }
        },
    )
    .await;
    // ... then the list is mended, and another task comes.
    let _: () = redis::pipe()
        .del(&active)
        .rpush(&active, "stuck")
        .query_async(&mut redis)
        .await
        .unwrap();
    queue.enqueue(&[queue.task("job:next", "next")]).await;
    eventually(
        Duration::from_secs(10),
        "the next task to run in the freed slot",
        || async { next_ran.load(Ordering::SeqCst) == 1 },
    )
    .await;
    running.stop().await;

    // Assert: the stuck task is left active with its expired lease, for the
    // recoverer, as a Go server leaves it.
    assert_eq!(queue.state("stuck").await.as_deref(), Some("active"));
    let score: Option<i64> = redis.zscore(&lease, "stuck").await.unwrap();
    assert!(score.is_some_and(|score| score < chrono::Utc::now().timestamp()));
}
