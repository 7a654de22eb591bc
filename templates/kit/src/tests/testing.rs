//! The testing kit (`kit::testing`) against real Postgres (and Valkey for
//! the worker): the database per test and its template, the assertions on
//! dispatched events, the drain and its reports (failures, panics, cycles,
//! payloads that no longer decode, redelivery), one listener or tick, and
//! the real worker through the queue.
#![cfg(all(feature = "testing", feature = "worker"))]

use super::support;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::prelude::*;
use crate::scheduler::{JobContext, ScheduledEvent, ScheduledJob, Tick};
use crate::testing::{Drain, Once, Outcome, TestDatabase};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct OrderPlaced {
    order_id: Uuid,
    quantity: i32,
}
impl Event for OrderPlaced {
    const NAME: &'static str = "orderPlaced";
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct InvoiceDue {
    order_id: Uuid,
}
impl Event for InvoiceDue {
    const NAME: &'static str = "invoiceDue";
}

/// `orderPlaced` as an older version of the service dispatched it: the
/// field `quantity` was called `count`.
#[derive(Debug, Serialize)]
struct OldOrderPlaced {
    order_id: Uuid,
    count: i32,
}
impl Event for OldOrderPlaced {
    const NAME: &'static str = "orderPlaced";
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Ping {
    n: u32,
}
impl Event for Ping {
    const NAME: &'static str = "ping";
}

async fn dispatch_one<E: Event + Serialize + Sync>(db: &TestDatabase, event: &E) {
    db.transactor()
        .run(async |tx| Ok(dispatch(&mut *tx, event).await?))
        .await
        .expect("dispatch");
}

fn placed(quantity: i32) -> OrderPlaced {
    OrderPlaced {
        order_id: Uuid::now_v7(),
        quantity,
    }
}

/// Records the order in `confirmations` once per event and dispatches an
/// `invoiceDue` with it.
async fn confirm(event: OrderPlaced, ctx: ListenerContext) -> Result<(), ListenerError> {
    ctx.once(async |tx| {
        sqlx::query("CREATE TABLE IF NOT EXISTS confirmations (order_id uuid)")
            .execute(&mut *tx)
            .await?;
        sqlx::query("INSERT INTO confirmations VALUES ($1)")
            .bind(event.order_id)
            .execute(&mut *tx)
            .await?;
        dispatch(
            &mut *tx,
            &InvoiceDue {
                order_id: event.order_id,
            },
        )
        .await?;
        Ok(())
    })
    .await?;
    Ok(())
}

async fn invoice(_: InvoiceDue, _: ListenerContext) -> Result<(), ListenerError> {
    Ok(())
}

#[tokio::test]
async fn a_drain_runs_every_listener_and_the_events_they_dispatch() {
    let db = TestDatabase::new().await;
    let order = placed(2);
    dispatch_one(&db, &order).await;
    let listeners = crate::testing::listeners(|l| {
        l.listen("confirm", confirm).listen("invoice", invoice);
    });

    let report = db.drain(&listeners).await;

    report.assert_all_succeeded();
    report.assert_succeeded("orderPlaced", "confirm");
    report.assert_succeeded("invoiceDue", "invoice");
    let confirm = report.of("orderPlaced", "confirm");
    assert_eq!(confirm.len(), 1, "{report}");
    assert_eq!(confirm[0].once, Once::Ran);
    assert_eq!(confirm[0].dispatched.len(), 1);
    assert_eq!(confirm[0].dispatched[0].name, "invoiceDue");
    assert_eq!(report.events().len(), 2);
    // The relay's mark: nothing left to publish, and a second drain runs nothing.
    let unpublished: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_events WHERE published_at IS NULL")
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(unpublished, 0);
    assert!(db.drain(&listeners).await.deliveries().is_empty());
    let outbox = db.dispatched().await;
    outbox.assert_dispatched::<InvoiceDue>(|e| e.order_id == order.order_id);
    assert_eq!(outbox.envelopes().len(), 2);
}

async fn fails(_: OrderPlaced, _: ListenerContext) -> Result<(), ListenerError> {
    Err(ListenerError::from(anyhow::anyhow!(
        "the warehouse is closed"
    )))
}

async fn gives_up(_: OrderPlaced, _: ListenerContext) -> Result<(), ListenerError> {
    Err(ListenerError::from(anyhow::Error::new(
        crate::queue::SkipRetry("no such warehouse".into()),
    )))
}

async fn panics(_: OrderPlaced, _: ListenerContext) -> Result<(), ListenerError> {
    panic!("the listener fell over");
}

async fn hangs(_: OrderPlaced, _: ListenerContext) -> Result<(), ListenerError> {
    std::future::pending::<()>().await;
    Ok(())
}

#[tokio::test]
async fn failures_panics_and_archived_runs_are_reported_once_each_not_retried() {
    let db = TestDatabase::new().await;
    dispatch_one(&db, &placed(1)).await;
    let listeners = crate::testing::listeners(|l| {
        l.listen("fails", fails)
            .listen("gives_up", gives_up)
            .listen("panics", panics)
            .listen("hangs", hangs)
            .listen("confirm", confirm);
    });

    let report = Drain::new(&listeners)
        .timeout(Duration::from_millis(300))
        .run(db.pool())
        .await;

    for listener in ["fails", "gives_up", "panics", "hangs", "confirm"] {
        assert_eq!(report.of("orderPlaced", listener).len(), 1, "{report}");
    }
    let failed = report.assert_failed("orderPlaced", "fails");
    assert_eq!(
        failed.outcome,
        Outcome::Failed("the warehouse is closed".into())
    );
    assert!(matches!(
        &report.assert_failed("orderPlaced", "gives_up").outcome,
        Outcome::Archived(error) if error.contains("no such warehouse")
    ));
    assert_eq!(
        report.assert_failed("orderPlaced", "panics").outcome,
        Outcome::Panicked("the listener fell over".into())
    );
    assert!(matches!(
        report.assert_failed("orderPlaced", "hangs").outcome,
        Outcome::TimedOut(_)
    ));
    // The other listeners ran all the same.
    report.assert_succeeded("orderPlaced", "confirm");
    let text = report.to_string();
    assert!(
        text.contains("listener `fails` of `orderPlaced`")
            && text.contains("failed: the warehouse is closed"),
        "{text}"
    );
    let message = panic_message(|| report.assert_all_succeeded());
    assert!(
        message.contains("listener `fails` of `orderPlaced`"),
        "{message}"
    );
}

/// The message of the panic `assertion` raises.
fn panic_message(assertion: impl FnOnce()) -> String {
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(assertion))
        .expect_err("the assertion should have failed");
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

async fn echo(event: Ping, ctx: ListenerContext) -> Result<(), ListenerError> {
    ctx.once(async |tx| {
        dispatch(&mut *tx, &Ping { n: event.n + 1 }).await?;
        Ok(())
    })
    .await?;
    Ok(())
}

/// Puts itself off for 90 s, as a partner's "429, Retry-After: 90" asks.
async fn snoozes(_: OrderPlaced, _: ListenerContext) -> Result<(), ListenerError> {
    Err(Snooze::after(Duration::from_secs(90)).into())
}

#[tokio::test]
async fn a_snooze_is_reported_as_snoozed_and_a_run_past_its_listeners_timeout_fails() {
    // Arrange: a listener that snoozes, and one with a 1 s timeout that
    // hangs, drained with a bound of its own far above that timeout.
    let db = TestDatabase::new().await;
    dispatch_one(&db, &placed(1)).await;
    let listeners = crate::testing::listeners(|l| {
        l.listen("snoozes", snoozes).listen_with(
            "slow",
            ListenerOptions::new().timeout(Duration::from_secs(1)),
            hangs,
        );
    });
    let before = chrono::Utc::now();
    let started = std::time::Instant::now();

    // Act
    let report = Drain::new(&listeners)
        .timeout(Duration::from_secs(4))
        .run(db.pool())
        .await;
    let took = started.elapsed();

    // Assert: the snooze is its own outcome, with its time; the slow run
    // failed at its listener's timeout, as on the worker.
    let snoozed = report.assert_failed("orderPlaced", "snoozes");
    let Outcome::Snoozed(until) = snoozed.outcome else {
        panic!("not reported as a snooze: {snoozed}");
    };
    let wait = until - before;
    assert!(
        wait >= chrono::TimeDelta::seconds(90) && wait < chrono::TimeDelta::seconds(92),
        "snoozed for {wait}"
    );
    assert!(snoozed.to_string().contains("snoozed until"), "{snoozed}");
    let slow = report.assert_failed("orderPlaced", "slow");
    assert!(
        matches!(&slow.outcome, Outcome::Failed(error) if error.contains("context deadline exceeded")),
        "{slow}"
    );
    assert!(
        took < Duration::from_secs(3),
        "the slow run was stopped after {took:?}, not at its 1 s timeout"
    );
}

#[tokio::test]
async fn a_listener_that_dispatches_its_own_event_forever_stops_at_the_bound_naming_the_cycle() {
    let db = TestDatabase::new().await;
    dispatch_one(&db, &Ping { n: 0 }).await;
    let listeners = crate::testing::listeners(|l| {
        l.listen("echo", echo);
    });

    let err = Drain::new(&listeners)
        .max_generations(5)
        .try_run(db.pool())
        .await
        .expect_err("a cycle is an error");

    let message = format!("{err:#}");
    assert!(
        message.contains("cycle: `ping` → listener `echo` → `ping`")
            && message.contains("past 5 generations"),
        "{message}"
    );
}

#[tokio::test]
async fn an_event_whose_payload_no_longer_decodes_names_the_event_the_listener_and_the_fix() {
    let db = TestDatabase::new().await;
    dispatch_one(
        &db,
        &OldOrderPlaced {
            order_id: Uuid::now_v7(),
            count: 1,
        },
    )
    .await;
    let listeners = crate::testing::listeners(|l| {
        l.listen("confirm", confirm);
    });

    let report = db.drain(&listeners).await;

    let message = panic_message(|| report.assert_succeeded("orderPlaced", "confirm"));
    assert!(
        message.contains("listener `confirm` of `orderPlaced`")
            && message.contains("does not decode into")
            && message.contains("missing field `quantity`")
            && message.contains("serde(alias"),
        "{message}"
    );
    let outbox = db.dispatched().await;
    let message = panic_message(|| {
        outbox.of::<OrderPlaced>();
    });
    assert!(
        message.contains("the outbox holds `orderPlaced`") && message.contains("serde(alias"),
        "{message}"
    );
}

#[tokio::test]
async fn the_dispatched_assertions_name_what_the_outbox_holds() {
    let db = TestDatabase::new().await;
    let outbox = db.dispatched().await;
    let message = panic_message(|| {
        outbox.assert_dispatched::<OrderPlaced>(|_| true);
    });
    assert!(message.contains("the outbox is empty"), "{message}");
    outbox.assert_not_dispatched::<OrderPlaced>(|_| true);

    dispatch_one(&db, &placed(1)).await;
    dispatch_one(&db, &placed(5)).await;
    let outbox = db.dispatched().await;
    assert_eq!(
        outbox
            .assert_all_dispatched::<OrderPlaced>(|e| e.quantity > 0)
            .iter()
            .map(|e| e.quantity)
            .collect::<Vec<_>>(),
        [1, 5],
        "in the order they were dispatched"
    );
    let message = panic_message(|| {
        outbox.assert_all_dispatched::<OrderPlaced>(|e| e.quantity < 5);
    });
    assert!(message.contains("1 of 2 do not"), "{message}");
    let message =
        panic_message(|| outbox.assert_not_dispatched::<OrderPlaced>(|e| e.quantity == 5));
    assert!(
        message.contains("1 matched") && message.contains("\"quantity\":5"),
        "{message}"
    );
    let message = panic_message(|| {
        outbox.assert_all_dispatched::<InvoiceDue>(|_| true);
    });
    assert!(message.contains("there are none"), "{message}");
}

/// Runs outside `ctx.once` on every delivery, like an e-mail sent twice.
static SENT: AtomicUsize = AtomicUsize::new(0);

async fn sends_and_records(event: OrderPlaced, ctx: ListenerContext) -> Result<(), ListenerError> {
    confirm(event, ctx).await?;
    SENT.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

async fn dispatches_outside_once(
    event: OrderPlaced,
    ctx: ListenerContext,
) -> Result<(), ListenerError> {
    dispatch(
        ctx.pool(),
        &InvoiceDue {
            order_id: event.order_id,
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn the_redelivery_check_shows_what_runs_once_and_what_runs_twice() {
    let db = TestDatabase::new().await;
    let order = placed(3);
    dispatch_one(&db, &order).await;
    let listeners = crate::testing::listeners(|l| {
        l.listen("confirm", sends_and_records);
    });

    let report = db.drain_twice(&listeners).await;

    report.assert_idempotent("orderPlaced", "confirm");
    let runs = report.of("orderPlaced", "confirm");
    assert_eq!(
        runs.iter().map(|d| (d.attempt, d.once)).collect::<Vec<_>>(),
        [(1, Once::Ran), (2, Once::Skipped)]
    );
    let confirmed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM confirmations WHERE order_id = $1")
            .bind(order.order_id)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(confirmed, 1, "ctx.once's work happened once");
    assert!(
        SENT.load(Ordering::SeqCst) >= 2,
        "the work outside ran twice"
    );
    // One invoice: the second delivery's dispatch was skipped with its once.
    assert_eq!(db.dispatched().await.of::<InvoiceDue>().len(), 1);

    // A listener whose dispatch is outside `ctx.once` fails the check.
    dispatch_one(&db, &placed(1)).await;
    let careless = crate::testing::listeners(|l| {
        l.listen("careless", dispatches_outside_once);
    });
    let report = db.drain_twice(&careless).await;
    let message = panic_message(|| report.assert_idempotent("orderPlaced", "careless"));
    assert!(
        message.contains("the redelivery dispatched events again"),
        "{message}"
    );
    // And a single drain is no redelivery check.
    dispatch_one(&db, &placed(1)).await;
    let report = db.drain(&listeners).await;
    let message = panic_message(|| report.assert_idempotent("orderPlaced", "confirm"));
    assert!(message.contains("drain_twice"), "{message}");
}

#[tokio::test]
async fn a_listener_runs_alone_with_a_real_context() {
    let db = TestDatabase::new().await;
    let order = placed(4);

    let delivery = crate::testing::run_listener(db.pool(), "confirm", confirm, &order).await;

    delivery.assert_succeeded();
    assert_eq!(delivery.once, Once::Ran);
    assert_eq!(delivery.dispatched.len(), 1);
    let failed = crate::testing::run_listener(db.pool(), "fails", fails, &order).await;
    let message = panic_message(|| failed.assert_succeeded());
    assert!(
        message.contains("listener `fails` of `orderPlaced`"),
        "{message}"
    );

    // Called directly, twice, with one event id: `once` runs the first time.
    let event_id = Uuid::now_v7();
    let ctx = crate::testing::listener_context(db.pool(), "direct", event_id);
    assert_eq!(ctx.event_id(), event_id);
    let first = ctx.once(async |_| Ok(1)).await.unwrap();
    let again = crate::testing::listener_context(db.pool(), "direct", event_id)
        .once(async |_| Ok(2))
        .await
        .unwrap();
    assert_eq!((first, again), (Some(1), None));
}

struct Reminder;
impl ScheduledEvent for Reminder {
    type Event = Ping;
    const NAME: &'static str = "reminder";
    const CRON: &'static str = "@hourly";
    const TIME_ZONE: &'static str = "UTC";
    const CATCH_UP: u32 = 0;
    fn build(&self, tick: &Tick) -> Ping {
        Ping {
            n: tick.at.timestamp() as u32,
        }
    }
}

struct Sweep(Arc<AtomicUsize>);
impl ScheduledJob for Sweep {
    const NAME: &'static str = "sweep";
    const CRON: &'static str = "@daily";
    const TIME_ZONE: &'static str = "UTC";
    const CATCH_UP: u32 = 0;
    async fn run(&self, ctx: JobContext) -> anyhow::Result<()> {
        anyhow::ensure!(ctx.tick.schedule == "sweep", "not my tick");
        anyhow::ensure!(ctx.tick.id == Tick::new("sweep", ctx.tick.at).id);
        self.0.fetch_add(1, Ordering::SeqCst);
        anyhow::ensure!(ctx.tick.at.timestamp() != 0, "the epoch is refused");
        Ok(())
    }
}

#[tokio::test]
async fn a_tick_runs_its_job_or_dispatches_its_event_once() {
    let db = TestDatabase::new().await;
    let at = "2026-12-04T02:00:00Z".parse().unwrap();

    assert!(
        crate::testing::dispatch_tick(db.pool(), Reminder, at)
            .await
            .unwrap()
    );
    assert!(
        !crate::testing::dispatch_tick(db.pool(), Reminder, at)
            .await
            .unwrap()
    );
    let outbox = db.dispatched().await;
    outbox.assert_dispatched::<Ping>(|ping| i64::from(ping.n) == at.timestamp());
    assert_eq!(outbox.envelopes()[0].id, Tick::new("reminder", at).id);

    let runs = Arc::new(AtomicUsize::new(0));
    crate::testing::run_job(db.pool(), Sweep(runs.clone()), at)
        .await
        .unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let err = crate::testing::run_job(db.pool(), Sweep(runs), chrono::DateTime::UNIX_EPOCH)
        .await
        .expect_err("the job fails");
    assert!(
        format!("{err:#}").contains("the job `sweep` failed")
            && format!("{err:#}").contains("the epoch is refused"),
        "{err:#}"
    );
}

/// With `KIT_TESTING_CHILD=<dir>`, this test is one of several processes
/// creating databases from the migrations in `<dir>` at once.
#[tokio::test]
async fn child_process_creates_a_database() {
    let Some(dir) = std::env::var_os("KIT_TESTING_CHILD") else {
        return;
    };
    let db = TestDatabase::with_migrations(dir).await;
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM widgets")
        .fetch_one(db.pool())
        .await
        .unwrap();
    println!("widgets: {n}");
    let (marked,): (bool,) = sqlx::query_as(&format!(
        "SELECT to_regclass('{TEMPLATE_MARKER}') IS NOT NULL"
    ))
    .fetch_one(db.pool())
    .await
    .unwrap();
    println!("template marker: {marked}");
}

/// A table the test adds to a built template, and so only a database
/// copied from it has: no migration makes it.
const TEMPLATE_MARKER: &str = "made_from_the_template";

/// Runs `child_process_creates_a_database` in a process of its own.
fn child(dir: &std::path::Path, env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "tests::testing::child_process_creates_a_database",
            "--exact",
            "--nocapture",
        ])
        .env("KIT_TESTING_CHILD", dir);
    for (name, value) in env {
        command.env(name, value);
    }
    command
}

fn migrations(dir: &std::path::Path, rows: u32) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join("00001_widgets.sql"),
        format!(
            "-- {}\n-- +goose Up\nCREATE TABLE widgets (id int);\n\
             INSERT INTO widgets SELECT generate_series(1, {rows});\n\
             -- +goose Down\nDROP TABLE widgets;\n",
            // A set of migrations of this run's own, so its template is new.
            dir.display()
        ),
    )
    .unwrap();
}

#[test]
fn processes_at_once_share_one_template_and_a_changed_migration_makes_a_new_one() {
    let dir = std::env::temp_dir().join(format!("kit-testing-{}", Uuid::now_v7().simple()));
    migrations(&dir, 3);
    let initial = templates();
    let children: Vec<_> = (0..4)
        .map(|_| {
            child(&dir, &[])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for output in children {
        let output = output.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.contains("widgets: 3"),
            "{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let before = templates();
    assert_eq!(
        before.len(),
        initial.len() + 1,
        "four processes, one template: {initial:?} then {before:?}"
    );
    // A database of the test is a copy of that template, not one migrated
    // on its own: a table added to the template only is in the next one.
    let template = before
        .iter()
        .find(|name| !initial.contains(name))
        .unwrap()
        .clone();
    let mut url = url::Url::parse(&std::env::var("DATABASE_URL").unwrap()).unwrap();
    url.set_path(&template);
    on_server(async |_| {
        let marking = sqlx::PgPool::connect(url.as_str()).await.unwrap();
        sqlx::query(&format!("CREATE TABLE {TEMPLATE_MARKER} ()"))
            .execute(&marking)
            .await
            .unwrap();
        // A template is copied only while no one is connected to it.
        marking.close().await;
    });
    let output = child(&dir, &[]).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("widgets: 3") && stdout.contains("template marker: true"),
        "the test database is not a copy of `{template}`: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );

    migrations(&dir, 7);
    let output = child(&dir, &[]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("widgets: 7"),
        "a changed migration is never a stale schema: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let after = templates();
    assert_eq!(after.len(), before.len() + 1, "{before:?} then {after:?}");
    std::fs::remove_dir_all(&dir).unwrap();
    // This run's templates are of no use to the next.
    on_server(async |pool| {
        for name in after.iter().filter(|name| !initial.contains(name)) {
            let _ = sqlx::query(&format!(r#"ALTER DATABASE "{name}" IS_TEMPLATE false"#))
                .execute(pool)
                .await;
            let _ = sqlx::query(&format!(r#"DROP DATABASE "{name}""#))
                .execute(pool)
                .await;
        }
    });
}

/// The names of the template databases on the server.
fn templates() -> Vec<String> {
    on_server(async |pool| {
        // The default migrations' template, which the tests running
        // meanwhile may build, is there from the start.
        drop(TestDatabase::new().await);
        sqlx::query_scalar(
            "SELECT datname FROM pg_database WHERE datistemplate AND datname LIKE '%\\_tpl\\_%'",
        )
        .fetch_all(pool)
        .await
        .unwrap()
    })
}

/// Runs `work` on a pool of `DATABASE_URL`, in a runtime of its own.
fn on_server<T>(work: impl AsyncFnOnce(&sqlx::PgPool) -> T) -> T {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let url = std::env::var("DATABASE_URL").unwrap();
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        let value = work(&pool).await;
        pool.close().await;
        value
    })
}

#[test]
fn without_a_server_the_test_fails_with_one_message_naming_both_variables() {
    let dir = std::env::temp_dir().join(format!("kit-testing-{}", Uuid::now_v7().simple()));
    migrations(&dir, 1);
    let output = child(&dir, &[])
        .env_remove("DATABASE_URL")
        .env_remove("TEST_DATABASE_URL")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("neither TEST_DATABASE_URL nor DATABASE_URL is set")
            && stderr.contains("gpkit dev --print-env"),
        "{stderr}"
    );

    // Nothing listens on port 1: refused at once, named, with the fix.
    let output = child(
        &dir,
        &[(
            "TEST_DATABASE_URL",
            "postgres://postgres:secret@127.0.0.1:1/x",
        )],
    )
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("cannot reach the test Postgres server at")
            && stderr.contains("(TEST_DATABASE_URL)")
            && !stderr.contains("secret"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn the_real_worker_delivers_through_the_queue_and_names_what_is_pending() {
    let db = TestDatabase::new().await;
    let queue = support::TestQueue::new().await;
    let worker_config = || {
        let mut config = db.config();
        config.valkey.addr =
            Some(std::env::var("VALKEY_ADDR").unwrap_or_else(|_| "127.0.0.1:6379".into()));
        config.worker.queues = format!("{}=1", queue.name).parse().unwrap();
        config.outbox.queues = queue.name.parse().unwrap();
        config.outbox.poll_interval = Duration::from_millis(100);
        config
    };
    let order = placed(2);
    dispatch_one(&db, &order).await;
    let listeners = crate::testing::listeners(|l| {
        l.listen("confirm", confirm).listen("invoice", invoice);
    });

    let worker =
        crate::testing::TestWorker::start(worker_config(), listeners, Default::default()).await;
    worker
        .wait_until_delivered(Duration::from_secs(30))
        .await
        .unwrap();
    let confirmed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM confirmations WHERE order_id = $1")
            .bind(order.order_id)
            .fetch_one(db.pool())
            .await
            .unwrap();
    assert_eq!(confirmed, 1);
    worker.stop().await.unwrap();

    // A listener that keeps failing: the timeout names it and its state.
    dispatch_one(&db, &placed(1)).await;
    let failing = crate::testing::listeners(|l| {
        l.listen("fails", fails);
    });
    let worker =
        crate::testing::TestWorker::start(worker_config(), failing, Default::default()).await;
    let err = worker
        .wait_until_delivered(Duration::from_secs(2))
        .await
        .expect_err("still pending");
    let message = format!("{err:#}");
    assert!(
        message.contains("listener `fails` of `orderPlaced`"),
        "{message}"
    );
    worker.stop().await.unwrap();
}

/// The table the comparison's listeners record what they saw in.
const SAW: &str = "CREATE TABLE saw (listener text NOT NULL, event_name text NOT NULL, \
     event_id uuid NOT NULL, payload jsonb NOT NULL, header_names text NOT NULL, \
     header_trace text, metadata_trace text)";

/// Records in `saw` what `ctx`'s listener saw of the event named `name`
/// with `payload`: its id, its task's headers (their names, and the trace
/// id of `traceparent`) and the trace id of its metadata.
async fn record_saw(
    ctx: &ListenerContext,
    tx: &mut sqlx::PgConnection,
    name: &str,
    payload: serde_json::Value,
) -> Result<(), ListenerError> {
    let headers = ctx.headers();
    let header_trace = headers
        .get("traceparent")
        .and_then(|traceparent| traceparent.split('-').nth(1))
        .map(str::to_string);
    let metadata_trace = crate::trace_context::TraceContext::from_metadata(ctx.metadata())
        .map(|context| context.trace_id().to_string());
    sqlx::query("INSERT INTO saw VALUES ($1, $2, $3, $4, $5, $6, $7)")
        .bind(ctx.listener())
        .bind(name)
        .bind(ctx.event_id())
        .bind(payload)
        .bind(headers.keys().cloned().collect::<Vec<_>>().join(","))
        .bind(header_trace)
        .bind(metadata_trace)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// Records the order and dispatches its `invoiceDue`, once per event.
async fn saw_and_invoices(event: OrderPlaced, ctx: ListenerContext) -> Result<(), ListenerError> {
    ctx.once(async |tx| {
        record_saw(&ctx, tx, OrderPlaced::NAME, serde_json::to_value(&event)?).await?;
        let invoice = InvoiceDue {
            order_id: event.order_id,
        };
        dispatch(&mut *tx, &invoice).await?;
        Ok(())
    })
    .await?;
    Ok(())
}

async fn saw_order(event: OrderPlaced, ctx: ListenerContext) -> Result<(), ListenerError> {
    ctx.once(async |tx| {
        record_saw(&ctx, tx, OrderPlaced::NAME, serde_json::to_value(&event)?).await
    })
    .await?;
    Ok(())
}

async fn saw_invoice(event: InvoiceDue, ctx: ListenerContext) -> Result<(), ListenerError> {
    ctx.once(async |tx| {
        record_saw(&ctx, tx, InvoiceDue::NAME, serde_json::to_value(&event)?).await
    })
    .await?;
    Ok(())
}

/// One row of `saw`, with whether the outbox holds the event the listener
/// was given (its id, name and payload).
type Saw = (
    String,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    bool,
);

/// What the listeners recorded in `pool`, in one order, each trace id
/// other than `trace` read as "a new trace" (a run's own, random).
async fn what_the_listeners_saw(pool: &sqlx::PgPool, trace: &str) -> Vec<Saw> {
    let ours = |id: Option<String>| {
        id.map(|id| {
            if id == trace {
                id
            } else {
                "a new trace".into()
            }
        })
    };
    let rows: Vec<Saw> = sqlx::query_as(
        "SELECT s.listener, s.event_name, s.payload::text, s.header_names, s.header_trace, \
           s.metadata_trace, EXISTS (SELECT 1 FROM outbox_events o WHERE o.event_id = s.event_id \
             AND o.event_name = s.event_name AND o.payload = s.payload) \
         FROM saw s ORDER BY 1, 2, 3",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    rows.into_iter()
        .map(
            |(listener, name, payload, headers, header_trace, metadata_trace, held)| {
                assert_eq!(
                    header_trace, metadata_trace,
                    "a task's headers carry its event's trace"
                );
                (
                    listener,
                    name,
                    payload,
                    headers,
                    ours(header_trace),
                    ours(metadata_trace),
                    held,
                )
            },
        )
        .collect()
}

/// Dispatches `orders` on `db`, the first two inside the trace `trace`, as
/// a traced request would; makes the listeners' table.
async fn dispatch_orders(db: &TestDatabase, orders: &[OrderPlaced], trace: &str) {
    sqlx::query(SAW).execute(db.pool()).await.unwrap();
    let context =
        crate::trace_context::TraceContext::parse(&format!("00-{trace}-00f067aa0ba902b7-01"), None)
            .unwrap();
    crate::trace_context::scope(context, async {
        for order in &orders[..2] {
            dispatch_one(db, order).await;
        }
    })
    .await;
    for order in &orders[2..] {
        dispatch_one(db, order).await;
    }
}

/// The listeners of the comparison: two of `orderPlaced` (one dispatching
/// `invoiceDue`), one of `invoiceDue`.
fn saw_listeners() -> Listeners {
    crate::testing::listeners(|l| {
        l.listen("invoices", saw_and_invoices)
            .listen("audit", saw_order)
            .listen("invoice", saw_invoice);
    })
}

#[tokio::test]
async fn the_drain_gives_listeners_what_the_real_worker_gives_them() {
    // Arrange: the same three orders (two of them traced) in two databases.
    let orders = [placed(1), placed(2), placed(3)];
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let (drained, worked) = (TestDatabase::new().await, TestDatabase::new().await);
    dispatch_orders(&drained, &orders, trace).await;
    dispatch_orders(&worked, &orders, trace).await;
    let queue = support::TestQueue::new().await;
    let mut config = worked.config();
    config.valkey.addr = Some(support::valkey_addr());
    config.worker.queues = format!("{}=1", queue.name).parse().unwrap();
    config.outbox.queues = queue.name.parse().unwrap();
    config.outbox.poll_interval = Duration::from_millis(100);

    // Act: one through the drain, the other through the worker and queue.
    drained.drain(&saw_listeners()).await.assert_all_succeeded();
    let worker =
        crate::testing::TestWorker::start(config, saw_listeners(), Default::default()).await;
    worker
        .wait_until_delivered(Duration::from_secs(30))
        .await
        .unwrap();
    worker.stop().await.unwrap();

    // Assert: each listener saw the same events, payloads, headers and
    // trace, the events the outbox holds, once each.
    let (by_drain, by_worker) = (
        what_the_listeners_saw(drained.pool(), trace).await,
        what_the_listeners_saw(worked.pool(), trace).await,
    );
    assert_eq!(by_drain, by_worker, "the drain, then the worker");
    assert_eq!(
        by_drain.len(),
        9,
        "three listeners, three orders: {by_drain:#?}"
    );
    assert!(by_drain.iter().all(|saw| saw.6), "{by_drain:#?}");
    let traced = by_drain
        .iter()
        .filter(|saw| saw.4.as_deref() == Some(trace) && saw.5.as_deref() == Some(trace))
        .count();
    assert_eq!(
        traced, 6,
        "the traced orders and their invoices: {by_drain:#?}"
    );
    let untraced_invoice = by_drain
        .iter()
        .find(|saw| saw.1 == InvoiceDue::NAME && saw.4.as_deref() != Some(trace))
        .unwrap();
    assert_eq!(
        untraced_invoice.4.as_deref(),
        Some("a new trace"),
        "an untraced event's listener runs in a trace of its own"
    );
}

#[cfg(feature = "seaorm")]
mod seaorm {
    use super::*;
    use crate::prelude::OrmListenerContext;
    use sea_orm::{ConnectionTrait, Statement};

    async fn confirm_orm(event: OrderPlaced, ctx: OrmListenerContext) -> Result<(), ListenerError> {
        ctx.once(async |tx| {
            tx.execute(Statement::from_string(
                tx.get_database_backend(),
                "CREATE TABLE IF NOT EXISTS orm_confirmations (order_id uuid)",
            ))
            .await?;
            tx.execute(Statement::from_sql_and_values(
                tx.get_database_backend(),
                "INSERT INTO orm_confirmations VALUES ($1)",
                [event.order_id.into()],
            ))
            .await?;
            Ok(())
        })
        .await?;
        Ok(())
    }

    #[tokio::test]
    async fn a_seaorm_listener_drains_like_any_other() {
        let db = TestDatabase::new().await;
        dispatch_one(&db, &placed(2)).await;
        let listeners = crate::testing::listeners(|l| {
            l.listen("confirm", confirm_orm);
        });

        let report = db.drain_twice(&listeners).await;

        report.assert_idempotent("orderPlaced", "confirm");
        let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM orm_confirmations")
            .fetch_one(db.pool())
            .await
            .unwrap();
        assert_eq!(n, 1);
    }
}
