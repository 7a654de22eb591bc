//! Per-listener retries, timeouts, backoff and snoozes, through the
//! worker's own fan-out and listener handlers on a real Valkey and
//! Postgres: what each listener's tasks carry, how many runs a listener
//! with N retries gets, a run stopped at its timeout with its `ctx.once`
//! work rolled back, and snoozes that spend no attempt, up to their bound.

#![cfg(feature = "worker")]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message as _;
use redis::AsyncCommands;
use tokio_util::sync::CancellationToken;

use super::support::{TestDatabase, TestQueue, eventually};
use crate::dispatch::Event as _;
use crate::queue::message::TaskMessage;
use crate::queue::{Client, Consumer, ConsumerOptions, NewTask, Task, keys};
use crate::worker::limits::LimitMetrics;
use crate::worker::listeners::{
    Backoff, ListenerContext, ListenerError, ListenerOptions, Listeners, Snooze,
};
use crate::worker::metrics::{ListenerLabels, ListenerMetrics};
use crate::worker::ordering::Ordering;
use crate::worker::task_names::listener_task_id;

/// The event of these tests.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Charged {
    order: i64,
}

impl crate::dispatch::Event for Charged {
    const NAME: &'static str = "policyCharged";
}

/// The longest any of these tests waits for a condition.
const WAIT: Duration = Duration::from_secs(8);

/// When a run started, and when it returned.
type Run = (Instant, Option<Instant>);

/// A listener's runs.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<Vec<Run>>>);

impl Runs {
    fn start(&self) -> usize {
        let mut runs = self.0.lock().unwrap();
        runs.push((Instant::now(), None));
        runs.len()
    }

    fn end(&self, run: usize) {
        self.0.lock().unwrap()[run - 1].1 = Some(Instant::now());
    }

    fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    fn all(&self) -> Vec<Run> {
        self.0.lock().unwrap().clone()
    }
}

/// A worker's consumer on `queue` with the worker's own handlers of
/// `listeners`, its retries forwarded every 100 ms; its run counted in
/// `metrics`. Stops when the returned token is cancelled.
fn start_worker(
    queue: &TestQueue,
    pool: &sqlx::PgPool,
    listeners: Listeners,
    metrics: &ListenerMetrics,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let options = ConsumerOptions {
        queues: queue.name.parse().unwrap(),
        concurrency: 4,
        shutdown_timeout: Duration::from_secs(1),
        poll_interval: Duration::from_millis(50),
        forward_interval: Duration::from_millis(100),
        // What a listener without a backoff of its own would wait: far
        // longer than any test here.
        retry_delay: |_| Duration::from_secs(3600),
        ..ConsumerOptions::default()
    };
    let mut consumer = Consumer::new(queue.client.clone(), options);
    crate::worker::handle_events(
        &mut consumer,
        &ordering(queue, pool),
        crate::database::Transactor::new(pool.clone()),
        Arc::new(listeners),
        metrics.clone(),
        LimitMetrics::default(),
    );
    let stop = CancellationToken::new();
    let handle = tokio::spawn({
        let stop = stop.clone();
        async move {
            consumer
                .run(stop.cancelled_owned())
                .await
                .expect("the consumer stops cleanly");
        }
    });
    (stop, handle)
}

fn ordering(queue: &TestQueue, pool: &sqlx::PgPool) -> Ordering {
    Ordering::new(
        pool.clone(),
        queue.client.clone(),
        vec![queue.name.clone()],
        Duration::from_secs(60),
    )
}

/// The relay's task of a new `Charged` event, in `queue`.
fn event_task(queue: &TestQueue) -> (uuid::Uuid, NewTask) {
    let envelope = crate::outbox::Envelope::new(Charged::NAME, serde_json::json!({"order": 7}));
    let task = NewTask::new(
        format!("event:{}", Charged::NAME),
        envelope.id.to_string(),
        serde_json::to_vec(&envelope).unwrap(),
    )
    .queue(&queue.name);
    (envelope.id, task)
}

async fn enqueue(client: &Client, task: NewTask) {
    for outcome in client.enqueue(&[task]).await.unwrap() {
        outcome.unwrap();
    }
}

