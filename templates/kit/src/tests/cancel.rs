//! Cancelling an event's listener tasks (`outbox cancel`, the kit call,
//! the console's Cancel) against real Postgres and Valkey: the tasks that
//! wait are deleted, those that run are stopped by a kit worker and not
//! retried, each is recorded as cancelled, "Send back" leaves them unless
//! asked, and the console's button is behind its token, CSRF and
//! read-only rules.

#![cfg(feature = "worker")]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::time::Duration;

#[cfg(feature = "testing")]
use axum::body::Body;
#[cfg(feature = "testing")]
use axum::http::{Request, header};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::support::{TestDatabase, TestQueue, eventually, valkey_addr};
use crate::follow::Context;
use crate::outbox::{Envelope, Event, dispatch};
use crate::queue::{ConsumerOptions, NewTask, keys};
use crate::worker::listeners::{ListenerContext, ListenerError, ListenerOptions, Listeners};
use crate::worker::task_names::{ORDERED_HEADER, listener_task_id};

/// The event of these tests.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Reminded {
    n: i32,
}

impl Event for Reminded {
    const NAME: &'static str = "testCancelReminded";
}

/// An ordered event: its runs of an ordered listener come one at a time.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Stepped {
    n: i32,
}

impl Event for Stepped {
    const NAME: &'static str = "testCancelStepped";

    fn order_key(&self) -> Option<String> {
        Some("cart:1".into())
    }
}

/// What the listeners commit in `ctx.once`: (listener, n).
const DONE: &str = "CREATE TABLE done (listener text NOT NULL, n int NOT NULL)";

/// How long a blocking listener holds its `ctx.once` transaction open
/// before it commits: past the time a test takes to cancel it, so only a
/// run that is stopped leaves nothing committed.
const HOLD: Duration = Duration::from_secs(3);

/// A listener that commits `(name, n)` in `ctx.once`, after holding its
/// transaction open for [`HOLD`] when `blocks` is true (counting in
/// `started` that it did begin).
async fn commit(
    context: &ListenerContext,
    name: &'static str,
    n: i32,
    blocks: bool,
    started: Arc<AtomicUsize>,
) -> Result<(), ListenerError> {
    context
        .once(async |tx| {
            sqlx::query("INSERT INTO done (listener, n) VALUES ($1, $2)")
                .bind(name)
                .bind(n)
                .execute(&mut *tx)
                .await?;
            started.fetch_add(1, AtomicOrdering::SeqCst);
            if blocks {
                tokio::time::sleep(HOLD).await;
            }
            Ok(())
        })
        .await?;
    Ok(())
}

/// A service of its own: a database, a queue, and listeners `a`, `b` and
/// `c` of [`Reminded`] (each blocks when `blocking`) and `ledger`, ordered,
/// of [`Stepped`] (its run of step 1 blocks).
struct Service {
    db: TestDatabase,
    queue: TestQueue,
    listeners: Listeners,
    started: Arc<AtomicUsize>,
}

impl Service {
    async fn new(blocking: bool) -> Self {
        let db = TestDatabase::migrated().await;
        sqlx::query(DONE).execute(&db.pool).await.unwrap();
        let started = Arc::new(AtomicUsize::new(0));
        let mut listeners = Listeners::new();
        for name in ["a", "b", "c"] {
            let started = started.clone();
            listeners.listen(name, move |event: Reminded, context: ListenerContext| {
                let started = started.clone();
                async move { commit(&context, name, event.n, blocking, started).await }
            });
        }
        let counted = started.clone();
        listeners.listen_with(
            "ledger",
            ListenerOptions::new().ordered(),
            move |event: Stepped, context: ListenerContext| {
                let started = counted.clone();
                async move { commit(&context, "ledger", event.n, event.n == 1, started).await }
            },
        );
        Self {
            db,
            queue: TestQueue::new().await,
            listeners,
            started,
        }
    }

    fn config(&self) -> crate::config::Config {
        let mut config = crate::testing::config(&self.db.url());
        config.valkey.addr = Some(valkey_addr());
        config.outbox.queues = self.queue.name.parse().unwrap();
        config.worker.queues = self.queue.name.parse().unwrap();
        config
    }

    fn context(&self) -> Context {
        Context::new(self.config(), self.listeners.clone())
    }

    /// Stores a [`Reminded`] in the outbox.
    async fn event(&self, n: i32) -> Envelope {
        dispatch(&self.db.pool, &Reminded { n }).await.unwrap()
    }

    /// The task of `listener` for `event`, as the fan-out queues it.
    fn task(&self, event: &Envelope, listener: &str) -> NewTask {
        NewTask::new(
            format!("listener:{}:{listener}", event.name),
            listener_task_id(event.id, listener).to_string(),
            serde_json::to_vec(event).unwrap(),
        )
        .queue(&self.queue.name)
        .max_retry(25)
    }

