//! The queue layer against a real Valkey (or Redis): what is stored is what
//! Go asynq stores, and tasks move between states as a Go worker moves them.
//!
//! The server is `VALKEY_ADDR` (default 127.0.0.1:6379). Each test works in
//! its own queue, `test_<uuid>`, and deletes that queue's keys when it ends,
//! also when it fails; nothing else on the server is touched.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use shop::queue::{
    Client, Consumer, ConsumerOptions, EnqueueOutcome, HandlerError, NewTask, QueueError, Task,
    keys,
};

fn server_addr() -> String {
    std::env::var("VALKEY_ADDR").unwrap_or_else(|_| "127.0.0.1:6379".into())
}

/// A queue of its own for one test. Dropping it deletes the queue's keys.
struct TestQueue {
    name: String,
    client: Client,
    redis: redis::aio::MultiplexedConnection,
}

impl TestQueue {
    async fn new() -> Self {
        let name = format!("test_{}", uuid::Uuid::now_v7().simple());
        let client = Client::connect(&server_addr(), None, 0)
            .await
            .expect("these tests need Valkey or Redis at VALKEY_ADDR (default 127.0.0.1:6379)");
        let redis = redis::Client::open(format!("redis://{}/", server_addr()))
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
        let Ok(mut conn) = redis::Client::open(format!("redis://{}/", server_addr()))
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

/// Polls `check` every 50 ms until it holds, failing after `limit`.
async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
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
            let server = TcpStream::connect(server_addr()).unwrap();
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
        clients.push(Client::connect(&server_addr(), None, 0).await.unwrap());
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
    let err = match Client::connect(&server_addr(), Some(&password), 0).await {
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