/// The stored message of task `id` of `queue`, if it exists.
async fn message(queue: &TestQueue, id: &str) -> Option<TaskMessage> {
    let mut conn = queue.connection().await;
    let bytes: Option<Vec<u8>> = conn.hget(keys::task(&queue.name, id), "msg").await.unwrap();
    bytes.map(|bytes| TaskMessage::decode(bytes.as_slice()).unwrap())
}

/// Whether task `id` of `queue` is in the set `set` (`keys::archived`...).
async fn is_in(queue: &TestQueue, set: String, id: &str) -> bool {
    let mut conn = queue.connection().await;
    let score: Option<f64> = conn.zscore(set, id).await.unwrap();
    score.is_some()
}

fn labels() -> ListenerLabels {
    ListenerLabels {
        event: Charged::NAME.to_string(),
        listener: "payment".to_string(),
    }
}

#[tokio::test]
async fn each_listener_task_carries_its_listeners_retries_and_timeout() {
    // Arrange: a listener registered as before listeners had a policy, one
    // with its own, and one whose own WORKER_RETRIES overrides in part;
    // the fan-out of one event, without a consumer, so the tasks stay.
    let (db, queue) = (TestDatabase::empty().await, TestQueue::new().await);
    let mut listeners = Listeners::new();
    let noop = |_: Charged, _: ListenerContext| async { Ok::<(), ListenerError>(()) };
    listeners.listen_with("audit", ListenerOptions::new(), noop);
    listeners.listen_with(
        "payment",
        ListenerOptions::new()
            .retries(2)
            .timeout(Duration::from_secs(7)),
        noop,
    );
    listeners.listen_with(
        "email",
        ListenerOptions::new()
            .retries(9)
            .timeout(Duration::from_secs(120)),
        noop,
    );
    let overrides = crate::worker::retry_settings::parse_overrides(
        "policyCharged.email=timeout:1500ms,backoff:fixed:10s",
    )
    .unwrap();
    listeners.override_policies(&overrides).unwrap();
    let (event_id, event) = event_task(&queue);
    let task = Task::from(&event.to_message().unwrap());

    // Act
    crate::worker::fan_out(&ordering(&queue, &db.pool), &listeners, task)
        .await
        .unwrap();

    // Assert: asynq's `retry` and `timeout` of each task, as Go's
    // Inspector reads them.
    for (listener, retry, timeout) in [("audit", 25, 1800), ("payment", 2, 7), ("email", 9, 2)] {
        let id = listener_task_id(event_id, listener).to_string();
        let stored = message(&queue, &id).await.expect("the listener task");
        assert_eq!(
            (stored.retry, stored.timeout),
            (retry, timeout),
            "the task of {listener}"
        );
    }
    // What outbox show and the console print of each policy.
    let policies = listeners.task_policies();
    assert_eq!(
        policies["listener:policyCharged:email"].to_string(),
        "retries:9,timeout:1500ms,backoff:fixed:10s"
    );
    assert_eq!(
        policies["listener:policyCharged:audit"].to_string(),
        "retries:25,timeout:30m,backoff:asynq"
    );
}

#[test]
fn worker_retries_naming_an_unknown_listener_is_an_error_that_lists_them() {
    let mut listeners = Listeners::new();
    listeners.listen("payment", |_: Charged, _: ListenerContext| async { Ok(()) });
    let overrides =
        crate::worker::retry_settings::parse_overrides("policyCharged.paymnet=retries:1").unwrap();
    let error = listeners
        .override_policies(&overrides)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("WORKER_RETRIES names `policyCharged.paymnet`")
            && error.contains("its listeners: policyCharged.payment"),
        "{error}"
    );
}

#[tokio::test]
async fn a_listener_with_two_retries_is_archived_after_exactly_three_runs() {
    // Arrange: a listener that always fails, with 2 retries and no wait
    // between them.
    let (db, queue) = (TestDatabase::empty().await, TestQueue::new().await);
    let runs = Runs::default();
    let mut listeners = Listeners::new();
    listeners.listen_with(
        "payment",
        ListenerOptions::new()
            .retries(2)
            .backoff(Backoff::fixed(Duration::ZERO)),
        {
            let runs = runs.clone();
            move |_: Charged, _: ListenerContext| {
                let run = runs.start();
                let runs = runs.clone();
                async move {
                    runs.end(run);
                    Err(anyhow::anyhow!("the bank said no (run {run})"))
                }
            }
        },
    );
    let metrics = ListenerMetrics::default();
    let (stop, worker) = start_worker(&queue, &db.pool, listeners, &metrics);
    let (event_id, event) = event_task(&queue);
    let id = listener_task_id(event_id, "payment").to_string();

    // Act
    enqueue(&queue.client, event).await;
    eventually(WAIT, "the listener task archived", || {
        is_in(&queue, keys::archived(&queue.name), &id)
    })
    .await;
    stop.cancel();
    worker.await.unwrap();

    // Assert: an archived task runs no more.
    assert_eq!(runs.count(), 3, "runs before the archive");
    let stored = message(&queue, &id).await.unwrap();
    assert_eq!((stored.retry, stored.retried), (2, 2));
    assert!(stored.error_msg.contains("run 3"), "{}", stored.error_msg);
    assert_eq!(metrics.failed.get_or_create(&labels()).get(), 3);
}