    async fn enqueue(&self, tasks: &[NewTask]) {
        for outcome in self.queue.client.enqueue(tasks).await.unwrap() {
            outcome.unwrap();
        }
    }

    /// Moves the pending task `id` to `state` (`scheduled` or `retry`),
    /// due in an hour, as asynq leaves a task there.
    async fn move_to(&self, id: &str, state: &str) {
        let mut conn = self.queue.connection().await;
        let set = format!("{}{state}", keys::queue_prefix(&self.queue.name));
        let due = chrono::Utc::now().timestamp() + 3600;
        redis::pipe()
            .lrem(keys::pending(&self.queue.name), 0, id)
            .zadd(set, id, due)
            .hset(keys::task(&self.queue.name, id), "state", state)
            .query_async::<()>(&mut conn)
            .await
            .unwrap();
    }

    /// The state of the task `id`, or `None` when the queue does not have it.
    async fn state(&self, id: &str) -> Option<String> {
        let mut conn = self.queue.connection().await;
        redis::cmd("HGET")
            .arg(keys::task(&self.queue.name, id))
            .arg("state")
            .query_async(&mut conn)
            .await
            .unwrap()
    }

    /// The cancellations recorded: (task id, listener, state), by listener.
    async fn recorded(&self) -> Vec<(String, String, String)> {
        sqlx::query_as(
            "SELECT task_id, listener, state FROM listener_cancellations ORDER BY listener",
        )
        .fetch_all(&self.db.pool)
        .await
        .unwrap()
    }

    /// The work committed: (listener, n).
    async fn done(&self) -> Vec<(String, i32)> {
        sqlx::query_as("SELECT listener, n FROM done ORDER BY listener, n")
            .fetch_all(&self.db.pool)
            .await
            .unwrap()
    }

    /// A kit worker of the queue, as `crate::worker::run` wires it
    /// (failures recorded before the archive, cancellations on cancel).
    fn run_worker(&self) -> Worker {
        self.run_worker_with(|_| {})
    }

    /// [`Self::run_worker`], its consumer given to `more` first (handlers
    /// of other task types).
    fn run_worker_with(&self, more: impl FnOnce(&mut crate::queue::Consumer)) -> Worker {
        let options = ConsumerOptions {
            queues: self.queue.name.parse().unwrap(),
            concurrency: 10,
            shutdown_timeout: Duration::from_millis(100),
            poll_interval: Duration::from_millis(50),
            forward_interval: Duration::from_millis(50),
            retry_delay: |_| Duration::from_millis(20),
            ..ConsumerOptions::default()
        };
        let mut consumer = super::ordering::worker_with(
            self.queue.client.clone(),
            &self.queue.name,
            &self.db.pool,
            self.listeners.clone(),
            options,
        );
        crate::worker::cancellations::record_on_cancel(
            &mut consumer,
            self.db.pool.clone(),
            super::ordering::chains(&self.db.pool, &self.queue),
        );
        more(&mut consumer);
        let stop = CancellationToken::new();
        let running = tokio::spawn(consumer.run(stop.clone().cancelled_owned()));
        Worker { stop, running }
    }

    /// Waits until `n` listener runs began.
    async fn started(&self, n: usize) {
        let started = &self.started;
        eventually(
            Duration::from_secs(4),
            "the listeners to start",
            || async move { started.load(AtomicOrdering::SeqCst) >= n },
        )
        .await;
    }
}

struct Worker {
    stop: CancellationToken,
    running: tokio::task::JoinHandle<Result<(), crate::queue::QueueError>>,
}

impl Worker {
    async fn stop(self) {
        self.stop.cancel();
        self.running.await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn outbox_cancel_deletes_pending_scheduled_and_retrying_tasks_and_records_them() {
    // Arrange: the event's task of `a` pending, of `b` scheduled, of `c`
    // waiting for a retry; another event's task of `a` pending.
    let service = Service::new(false).await;
    let (event, other) = (service.event(1).await, service.event(2).await);
    let id = |listener| listener_task_id(event.id, listener).to_string();
    service
        .enqueue(&[
            service.task(&event, "a"),
            service.task(&event, "b"),
            service.task(&event, "c"),
            service.task(&other, "a"),
        ])
        .await;
    service.move_to(&id("b"), "scheduled").await;
    service.move_to(&id("c"), "retry").await;
    let context = service.context();

    // Act
    let done = crate::operations::cancel::cancel(&context, event.id, None)
        .await
        .unwrap();

    // Assert: each deleted from where it waited, recorded as cancelled;
    // the other event's task is untouched.
    let mut deleted: Vec<(String, String)> = done
        .deleted
        .iter()
        .map(|task| (task.listener.clone(), task.state.clone()))
        .collect();
    deleted.sort();
    assert_eq!(
        deleted,
        [("a", "pending"), ("b", "scheduled"), ("c", "retry")]
            .map(|(l, s)| (l.to_string(), s.to_string()))
    );
    assert!(done.asked_to_stop.is_empty() && done.left.is_empty() && done.not_found.is_empty());
    for listener in ["a", "b", "c"] {
        assert_eq!(service.state(&id(listener)).await, None, "{listener}");
    }
    let counts = service
        .queue
        .client
        .queue_counts(&service.queue.name)
        .await
        .unwrap();
    assert_eq!((counts.scheduled, counts.retry), (0, 0));
    assert_eq!(
        service.queue.pending_ids().await,
        [listener_task_id(other.id, "a").to_string()]
    );
    assert_eq!(
        service.recorded().await,
        [("a", "pending"), ("b", "scheduled"), ("c", "retry")].map(|(l, s)| (
            id(l),
            l.to_string(),
            s.to_string()
        ))
    );
}

#[tokio::test]
async fn an_unknown_event_or_listener_is_a_clear_error_and_changes_nothing() {
    // Arrange
    let service = Service::new(false).await;
    let event = service.event(1).await;
    service.enqueue(&[service.task(&event, "a")]).await;
    let context = service.context();
    let unknown = Uuid::now_v7();

    // Act
    let no_event = crate::operations::cancel::cancel(&context, unknown, None).await;
    let no_listener = crate::operations::cancel::cancel(&context, event.id, Some("nope")).await;

    // Assert
    let no_event = format!("{:#}", no_event.unwrap_err());
    assert!(
        no_event.contains(&format!("no event {unknown} in outbox_events"))
            && no_event.contains("nothing was cancelled"),
        "{no_event}"
    );
    let no_listener = format!("{:#}", no_listener.unwrap_err());
    assert!(
        no_listener.contains(
            "`nope` is not a listener of `testCancelReminded` in this service (its listeners: a, b, c); \
             nothing was cancelled"
        ),
        "{no_listener}"
    );
    let id = listener_task_id(event.id, "a").to_string();
    assert_eq!(service.state(&id).await.as_deref(), Some("pending"));
    assert!(service.recorded().await.is_empty());
}

#[tokio::test]
async fn an_event_not_due_yet_is_cancelled_whole_and_never_runs() {
    // Arrange: an event dispatched for an hour from now, and one for later
    // still, which stays.
    let service = Service::new(false).await;
    let later = |n: i32| {
        let pool = service.db.pool.clone();
        async move {
            crate::outbox::dispatch_in(&pool, &Reminded { n }, Duration::from_secs(3600))
                .await
                .unwrap()
        }
    };
    let (cancelled, kept) = (later(1).await, later(2).await);
    let context = service.context();

    // Act: one listener alone is refused; the whole event is cancelled.
    let one = crate::operations::cancel::cancel(&context, cancelled.id, Some("a")).await;
    let waiting_before: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_later")
        .fetch_one(&service.db.pool)
        .await
        .unwrap();
    let done = crate::operations::cancel::cancel(&context, cancelled.id, None)
        .await
        .unwrap();

    // Assert
    let one = format!("{:#}", one.unwrap_err());
    assert!(
        one.contains("(dispatched for later) and is cancelled whole; nothing was cancelled"),
        "{one}"
    );
    assert_eq!(waiting_before, 2, "the refused cancel deleted a row");
    let reported: Vec<(&str, &str)> = done
        .deleted
        .iter()
        .map(|t| (t.listener.as_str(), t.state.as_str()))
        .collect();
    assert_eq!(reported, [("a", "later"), ("b", "later"), ("c", "later")]);
    let waiting: Vec<Uuid> = sqlx::query_scalar("SELECT event_id FROM outbox_later")
        .fetch_all(&service.db.pool)
        .await
        .unwrap();
    assert_eq!(waiting, [kept.id], "only the cancelled event's row goes");
    // Even once it would be due, nothing of it reaches the outbox.
    let as_of = chrono::Utc::now() + chrono::TimeDelta::hours(2);
    crate::outbox::Store
        .move_due_and_look_ahead(&service.db.pool, 100, Some(as_of))
        .await
        .unwrap();
    let moved: Vec<Uuid> = sqlx::query_scalar("SELECT event_id FROM outbox_events")
        .fetch_all(&service.db.pool)
        .await
        .unwrap();
    assert_eq!(moved, [kept.id]);
}

#[cfg(feature = "testing")]
#[tokio::test]
async fn an_event_not_due_yet_is_named_as_waiting_and_the_later_pages_cancel_deletes_it() {
    // Arrange: an event an hour away, and the console (one read-only).
    let service = Service::new(false).await;
    let waiting = crate::outbox::dispatch_in(
        &service.db.pool,
        &Reminded { n: 1 },
        Duration::from_secs(3600),
    )
    .await
    .unwrap();
    let (console, read_only) = (console(&service, false), console(&service, true));
    let get = |path: String| {
        Request::get(path)
            .header(header::AUTHORIZATION, "Bearer t")
            .body(Body::empty())
            .unwrap()
    };

    // Act
    let shown = service.context().event(waiting.id).await;
    let later = console.request(get("/later".into())).await.text();
    let later_read_only = read_only.request(get("/later".into())).await.text();
    let path = format!("/events/{}/cancel", waiting.id);
    let cancelled = console
        .request(post(&path, &format!("csrf={}", csrf_in(&later)), true))
        .await;
    let after = console
        .request(get(format!("/later?cancelled={}", waiting.id)))
        .await
        .text();

    // Assert: `outbox show` and the event page say it waits, not "never
    // stored"; the Later page's Cancel deletes it (the read-only one has
    // none).
    let shown = format!("{:#}", shown.unwrap_err());
    assert!(
        shown.contains("waits until") && shown.contains(&format!("`outbox cancel {}`", waiting.id)),
        "{shown}"
    );
    let form = format!("action=\"events/{}/cancel\"", waiting.id);
    assert!(later.contains(&form), "{later}");
    assert!(!later_read_only.contains(&form), "{later_read_only}");
    assert_eq!(cancelled.status(), 303, "{}", cancelled.text());
    assert!(
        after.contains(&format!("Cancelled <code>{}</code>", waiting.id))
            && after.contains("No event waits to be delivered later."),
        "{after}"
    );
}

#[tokio::test]
async fn a_running_task_stops_on_a_kit_worker_and_is_not_retried_and_only_its_listener() {
    // Arrange: `a` and `b` both running, each inside its `ctx.once`.
    let service = Service::new(true).await;
    let event = service.event(1).await;
    let id = |listener| listener_task_id(event.id, listener).to_string();
    service
        .enqueue(&[service.task(&event, "a"), service.task(&event, "b")])
        .await;
    let worker = service.run_worker();
    service.started(2).await;
    let running_since = std::time::Instant::now();
    let context = service.context();

    // Act: `--listener a`, then its ask again, as the command publishes
    // it, until the worker's subscription (on its way at start-up) hears it.
    let done = crate::operations::cancel::cancel(&context, event.id, Some("a"))
        .await
        .unwrap();
    let (service, a) = (&service, &id("a"));
    eventually(
        Duration::from_secs(4),
        "a's task to be cancelled",
        || async move {
            service.queue.client.publish_cancel(a).await.unwrap();
            service.state(a).await.is_none()
        },
    )
    .await;
    let b_after = service.state(&id("b")).await;
    // Past a's hold: had its run gone on, its work would have committed by
    // now, as b's does.
    eventually(
        Duration::from_secs(5),
        "b's work committed and a's hold over",
        || async move {
            running_since.elapsed() > HOLD + Duration::from_millis(300)
                && !service.done().await.is_empty()
        },
    )
    .await;
    worker.stop().await;

    // Assert: a's run stopped and its task is gone (not retried, not
    // pending), its `ctx.once` work rolled back, recorded as cancelled;
    // b's run went on and committed.
    let asked: Vec<(&str, &str)> = done
        .asked_to_stop
        .iter()
        .map(|task| (task.listener.as_str(), task.state.as_str()))
        .collect();
    assert_eq!(asked, [("a", "active")]);
    assert!(done.deleted.is_empty());
    assert_eq!(b_after.as_deref(), Some("active"));
    let counts = service
        .queue
        .client
        .queue_counts(&service.queue.name)
        .await
        .unwrap();
    assert_eq!((counts.retry, counts.archived), (0, 0));
    assert!(!service.queue.pending_ids().await.contains(&id("a")));
    assert_eq!(service.done().await, [("b".to_string(), 1)]);
    assert_eq!(
        service.recorded().await,
        [(id("a"), "a".to_string(), "active".to_string())]
    );
}

#[tokio::test]
async fn a_cancelled_fan_out_or_schedule_task_is_retried_as_in_go_asynq() {
    // Arrange: an `event:` (fan-out) and a `job:` (schedule) task running
    // on a kit worker, each until cancelled, counting its runs.
    let service = Service::new(false).await;
    let tasks = [
        ("event:testCancelSlowFanOut", "fan-out-1"),
        ("job:testCancelSlowJob", "job-1"),
    ];
    let runs: Arc<[AtomicUsize; 2]> = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let worker = service.run_worker_with(|consumer| {
        for (i, (task_type, _)) in tasks.into_iter().enumerate() {
            let runs = runs.clone();
            consumer.handle(task_type, move |_| {
                runs[i].fetch_add(1, AtomicOrdering::SeqCst);
                std::future::pending()
            });
        }
    });
    service
        .enqueue(&tasks.map(|(task_type, id)| {
            NewTask::new(task_type, id, b"{}".to_vec())
                .queue(&service.queue.name)
                .max_retry(25)
        }))
        .await;

    // Act: asynqmon's Cancel on each, until the worker's subscription
    // hears it and the task is either gone or run again.
    let (service, runs) = (&service, &runs);
    for (i, (_, id)) in tasks.into_iter().enumerate() {
        eventually(
            Duration::from_secs(4),
            "the cancelled task to settle",
            || async move {
                if runs[i].load(AtomicOrdering::SeqCst) == 0 {
                    return false;
                }
                service.queue.client.publish_cancel(id).await.unwrap();
                service.state(id).await.is_none() || runs[i].load(AtomicOrdering::SeqCst) >= 2
            },
        )
        .await;
    }
    let states = [
        service.state(tasks[0].1).await,
        service.state(tasks[1].1).await,
    ];
    worker.stop().await;

    // Assert: each failed as in Go asynq and was retried (run again), not
    // deleted; nothing recorded as a listener's cancellation.
    for (i, (_, id)) in tasks.into_iter().enumerate() {
        assert!(states[i].is_some(), "{id} was deleted");
        assert!(
            runs[i].load(AtomicOrdering::SeqCst) >= 2,
            "{id} not retried"
        );
    }
    assert!(service.recorded().await.is_empty());
}

#[tokio::test]
async fn a_cancelled_run_whose_record_fails_is_kept_and_retried() {
    // Arrange: `a` running on a kit worker; its cancellation cannot be
    // recorded (the table is away).
    let service = Service::new(true).await;
    let event = service.event(1).await;
    let id = listener_task_id(event.id, "a").to_string();
    service.enqueue(&[service.task(&event, "a")]).await;
    let worker = service.run_worker();
    service.started(1).await;
    sqlx::query("ALTER TABLE listener_cancellations RENAME TO listener_cancellations_away")
        .execute(&service.db.pool)
        .await
        .unwrap();

    // Act: asynqmon's Cancel, until the worker hears it.
    let (service, a) = (&service, &id);
    eventually(
        Duration::from_secs(4),
        "a's run to be settled",
        || async move {
            service.queue.client.publish_cancel(a).await.unwrap();
            service.state(a).await.as_deref() != Some("active")
        },
    )
    .await;
    worker.stop().await;

    // Assert: kept, waiting for a retry, as a failure whose record failed.
    assert_eq!(service.state(&id).await.as_deref(), Some("retry"));
}

#[tokio::test]
async fn a_listener_cancelled_before_the_fan_out_gets_no_task() {
    // Arrange: an event committed, not published by the relay yet.
    let service = Service::new(false).await;
    let event = service.event(1).await;
    let context = service.context();

    // Act: `a` cancelled; then the event is fanned out.
    let done = crate::operations::cancel::cancel(&context, event.id, Some("a"))
        .await
        .unwrap();
    let fan_out = crate::queue::Task {
        task_type: format!("event:{}", event.name),
        id: event.id.to_string(),
        payload: serde_json::to_vec(&event).unwrap(),
        headers: Default::default(),
        queue: service.queue.name.clone(),
        retried: 0,
        max_retry: 25,
        failed_before: false,
    };
    let chains = super::ordering::chains(&service.db.pool, &service.queue);
    crate::worker::fan_out(&chains, &service.listeners, fan_out)
        .await
        .unwrap();

    // Assert: reported cancelled before its task was made, recorded; the
    // fan-out made the tasks of `b` and `c` alone.
    let deleted: Vec<(&str, &str)> = done
        .deleted
        .iter()
        .map(|t| (t.listener.as_str(), t.state.as_str()))
        .collect();
    assert_eq!(deleted, [("a", "before")]);
    assert!(done.not_found.is_empty());
    let mut pending = service.queue.pending_ids().await;
    pending.sort();
    let mut expected = ["b", "c"].map(|l| listener_task_id(event.id, l).to_string());
    expected.sort();
    assert_eq!(pending, expected);
    let a = listener_task_id(event.id, "a").to_string();
    assert_eq!(
        service.recorded().await,
        [(a, "a".to_string(), "before".to_string())]
    );
}

#[tokio::test]
async fn an_ordered_run_cancelled_before_the_fan_out_joins_no_chain_and_its_key_moves_on() {
    // Arrange: two steps of key cart:1 for the ordered `ledger`, neither
    // published; step 1's run of `ledger` cancelled.
    let service = Service::new(false).await;
    let first = dispatch(&service.db.pool, &Stepped { n: 1 }).await.unwrap();
    let second = dispatch(&service.db.pool, &Stepped { n: 2 }).await.unwrap();
    let done = crate::operations::cancel::cancel(&service.context(), first.id, Some("ledger"))
        .await
        .unwrap();
    let fan_out = |step: &Envelope| crate::queue::Task {
        task_type: format!("event:{}", step.name),
        id: step.id.to_string(),
        payload: serde_json::to_vec(step).unwrap(),
        headers: Default::default(),
        queue: service.queue.name.clone(),
        retried: 0,
        max_retry: 25,
        failed_before: false,
    };
    let chains = super::ordering::chains(&service.db.pool, &service.queue);

    // Act: both fanned out, in order.
    for step in [&first, &second] {
        crate::worker::fan_out(&chains, &service.listeners, fan_out(step))
            .await
            .unwrap();
    }

    // Assert: step 1's run was never made; step 2's is the key's turn now.
    let deleted: Vec<(&str, &str)> = done
        .deleted
        .iter()
        .map(|t| (t.listener.as_str(), t.state.as_str()))
        .collect();
    assert_eq!(deleted, [("ledger", "before")]);
    assert_eq!(
        service.queue.pending_ids().await,
        [listener_task_id(second.id, "ledger").to_string()]
    );
}

#[tokio::test]
async fn send_back_leaves_a_cancelled_task_unless_asked() {
    // Arrange: `a`'s task cancelled while pending.
    let service = Service::new(false).await;
    let event = service.event(1).await;
    let id = listener_task_id(event.id, "a").to_string();
    service.enqueue(&[service.task(&event, "a")]).await;
    let context = service.context();
    crate::operations::cancel::cancel(&context, event.id, None)
        .await
        .unwrap();
    let args = |include_cancelled| crate::operations::retry_archived::Args {
        listener: None,
        since: None,
        include_cancelled,
    };
    let json = crate::operations::output::Format::Json;

    // Act
    crate::operations::retry_archived::run(&context, &args(false), json)
        .await
        .unwrap();
    let after_send_back = service.state(&id).await;
    crate::operations::retry_archived::run(&context, &args(true), json)
        .await
        .unwrap();

    // Assert
    assert_eq!(after_send_back, None, "sent back without being asked");
    assert_eq!(service.state(&id).await.as_deref(), Some("pending"));
    assert!(
        service.recorded().await.is_empty(),
        "its record is forgotten"
    );
}

#[tokio::test]
async fn a_cancelled_task_with_a_failure_recorded_is_not_sent_back() {
    // Arrange: `a`'s task archived earlier (its failure recorded), run
    // again from asynqmon (pending, the failure row stays), then cancelled.
    let service = Service::new(false).await;
    let event = service.event(1).await;
    let id = listener_task_id(event.id, "a").to_string();
    service.enqueue(&[service.task(&event, "a")]).await;
    sqlx::query(
        "INSERT INTO listener_failures \
           (task_id, queue, event_id, event_name, listener, error, attempts, holds_key) \
         VALUES ($1, $2, $3, $4, 'a', 'boom', 26, false)",
    )
    .bind(&id)
    .bind(&service.queue.name)
    .bind(event.id)
    .bind(&event.name)
    .execute(&service.db.pool)
    .await
    .unwrap();
    let context = service.context();
    crate::operations::cancel::cancel(&context, event.id, Some("a"))
        .await
        .unwrap();

    // Act: a plain Send back.
    let args = crate::operations::retry_archived::Args {
        listener: None,
        since: None,
        include_cancelled: false,
    };
    crate::operations::retry_archived::run(
        &context,
        &args,
        crate::operations::output::Format::Json,
    )
    .await
    .unwrap();

    // Assert: not queued again; recorded as cancelled, not as failed.
    assert_eq!(
        service.state(&id).await,
        None,
        "sent back without being asked"
    );
    let failures: i64 = sqlx::query_scalar("SELECT count(*) FROM listener_failures")
        .fetch_one(&service.db.pool)
        .await
        .unwrap();
    assert_eq!(failures, 0);
    assert_eq!(service.recorded().await.len(), 1);
}

#[tokio::test]
async fn cancelling_a_woken_waiter_frees_its_concurrency_slot_at_once() {
    use crate::worker::limits::{Acquired, Limiter, Limits};
    // Arrange: `capped` runs one at a time (slots leased for 30 s). Run 1
    // holds the slot; run 2 waits for it in scheduled; run 1 ends and the
    // slot is handed to run 2, whose task is woken (pending).
    let mut service = Service::new(false).await;
    service.listeners.listen_with(
        "capped",
        ListenerOptions::new().concurrency(1),
        |_: Reminded, _: ListenerContext| async { Ok(()) },
    );
    let limits = Limits {
        concurrency: Some(1),
        rate: None,
    };
    let limiter = Limiter::new(
        service.queue.client.clone(),
        Reminded::NAME,
        "capped",
        limits,
    );
    let events = [
        service.event(1).await,
        service.event(2).await,
        service.event(3).await,
    ];
    let id = |i: usize| listener_task_id(events[i].id, "capped").to_string();
    let run = |i: usize| crate::queue::Task {
        task_type: format!("listener:{}:capped", Reminded::NAME),
        id: id(i),
        payload: serde_json::to_vec(&events[i]).unwrap(),
        headers: Default::default(),
        queue: service.queue.name.clone(),
        retried: 0,
        max_retry: 25,
        failed_before: false,
    };
    let Acquired::Granted(first) = limiter.acquire("", &run(0)).await.unwrap() else {
        panic!("run 1 takes the free slot");
    };
    service.enqueue(&[service.task(&events[1], "capped")]).await;
    service.move_to(&id(1), "scheduled").await;
    let waits = limiter.acquire("", &run(1)).await.unwrap();
    assert!(matches!(waits, Acquired::Wait { .. }), "{waits:?}");
    first.release().await;
    assert_eq!(service.state(&id(1)).await.as_deref(), Some("pending"));
    let context = service.context();

    // Act: run 2 cancelled before it ran; then run 3 asks.
    let done = crate::operations::cancel::cancel(&context, events[1].id, Some("capped"))
        .await
        .unwrap();
    let third = limiter.acquire("", &run(2)).await.unwrap();

    // Assert: run 2 deleted; its slot is free for run 3 now, not after
    // its lease.
    assert_eq!(done.deleted.len(), 1);
    assert!(
        matches!(third, Acquired::Granted(_)),
        "the cancelled waiter still holds the slot: {third:?}"
    );
}

#[tokio::test]
async fn a_cancelled_ordered_run_moves_its_key_on() {
    // Arrange: two steps of key cart:1 for the ordered `ledger`; step 1
    // runs (and blocks), step 2 waits behind it in the key's order.
    let service = Service::new(false).await;
    let first = dispatch(&service.db.pool, &Stepped { n: 1 }).await.unwrap();
    let second = dispatch(&service.db.pool, &Stepped { n: 2 }).await.unwrap();
    for step in [&first, &second] {
        let task = NewTask::new(
            format!("event:{}", step.name),
            step.id.to_string(),
            serde_json::to_vec(step).unwrap(),
        )
        .queue(&service.queue.name);
        service.enqueue(&[task]).await;
    }
    let worker = service.run_worker();
    service.started(1).await;
    let (context, service) = (&service.context(), &service);

    // Act
    let done = crate::operations::cancel::cancel(context, first.id, None)
        .await
        .unwrap();
    let head = &listener_task_id(first.id, "ledger").to_string();
    eventually(
        Duration::from_secs(4),
        "step 1 to be cancelled",
        || async move {
            service.queue.client.publish_cancel(head).await.unwrap();
            service.state(head).await.is_none()
        },
    )
    .await;
    eventually(Duration::from_secs(4), "step 2 to run", || async move {
        service.done().await.len() == 1
    })
    .await;
    worker.stop().await;

    // Assert: step 1 was asked to stop; the worker stopped it, recorded
    // it, and moved the key on: its work rolled back, step 2 ran after it.
    assert_eq!(done.asked_to_stop.len(), 1);
    assert_eq!(service.done().await, [("ledger".to_string(), 2)]);
    assert_eq!(
        service.recorded().await,
        [(head.clone(), "ledger".to_string(), "active".to_string())]
    );
}

#[tokio::test]
async fn a_waiting_run_taken_out_while_a_worker_has_it_never_rejoins_its_key() {
    // Arrange: step 1 of key cart:1 runs (and blocks); step 2 waits behind
    // it in the key's order, and its task is active on a worker that looks
    // at its turn (sent back earlier, its deferral not written yet).
    let service = Service::new(false).await;
    let first = dispatch(&service.db.pool, &Stepped { n: 1 }).await.unwrap();
    let second = dispatch(&service.db.pool, &Stepped { n: 2 }).await.unwrap();
    for step in [&first, &second] {
        let task = NewTask::new(
            format!("event:{}", step.name),
            step.id.to_string(),
            serde_json::to_vec(step).unwrap(),
        )
        .queue(&service.queue.name);
        service.enqueue(&[task]).await;
    }
    let worker = service.run_worker();
    service.started(1).await;
    let waiting = listener_task_id(second.id, "ledger").to_string();
    let mut conn = service.queue.connection().await;
    redis::cmd("HSET")
        .arg(keys::task(&service.queue.name, &waiting))
        .arg("state")
        .arg("active")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    let context = service.context();

    // Act: step 2 cancelled; then its run looks at its turn.
    let done = crate::operations::cancel::cancel(&context, second.id, None)
        .await
        .unwrap();
    let chains = super::ordering::chains(&service.db.pool, &service.queue);
    let run = crate::queue::Task {
        task_type: format!("listener:{}:ledger", second.name),
        id: waiting.clone(),
        payload: serde_json::to_vec(&second).unwrap(),
        headers: [(ORDERED_HEADER.to_string(), "cart:1".to_string())].into(),
        queue: service.queue.name.clone(),
        retried: 0,
        max_retry: 25,
        failed_before: false,
    };
    let turn = chains.turn("ledger", "cart:1", &run).await.unwrap();
    let in_chain = chains.run_of(&waiting).await.unwrap();
    worker.stop().await;

    // Assert: asked to stop, recorded as cancelled while waiting; its run
    // is over (not run), and it did not rejoin the key's order.
    let asked: Vec<(&str, &str)> = done
        .asked_to_stop
        .iter()
        .map(|task| (task.listener.as_str(), task.state.as_str()))
        .collect();
    assert_eq!(asked, [("ledger", "waiting")]);
    assert!(
        matches!(turn, crate::worker::ordering::Turn::Done),
        "{turn:?}"
    );
    assert!(
        in_chain.is_none(),
        "the cancelled run rejoined its key's order"
    );
    assert_eq!(
        service.recorded().await,
        [(waiting, "ledger".to_string(), "waiting".to_string())]
    );
}

/// The console of `service`, with the token `t`, read-only when asked.
#[cfg(feature = "testing")]
fn console(service: &Service, read_only: bool) -> crate::testing::TestClient {
    let mut console =
        crate::console::Console::new(service.config(), service.listeners.clone()).token("t");
    if read_only {
        console = console.read_only();
    }
    crate::testing::TestClient::new(console.router())
}

/// A POST of `form` to `path`, with the token when `token`.
#[cfg(feature = "testing")]
fn post(path: &str, form: &str, token: bool) -> Request<Body> {
    let mut request = Request::post(path)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header("sec-fetch-site", "same-origin");
    if token {
        request = request.header(header::AUTHORIZATION, "Bearer t");
    }
    request.body(Body::from(form.to_string())).unwrap()
}

/// The CSRF secret in a page's form.
#[cfg(feature = "testing")]
fn csrf_in(page: &str) -> String {
    page.split_once(r#"name="csrf" value=""#)
        .and_then(|(_, rest)| rest.split_once('"'))
        .map(|(secret, _)| secret.to_string())
        .unwrap_or_else(|| panic!("no CSRF field in {page}"))
}

#[cfg(feature = "testing")]
#[tokio::test]
async fn the_consoles_cancel_is_refused_without_its_token_csrf_or_when_read_only() {
    // (and its cancelled task goes back only with the send-back's box ticked)
    // Arrange
    let service = Service::new(false).await;
    let event = service.event(1).await;
    let id = listener_task_id(event.id, "a").to_string();
    service.enqueue(&[service.task(&event, "a")]).await;
    let (console, read_only) = (console(&service, false), console(&service, true));
    let page = console
        .request(
            Request::get(format!("/events/{}", event.id))
                .header(header::AUTHORIZATION, "Bearer t")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(page.status(), 200, "{}", page.text());
    assert!(page.text().contains("Cancel its listener tasks"));
    let secret = csrf_in(&page.text());
    let path = format!("/events/{}/cancel", event.id);

    // Act
    let without_token = console
        .request(post(&path, &format!("csrf={secret}"), false))
        .await;
    let without_csrf = console.request(post(&path, "", true)).await;
    let wrong_csrf = console.request(post(&path, "csrf=0123", true)).await;
    let when_read_only = read_only
        .request(post(&path, &format!("csrf={secret}"), true))
        .await;
    let still_pending = service.state(&id).await;
    let allowed = console
        .request(post(&path, &format!("csrf={secret}"), true))
        .await;

    // Assert
    assert_eq!(without_token.status(), 401);
    assert_eq!(without_csrf.status(), 403);
    assert_eq!(wrong_csrf.status(), 403);
    assert_eq!(when_read_only.status(), 403);
    assert_eq!(still_pending.as_deref(), Some("pending"));
    assert_eq!(allowed.status(), 303, "{}", allowed.text());
    assert_eq!(service.state(&id).await, None);
    let shown = console
        .request(
            Request::get(format!("/events/{}?cancelled=3&stopping=0", event.id))
                .header(header::AUTHORIZATION, "Bearer t")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .text();
    assert!(shown.contains("3 listener task(s) cancelled"), "{shown}");
    assert!(
        shown.contains(r#"<p class="cancelled" data-listener="a"><span class="state state-cancelled">cancelled</span>"#),
        "{shown}"
    );
    let failures = console
        .request(
            Request::get("/failures")
                .header(header::AUTHORIZATION, "Bearer t")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .text();
    assert!(
        failures.contains(&format!(r#"<tr data-task="{id}"><td><span class="state state-cancelled">cancelled</span> (was pending)"#)),
        "{failures}"
    );
    assert!(
        failures.contains(r#"name="include_cancelled""#),
        "{failures}"
    );
    let send_back = "/failures/send-back-cancelled";
    let unticked = console
        .request(post(send_back, &format!("csrf={secret}"), true))
        .await;
    let not_sent = service.state(&id).await;
    let ticked_form = format!("csrf={secret}&include_cancelled=yes");
    let ticked = console.request(post(send_back, &ticked_form, true)).await;
    assert_eq!(unticked.status(), 400, "{}", unticked.text());
    assert_eq!(not_sent, None, "sent back without its box ticked");
    assert_eq!(ticked.status(), 303, "{}", ticked.text());
    assert_eq!(service.state(&id).await.as_deref(), Some("pending"));
    let read_only_page = read_only
        .request(
            Request::get(format!("/events/{}", event.id))
                .header(header::AUTHORIZATION, "Bearer t")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .text();
    assert!(!read_only_page.contains("Cancel its listener tasks"));
}