/// How long the listener of the timeout test holds its `ctx.once`
/// transaction open before it returns `Ok`: past its 1 s timeout, so only
/// a run that is stopped there leaves nothing committed.
const HELD: Duration = Duration::from_millis(2500);

#[tokio::test]
async fn a_listener_past_its_timeout_is_stopped_its_once_work_rolled_back() {
    // Arrange: a listener with a 1 s timeout and 1 retry that writes
    // through `ctx.once`, holds the transaction open past the timeout,
    // then returns Ok (so its work commits unless the run is stopped).
    let (db, queue) = (TestDatabase::migrated().await, TestQueue::new().await);
    sqlx::query("CREATE TABLE charges (event_id uuid NOT NULL, run int NOT NULL)")
        .execute(&db.pool)
        .await
        .unwrap();
    let runs = Runs::default();
    let mut listeners = Listeners::new();
    listeners.listen_with(
        "payment",
        ListenerOptions::new()
            .retries(1)
            .timeout(Duration::from_secs(1))
            .backoff(Backoff::fixed(Duration::ZERO)),
        {
            let runs = runs.clone();
            move |_: Charged, ctx: ListenerContext| {
                let run = runs.start();
                let runs = runs.clone();
                async move {
                    let event_id = ctx.event_id();
                    ctx.once(async move |conn| {
                        sqlx::query("INSERT INTO charges (event_id, run) VALUES ($1, $2)")
                            .bind(event_id)
                            .bind(i32::try_from(run).unwrap())
                            .execute(&mut *conn)
                            .await?;
                        tokio::time::sleep(HELD).await;
                        Ok(())
                    })
                    .await?;
                    runs.end(run);
                    Ok(())
                }
            }
        },
    );
    let metrics = ListenerMetrics::default();
    let (stop, worker) = start_worker(&queue, &db.pool, listeners, &metrics);
    let (event_id, event) = event_task(&queue);
    let id = listener_task_id(event_id, "payment").to_string();
    let started = Instant::now();

    // Act: wait until the task is done with (archived, or completed by a
    // run that was not stopped), then until every run would have
    // committed had it gone on (its `HELD` past, with a margin).
    enqueue(&queue.client, event).await;
    eventually(WAIT, "the listener task archived or completed", || async {
        is_in(&queue, keys::archived(&queue.name), &id).await
            || is_in(&queue, keys::completed(&queue.name), &id).await
    })
    .await;
    let settled = started.elapsed();
    let runs_would_have_ended = || {
        runs.all()
            .iter()
            .all(|(start, _)| start.elapsed() > HELD + Duration::from_millis(300))
    };
    eventually(WAIT, "every run's hold past", || async {
        runs_would_have_ended()
    })
    .await;
    let charges: i64 = sqlx::query_scalar("SELECT count(*) FROM charges")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let recorded: i64 =
        sqlx::query_scalar("SELECT count(*) FROM inbox_processed WHERE event_id = $1")
            .bind(event_id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    stop.cancel();
    worker.await.unwrap();

    // Assert: two runs, each stopped at its timeout (before its hold was
    // over), the task archived; nothing of either committed.
    assert!(
        is_in(&queue, keys::archived(&queue.name), &id).await,
        "archived, not completed"
    );
    assert_eq!(runs.count(), 2, "runs: the first and its one retry");
    assert_eq!((charges, recorded), (0, 0), "rows and inbox records kept");
    assert!(
        runs.all().iter().all(|(_, ended)| ended.is_none()),
        "a run went on past its timeout"
    );
    assert!(
        settled < HELD * 2,
        "stopped at the timeout: archived after {settled:?}"
    );
    let stored = message(&queue, &id).await.unwrap();
    assert_eq!((stored.retry, stored.retried, stored.timeout), (1, 1, 1));
    assert!(
        stored.error_msg.contains("deadline exceeded"),
        "{}",
        stored.error_msg
    );
}

/// How long the snoozing listeners put themselves off.
const SNOOZE: Duration = Duration::from_millis(200);

#[tokio::test]
async fn a_snooze_spends_no_attempt_and_runs_again_after_its_time() {
    // Arrange: a listener with no retry at all that snoozes twice, then
    // succeeds.
    let (db, queue) = (TestDatabase::empty().await, TestQueue::new().await);
    let runs = Runs::default();
    let mut listeners = Listeners::new();
    listeners.listen_with("payment", ListenerOptions::new().retries(0), {
        let runs = runs.clone();
        move |_: Charged, _: ListenerContext| {
            let run = runs.start();
            let runs = runs.clone();
            async move {
                runs.end(run);
                if run <= 2 {
                    return Err(
                        anyhow::Error::from(Snooze::after(SNOOZE)).context("the bank said 429")
                    );
                }
                Ok(())
            }
        }
    });
    let metrics = ListenerMetrics::default();
    let (stop, worker) = start_worker(&queue, &db.pool, listeners, &metrics);
    let (event_id, event) = event_task(&queue);
    let id = listener_task_id(event_id, "payment").to_string();

    // Act
    enqueue(&queue.client, event).await;
    eventually(WAIT, "the listener task completed", || {
        is_in(&queue, keys::completed(&queue.name), &id)
    })
    .await;
    stop.cancel();
    worker.await.unwrap();

    // Assert
    let runs = runs.all();
    assert_eq!(runs.len(), 3, "two snoozes and the run that succeeded");
    for pair in runs.windows(2) {
        let (snoozed_at, next) = (pair[0].1.unwrap(), pair[1].0);
        assert!(
            next >= snoozed_at + SNOOZE,
            "ran again {:?} after its snooze of {SNOOZE:?}",
            next - snoozed_at
        );
    }
    let stored = message(&queue, &id).await.unwrap();
    assert_eq!(stored.retried, 0, "no attempt spent");
    assert_eq!(stored.error_msg, "", "no failure recorded");
    assert_eq!(
        stored
            .headers
            .get(crate::queue::SNOOZES_HEADER)
            .map(String::as_str),
        Some("2")
    );
    assert_eq!(metrics.failed.get_or_create(&labels()).get(), 0);
    assert_eq!(metrics.snoozes.get_or_create(&labels()).get(), 2);
    assert_eq!(metrics.succeeded.get_or_create(&labels()).get(), 1);
}

#[tokio::test]
async fn a_snooze_past_its_bound_spends_an_attempt() {
    // Arrange: a listener that always snoozes, allowed one snooze and one
    // retry.
    let (db, queue) = (TestDatabase::empty().await, TestQueue::new().await);
    let runs = Runs::default();
    let mut listeners = Listeners::new();
    listeners.listen_with(
        "payment",
        ListenerOptions::new()
            .retries(1)
            .max_snoozes(1)
            .backoff(Backoff::fixed(Duration::ZERO)),
        {
            let runs = runs.clone();
            move |_: Charged, _: ListenerContext| {
                runs.start();
                async { Err(Snooze::after(SNOOZE).into()) }
            }
        },
    );
    let metrics = ListenerMetrics::default();
    let (stop, worker) = start_worker(&queue, &db.pool, listeners, &metrics);
    let (event_id, event) = event_task(&queue);
    let id = listener_task_id(event_id, "payment").to_string();

    // Act
    enqueue(&queue.client, event).await;
    eventually(WAIT, "the listener task archived", || {
        is_in(&queue, keys::archived(&queue.name), &id)
    })
    .await;
    stop.cancel();
    worker.await.unwrap();

    // Assert: one snooze, then two failures (the run and its retry).
    assert_eq!(runs.count(), 3);
    let stored = message(&queue, &id).await.unwrap();
    assert_eq!(stored.retried, 1);
    assert!(
        stored
            .error_msg
            .contains("snoozed 2 times, past its bound of 1"),
        "{}",
        stored.error_msg
    );
    assert_eq!(metrics.snoozes.get_or_create(&labels()).get(), 1);
    assert_eq!(metrics.failed.get_or_create(&labels()).get(), 2);
}

/// The listeners of the send-back test: `payment`, with `options`, whose
/// first three runs snooze and whose fourth succeeds.
fn snoozing_three_times(runs: &Runs, options: ListenerOptions<Charged>) -> Listeners {
    let mut listeners = Listeners::new();
    listeners.listen_with("payment", options, {
        let runs = runs.clone();
        move |_: Charged, _: ListenerContext| {
            let run = runs.start();
            let runs = runs.clone();
            async move {
                runs.end(run);
                if run <= 3 {
                    return Err(Snooze::after(SNOOZE).into());
                }
                Ok(())
            }
        }
    });
    listeners
}

#[tokio::test]
async fn a_task_sent_back_snoozes_afresh_with_its_listeners_policy_now() {
    // Arrange: a listener allowed one snooze and no retry, whose task is
    // archived by its second snooze; then its policy raised (as a new
    // build or WORKER_RETRIES would), as `outbox retry-archived` sees it.
    let (db, queue) = (TestDatabase::migrated().await, TestQueue::new().await);
    let runs = Runs::default();
    let before = ListenerOptions::new()
        .retries(0)
        .max_snoozes(1)
        .backoff(Backoff::fixed(Duration::ZERO));
    let metrics = ListenerMetrics::default();
    let (stop, worker) = start_worker(
        &queue,
        &db.pool,
        snoozing_three_times(&runs, before),
        &metrics,
    );
    let (event_id, event) = event_task(&queue);
    let id = listener_task_id(event_id, "payment").to_string();
    enqueue(&queue.client, event).await;
    eventually(WAIT, "the listener task archived", || {
        is_in(&queue, keys::archived(&queue.name), &id)
    })
    .await;
    stop.cancel();
    worker.await.unwrap();
    assert_eq!(runs.count(), 2, "a snooze, then one past the bound");
    let now = || {
        ListenerOptions::new()
            .retries(2)
            .timeout(Duration::from_secs(7))
            .max_snoozes(1)
            .backoff(Backoff::fixed(Duration::ZERO))
    };
    let mut config = crate::testing::config(&db.url());
    config.valkey.addr = Some(super::support::valkey_addr());
    config.outbox.queues = queue.name.parse().unwrap();
    config.worker.queues = queue.name.parse().unwrap();
    let context = crate::follow::Context::new(config, snoozing_three_times(&runs, now()));
    let args = crate::operations::retry_archived::Args {
        listener: None,
        since: None,
        include_cancelled: false,
    };

    // Act: sent back, then run by a worker of the listener as it is now.
    crate::operations::retry_archived::run(
        &context,
        &args,
        crate::operations::output::Format::Json,
    )
    .await
    .unwrap();
    let sent_back = message(&queue, &id).await.expect("the task sent back");
    let (stop, worker) = start_worker(
        &queue,
        &db.pool,
        snoozing_three_times(&runs, now()),
        &metrics,
    );
    eventually(WAIT, "the task sent back completed", || async {
        is_in(&queue, keys::completed(&queue.name), &id).await
            || is_in(&queue, keys::archived(&queue.name), &id).await
    })
    .await;
    stop.cancel();
    worker.await.unwrap();

    // Assert: its snooze after the send-back spent no attempt; it ran
    // again after the snooze and succeeded.
    let stored = message(&queue, &id).await.unwrap();
    assert_eq!(
        stored.retried, 0,
        "the snooze after the send-back spent an attempt"
    );
    assert!(
        is_in(&queue, keys::completed(&queue.name), &id).await,
        "{}",
        stored.error_msg
    );
    let all = runs.all();
    assert_eq!(all.len(), 4, "two runs, sent back, a snooze and a success");
    assert!(
        all[3].0 >= all[2].1.unwrap() + SNOOZE,
        "ran again before its snooze was over"
    );
    assert_eq!(
        (sent_back.retry, sent_back.timeout, sent_back.retried),
        (2, 7, 0),
        "the task sent back takes its listener's policy now"
    );
    assert_eq!(sent_back.headers.get(crate::queue::SNOOZES_HEADER), None);
    assert_eq!(metrics.snoozes.get_or_create(&labels()).get(), 2);
}

#[tokio::test]
async fn an_ordered_listener_that_snoozes_keeps_its_keys_turn_and_its_policy() {
    // Arrange: an ordered listener with a policy of its own, whose run of
    // a key's first step snoozes once; two steps of the key.
    use super::ordering::{Placed, Running, SEEN, dispatch_step, publish_shuffled, record, seen};
    let db = TestDatabase::migrated().await;
    let queue = TestQueue::new().await;
    sqlx::query(SEEN).execute(&db.pool).await.unwrap();
    let snoozed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut listeners = Listeners::new();
    listeners.listen_with(
        "ledger",
        ListenerOptions::new()
            .ordered()
            .retries(3)
            .timeout(Duration::from_secs(9)),
        {
            let snoozed = Arc::clone(&snoozed);
            move |event: Placed, ctx: ListenerContext| {
                let snoozed = Arc::clone(&snoozed);
                async move {
                    if event.n == 1 && !snoozed.swap(true, std::sync::atomic::Ordering::SeqCst) {
                        return Err(Snooze::after(SNOOZE).into());
                    }
                    record(&ctx, event.key, event.n).await
                }
            }
        },
    );
    dispatch_step(&db.pool, 1, 1).await;
    dispatch_step(&db.pool, 1, 3).await;
    let events: Vec<uuid::Uuid> =
        sqlx::query_scalar("SELECT event_id FROM outbox_events ORDER BY id")
            .fetch_all(&db.pool)
            .await
            .unwrap();

    // Act
    let running = Running::start(&queue, &db.pool, listeners);
    publish_shuffled(&db.pool, &queue, &mut fastrand::Rng::new()).await;
    eventually(WAIT, "both steps seen", || async {
        seen(&db.pool)
            .await
            .get(&1)
            .is_some_and(|steps| steps.len() == 2)
    })
    .await;
    running.stop().await;

    // Assert: the second step waited for the first, which snoozed.
    assert!(snoozed.load(std::sync::atomic::Ordering::SeqCst));
    assert_eq!(seen(&db.pool).await[&1], vec![1, 3]);
    let first = listener_task_id(events[0], "ledger").to_string();
    let stored = message(&queue, &first).await.expect("the first step's run");
    assert_eq!(
        (stored.retry, stored.timeout, stored.retried),
        (3, 9, 0),
        "the run's task has its listener's policy, no attempt spent"
    );
    assert_eq!(
        stored
            .headers
            .get(crate::queue::SNOOZES_HEADER)
            .map(String::as_str),
        Some("1")
    );
}

#[tokio::test]
async fn tasks_made_again_carry_their_listeners_policy_and_event_tasks_the_default() {
    // Arrange: a listener with a policy of its own, as `outbox replay` and
    // the console's "Send back" see it; one stored event.
    let db = TestDatabase::empty().await;
    let mut listeners = Listeners::new();
    listeners.listen_with(
        "payment",
        ListenerOptions::new()
            .retries(2)
            .timeout(Duration::from_secs(7)),
        |_: Charged, _: ListenerContext| async { Ok(()) },
    );
    let context = crate::follow::Context::new(crate::testing::config(&db.url()), listeners);
    let row = crate::follow::rows::EventRow {
        id: uuid::Uuid::now_v7(),
        name: Charged::NAME.to_string(),
        created_at: chrono::Utc::now(),
        published_at: None,
        payload: serde_json::json!({"order": 7}),
        metadata: Default::default(),
    };
    let queues = ["default".to_string()];

    // Act
    let rows = std::slice::from_ref(&row);
    let replayed = crate::replay::plan(&context, rows, &queues, Some("payment")).unwrap();
    let event = crate::replay::plan(&context, rows, &queues, None).unwrap();
    let sent_back = crate::worker::failures::sent_back_task(
        &row.envelope(),
        "listener:policyCharged:payment".to_string(),
        "a-task".to_string(),
        "default",
        Duration::from_secs(60),
        context.listeners.policy_of(Charged::NAME, "payment"),
    );

    // Assert
    let policy = |task: &NewTask| (task.max_retry, task.timeout.as_secs());
    assert_eq!(policy(&replayed[0].1), (2, 7), "outbox replay --listener");
    assert_eq!(policy(&sent_back), (2, 7), "send back");
    assert_eq!(policy(&event[0].1), (25, 1800), "an event task");
}
