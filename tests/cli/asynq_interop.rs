//! The generated worker and the real Go asynq v0.26.0 on one Valkey queue.
//!
//! This module owns the proof of the worker's headline promise, that it
//! shares the `default` queue with Go services: each test runs the
//! generated `worker` binary of one project (`shop`, with the event
//! `orderPlaced` and the listeners `audit` and `email`) next to the Go peer
//! `asynqpeer` (tests/interop/go/cmd/asynqpeer: an asynq.Server, Client and
//! Inspector as gp-system's Go kit uses them), against real Postgres and a
//! Redis or Valkey server of the test's own:
//!
//! - the Rust relay's event tasks, as a Go asynq server sees them;
//! - Go-kit events from a Go asynq client, as the Rust listeners see them;
//! - a unique Go task (asynq.Unique) whose lock the Rust worker releases,
//!   and one scheduled for later (asynq.ProcessIn);
//! - a failing Rust listener, as Go's Inspector sees it, next to a Go task
//!   failing the same way, and Inspector.RunTask bringing it back;
//! - a task leased by a killed side, recovered by the other side;
//! - the running Rust worker listed by Inspector.Servers() as a Go server
//!   is, and Inspector.CancelProcessing cancelling its running task as it
//!   does a Go server's;
//! - 20,000 tasks shared by a Go server and three Rust workers, each run
//!   exactly once, every process running its share;
//! - 10,000 tasks shared by a Go server and a Rust worker, each run once
//!   also when one side is stopped with SIGTERM midway, and each completed
//!   when the Rust worker is killed midway, only the tasks it held possibly
//!   twice.
//!
//! None is ignored. Each test skips where Go is missing, under the rule of
//! [`crate::support::require_tool`] (a failure under CI), see [`go_peer`].

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::e2e::{Database, build_binaries, migrate, psql};
use crate::go_peers::go_peer;
use crate::support::gpkit;
use crate::worker_e2e::{RedisServer, Worker, wait_until};

/// The trace the tests' events are dispatched in.
pub(crate) const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
pub(crate) const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TRACESTATE: &str = "gpkit=interop";
/// The trace of a Go producer's tracing middleware, in a task's headers.
const HEADER_TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";
const HEADER_TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
/// The task type of the `audit` listener's work, in the Go kit's naming.
const AUDIT_TASK: &str = "listener:orderPlaced:audit";

// --- the generated project -------------------------------------------------

/// What both listeners of the test project do, steered by the event's note
/// and the `refused_orders` table, so that tests can make them slow or fail.
fn listener_body(listener: &str) -> String {
    format!(
        r#"//! `{listener}`: a listener of `orderPlaced`, filled in by the asynq interop tests.

use std::time::Duration;

use crate::events::order_placed::OrderPlaced;
use kit::worker::listeners::{{ListenerContext, ListenerError}};

/// Records each run in `listener_runs`, with the trace it ran in and the id
/// of the worker process that ran it. A note `sleep:<ms>` first records `start` and sleeps that
/// long; an order in `refused_orders` fails with "order <id> refused"
/// (recorded as `failed`), and a note `fail-once:{listener}` makes this
/// listener fail its first run; else the run is `done`.
pub async fn handle(event: OrderPlaced, ctx: ListenerContext) -> Result<(), ListenerError> {{
    if let Some(ms) = event.note.strip_prefix("sleep:") {{
        record(&event, &ctx, "start").await?;
        tokio::time::sleep(Duration::from_millis(ms.parse()?)).await;
    }}
    if event.note == "fail-once:{listener}" {{
        let failed: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM listener_runs WHERE listener = $1 AND event_id = $2)",
        )
        .bind("{listener}")
        .bind(ctx.event_id())
        .fetch_one(ctx.pool())
        .await?;
        if !failed {{
            record(&event, &ctx, "failed").await?;
            anyhow::bail!("failing once, as the note asks");
        }}
    }}
    let refused: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM refused_orders WHERE order_id = $1)")
            .bind(event.order_id)
            .fetch_one(ctx.pool())
            .await?;
    if refused {{
        record(&event, &ctx, "failed").await?;
        anyhow::bail!("order {{}} refused", event.order_id);
    }}
    record(&event, &ctx, "done").await
}}

async fn record(event: &OrderPlaced, ctx: &ListenerContext, outcome: &str) -> Result<(), ListenerError> {{
    sqlx::query(
        "INSERT INTO listener_runs (listener, event_id, order_id, note, traceparent, running_in, outcome, pid) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind("{listener}")
    .bind(ctx.event_id())
    .bind(event.order_id)
    .bind(&event.note)
    .bind(ctx.metadata().get("traceparent"))
    .bind(kit::trace_context::current().map(|context| context.trace_id().to_string()))
    .bind(outcome)
    .bind(i64::from(std::process::id()))
    .execute(ctx.pool())
    .await?;
    Ok(())
}}
"#
    )
}

/// The tables the listeners write and read.
const LISTENER_TABLES: &str = "-- +goose Up
CREATE TABLE listener_runs (
    listener text NOT NULL, event_id uuid NOT NULL, order_id bigint NOT NULL, note text NOT NULL,
    traceparent text, running_in text, outcome text NOT NULL, pid bigint NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE refused_orders (order_id bigint PRIMARY KEY);

-- +goose Down
DROP TABLE refused_orders;
DROP TABLE listener_runs;
";

/// Dispatches `orderPlaced` events through the generated outbox, as a
/// request handler in a traced request would.
const DISPATCH: &str = r#"//! Dispatches `<count>` `orderPlaced` events in one committed transaction,
//! in the trace of `TRACEPARENT`/`TRACESTATE`; prints each envelope as JSON.

use kit::Transactor;
use kit::trace_context::{self, TraceContext};
use shop::events::order_placed::OrderPlaced;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let count: i64 = std::env::args().nth(1).unwrap_or_default().parse()?;
    let traceparent = std::env::var("TRACEPARENT")?;
    let tracestate = std::env::var("TRACESTATE").ok();
    let trace = TraceContext::parse(&traceparent, tracestate.as_deref())
        .ok_or_else(|| anyhow::anyhow!("bad TRACEPARENT"))?;
    let pool = sqlx::PgPool::connect(&std::env::var("DATABASE_URL")?).await?;
    let transactor = Transactor::new(pool);
    let dispatch_all = transactor.run(async |tx| {
        let mut envelopes = Vec::new();
        for order_id in 1..=count {
            let event = OrderPlaced { order_id, note: format!("order {order_id}") };
            envelopes.push(kit::dispatch(&mut *tx, &event).await?);
        }
        Ok::<_, anyhow::Error>(envelopes)
    });
    for envelope in trace_context::scope(trace, dispatch_all).await? {
        println!("{}", serde_json::to_string(&envelope)?);
    }
    Ok(())
}
"#;

/// `POST /orders` in the test project's server: dispatches the posted
/// `orderPlaced` in the request's transaction (valkey_infra's project has
/// it too).
pub(crate) const ORDERS_ROUTE: &str = r#"//! `POST /orders`: dispatches the posted `orderPlaced`, filled in by the tests.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;

use crate::events::order_placed::OrderPlaced;
use crate::startup::AppState;

/// Stores the event in the outbox, in a transaction of its own: 202.
pub async fn place(State(state): State<AppState>, Json(event): Json<OrderPlaced>) -> StatusCode {
    let stored = state
        .transactor
        .run(async |tx| {
            kit::dispatch(&mut *tx, &event).await?;
            Ok(())
        })
        .await;
    match stored {
        Ok(()) => StatusCode::ACCEPTED,
        Err(err) => {
            tracing::error!(error = %err, "the event was not stored");
            StatusCode::INTERNAL_SERVER_ERROR
        }
    }
}
"#;

/// The test project's routes: the generated ones and `POST /orders`.
pub(crate) const ROUTES: &str = r#"//! The HTTP routes.

mod orders;

use axum::Router;
use axum::routing::post;
use kit::{health, http_metrics, trace_context};

use crate::startup::AppState;

/// All routes of the service, timed for `GET /metrics`.
pub fn router(state: AppState) -> Router {
    Router::new()
        .merge(health::routes(state.pool.clone()))
        .merge(http_metrics::routes())
        .route("/orders", post(orders::place))
        .layer(axum::middleware::from_fn(http_metrics::track))
        .layer(axum::middleware::from_fn(trace_context::propagate))
        .with_state(state)
}
"#;

/// The test project, generated and built once per test run under
/// `target/e2e-asynq/shop`, its binaries copied to `.bin/`.
pub(crate) fn project() -> &'static Path {
    static PROJECT: OnceLock<PathBuf> = OnceLock::new();
    PROJECT.get_or_init(|| {
        let project = crate::e2e::new_shop_in("e2e-asynq", &[]);
        gpkit(&project)
            .args(["add", "event", "orderPlaced"])
            .args(["--field", "order_id:i64", "--field", "note:string"])
            .args(["--listener", "audit", "--listener", "email"])
            .assert()
            .success();
        let write = |path: &str, text: &str| std::fs::write(project.join(path), text).unwrap();
        write(
            "migrations/20270101000000_listener_runs.sql",
            LISTENER_TABLES,
        );
        for listener in ["audit", "email"] {
            write(
                &format!("src/listeners/order_placed/{listener}.rs"),
                &listener_body(listener),
            );
        }
        write("src/bin/asynq_dispatch.rs", DISPATCH);
        write("src/routes/orders.rs", ORDERS_ROUTE);
        write("src/routes/mod.rs", ROUTES);
        // The dispatch program prints envelopes as JSON.
        crate::support::add_dependencies(&project, &["serde_json = \"1\""]);
        build_binaries(&project);
        project
    })
}

/// A fresh database, migrated.
pub(crate) fn database() -> Database {
    let db = Database::create("gpkit_asynq");
    migrate(project(), &db, &["up"]);
    db
}

/// Starts the project's worker with `env` and waits until its consumer runs.
pub(crate) fn start_worker(db: &Database, redis: &RedisServer, env: &[(&str, &str)]) -> Worker {
    let worker = Worker::start_binary(&project().join(".bin/worker"), db, redis, env);
    wait_until(Duration::from_secs(30), "the Rust worker consumes", || {
        worker.log().contains("consumer started")
    });
    worker
}

/// Stops `worker` with SIGTERM and asserts a clean exit within `limit`.
pub(crate) fn stop_worker(worker: &mut Worker, limit: Duration) {
    worker.signal("-TERM");
    let code = worker.wait(limit);
    assert_eq!(code, Some(0), "the Rust worker's exit:\n{}", worker.log());
}

/// Dispatches `count` events through the outbox; their envelopes.
fn dispatch(db: &Database, count: u32) -> Vec<Value> {
    let output = Command::new(project().join(".bin/asynq_dispatch"))
        .arg(count.to_string())
        .env("DATABASE_URL", db.url())
        .env("TRACEPARENT", TRACEPARENT)
        .env("TRACESTATE", TRACESTATE)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    json_lines(&String::from_utf8(output.stdout).unwrap())
}

/// The ids of the `listener_runs` rows of `listener` with `outcome`, one
/// per row (so a listener that ran twice gives its id twice).
pub(crate) fn listener_runs(db: &Database, listener: &str, outcome: &str) -> Vec<String> {
    let sql = format!(
        "SELECT event_id FROM listener_runs WHERE listener = '{listener}' AND outcome = '{outcome}'"
    );
    psql(&db.url(), &sql).lines().map(str::to_string).collect()
}

/// How many runs of the `audit` listener ended with `outcome`.
fn count_runs(db: &Database, outcome: &str) -> usize {
    let sql = format!(
        "SELECT count(*) FROM listener_runs WHERE listener = 'audit' AND outcome = '{outcome}'"
    );
    psql(&db.url(), &sql).parse().unwrap()
}

/// The slow tasks the `audit` listener of the worker process `pid` has
/// started and not finished.
fn audit_in_flight(db: &Database, pid: u32) -> BTreeSet<String> {
    let sql = format!(
        "SELECT event_id FROM listener_runs s \
         WHERE listener = 'audit' AND outcome = 'start' AND pid = {pid} \
         AND NOT EXISTS (SELECT 1 FROM listener_runs d \
         WHERE d.event_id = s.event_id AND d.listener = 'audit' AND d.outcome = 'done')"
    );
    psql(&db.url(), &sql).lines().map(str::to_string).collect()
}

/// The completed runs of the `audit` listener, one per run: the id of the
/// worker process that ran it, and the task id.
fn audit_runs_by_pid(db: &Database) -> Vec<(u32, String)> {
    let sql =
        "SELECT pid, event_id FROM listener_runs WHERE listener = 'audit' AND outcome = 'done'";
    psql(&db.url(), sql)
        .lines()
        .map(|line| {
            let (pid, id) = line.split_once('|').unwrap_or_else(|| panic!("{line}"));
            (pid.parse().unwrap(), id.to_string())
        })
        .collect()
}

// --- the Go peer -------------------------------------------------------------

/// The complete JSON lines of `text` (a line still being written is skipped).
pub(crate) fn json_lines(text: &str) -> Vec<Value> {
    text.split_inclusive('\n')
        .filter(|line| line.ends_with('\n') && !line.trim().is_empty())
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

/// Runs `asynqpeer <args>` to completion against `redis`, with `stdin`;
/// its JSON lines.
pub(crate) fn go(peer: &Path, redis: &RedisServer, args: &[&str], stdin: &str) -> Vec<Value> {
    let mut child = Command::new(peer)
        .args(args)
        .env("VALKEY_ADDR", redis.addr())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let stdin = stdin.to_string();
    let feeder = std::thread::spawn(move || input.write_all(stdin.as_bytes()));
    let output = child.wait_with_output().unwrap();
    feeder.join().unwrap().unwrap();
    assert!(
        output.status.success(),
        "asynqpeer {args:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    json_lines(&String::from_utf8(output.stdout).unwrap())
}

/// Enqueues one Go-kit envelope per item of `lines` (`{"id"?, "payload",
/// "metadata"?}`) with the Go client and `options` (`-type`, `-queue`,
/// `-max-retry`, `-retention`, ...); one `{"id", "result", "envelope"}` each.
fn go_enqueue(peer: &Path, redis: &RedisServer, options: &[&str], lines: &[Value]) -> Vec<Value> {
    let stdin: String = lines.iter().map(|line| format!("{line}\n")).collect();
    let args: Vec<&str> = ["enqueue"]
        .into_iter()
        .chain(options.iter().copied())
        .collect();
    go(peer, redis, &args, &stdin)
}

/// Inspector.GetTaskInfo of one task.
fn go_info(peer: &Path, redis: &RedisServer, queue: &str, id: &str) -> Value {
    go(peer, redis, &["info", queue, id], "").remove(0)
}

/// Inspector.GetQueueInfo's counts of `queue`.
fn go_queue(peer: &Path, redis: &RedisServer, queue: &str) -> Value {
    go(peer, redis, &["queue", queue], "").remove(0)
}

/// Waits until Inspector.GetTaskInfo shows the task in `state`; its info.
pub(crate) fn wait_for_state(
    peer: &Path,
    redis: &RedisServer,
    queue: &str,
    id: &str,
    state: &str,
) -> Value {
    let mut info = Value::Null;
    wait_until(Duration::from_secs(60), &format!("{id} is {state}"), || {
        info = go_info(peer, redis, queue, id);
        info["state"] == state
    });
    info
}

/// Waits at most `limit` until `queue` has `completed` completed tasks and
/// nothing else; the queue's counts (Inspector.GetQueueInfo).
fn wait_until_all_completed(
    peer: &Path,
    redis: &RedisServer,
    queue: &str,
    completed: u64,
    limit: Duration,
) -> Value {
    let mut counts = Value::Null;
    let all_done = || {
        counts = go_queue(peer, redis, queue);
        counts["completed"] == completed
    };
    wait_until(limit, &format!("{completed} tasks are completed"), all_done);
    for state in ["pending", "active", "scheduled", "retry", "archived"] {
        assert_eq!(counts[state], 0, "{state} tasks left: {counts}");
    }
    counts
}

/// Asserts the processed and failed counters Go reads for `queue`, all-time
/// and today's (UTC: the daily keys are named by date; `since` is when the
/// test began, and today's are checked only if the date has not changed).
fn assert_counters(counts: &Value, since: time::Date, processed: usize, failed: usize) {
    assert_eq!(
        (&counts["processed_total"], &counts["failed_total"]),
        (&json!(processed), &json!(failed)),
        "{counts}"
    );
    if time::OffsetDateTime::now_utc().date() == since {
        assert_eq!(
            (&counts["processed"], &counts["failed"]),
            (&json!(processed), &json!(failed)),
            "today's counters: {counts}"
        );
    }
}

/// `asynqpeer serve` as a process: a Go asynq server whose JSON lines
/// (`ready`, `start`, `done`, `failed`, `stopped`) go to a file.
struct GoServer {
    child: Child,
    out: PathBuf,
    /// The lines read so far, by kind, and how many bytes of `out` they
    /// took, so that each look reads only what is new.
    read: RefCell<(u64, BTreeMap<String, Vec<Value>>)>,
    _dir: tempfile::TempDir,
}

impl GoServer {
    /// Starts it with `args` (`-queues`, `-handle`, `-fail`, ...) and waits
    /// until it serves.
    fn start(peer: &Path, redis: &RedisServer, args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("serve.jsonl");
        let child = Command::new(peer)
            .arg("serve")
            .args(args)
            .env("VALKEY_ADDR", redis.addr())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let server = Self {
            child,
            out,
            read: RefCell::default(),
            _dir: dir,
        };
        wait_until(Duration::from_secs(30), "the Go server serves", || {
            !server.lines("ready").is_empty()
        });
        server
    }

    /// Its lines of one kind (`"event": kind`).
    fn lines(&self, kind: &str) -> Vec<Value> {
        self.read_new_lines();
        self.read.borrow().1.get(kind).cloned().unwrap_or_default()
    }

    /// The task ids of its lines of one kind, one per line.
    fn ids(&self, kind: &str) -> Vec<String> {
        self.read_new_lines();
        let read = self.read.borrow();
        let lines = read.1.get(kind).map(Vec::as_slice).unwrap_or_default();
        lines
            .iter()
            .map(|line| str_of(&line["id"]).to_string())
            .collect()
    }

    /// Reads the lines written since the last look.
    fn read_new_lines(&self) {
        let mut read = self.read.borrow_mut();
        let mut file = std::fs::File::open(&self.out).unwrap();
        file.seek(SeekFrom::Start(read.0)).unwrap();
        let mut text = String::new();
        file.read_to_string(&mut text).unwrap();
        let complete = text.rfind('\n').map_or(0, |end| end + 1);
        for line in json_lines(&text[..complete]) {
            let kind = str_of(&line["event"]).to_string();
            read.1.entry(kind).or_default().push(line);
        }
        read.0 += complete as u64;
    }

    /// Kills it with SIGKILL: no shutdown, its tasks stay leased.
    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Sends SIGTERM and asserts a clean shutdown within `limit`.
    fn stop(&mut self, limit: Duration) {
        let pid = self.child.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                start.elapsed() < limit,
                "the Go server did not stop within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "the Go server's exit: {status}");
        assert_eq!(self.lines("stopped").len(), 1);
    }
}

impl Drop for GoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `valkey-server` that `scripts/test` installs.
fn valkey() -> RedisServer {
    let binary = std::env::var("VALKEY_SERVER")
        .expect("set VALKEY_SERVER to a valkey-server binary (scripts/test installs one)");
    RedisServer::start_binary(&binary)
}

/// RFC 3339 text as an instant, so that Rust's and Go's spellings compare.
fn instant(text: &Value) -> time::OffsetDateTime {
    let text = text
        .as_str()
        .unwrap_or_else(|| panic!("not a time: {text}"));
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).unwrap()
}

/// The string `value` holds; panics on any other JSON.
fn str_of(value: &Value) -> &str {
    value
        .as_str()
        .unwrap_or_else(|| panic!("not a string: {value}"))
}

// --- the tests -------------------------------------------------------------

/// Events dispatched through the generated outbox, relayed by the Rust
/// worker to Valkey, are consumed by a Go asynq server with a ServeMux
/// handler for `event:`: asynq.GetTaskID is the envelope id, the payload
/// decodes strictly into the Go kit's envelope with everything the Rust side
/// wrote, and the Inspector shows the task completed with the relay's
/// options (retention OUTBOX_TASK_RETENTION, max retry 25, timeout 30 min).
#[test]
#[ignore = "builds a generated project"]
fn relayed_events_reach_a_go_asynq_server_as_go_kit_envelopes_on_valkey() {
    let Some(peer) = go_peer("asynqpeer") else {
        return;
    };
    project();
    let valkey = valkey();
    let db = database();
    // `listener:` for the cancel at the end, which nothing else queues.
    let mut go_server = GoServer::start(&peer, &valkey, &["-handle", "event:,listener:"]);
    // The worker relays only: its consumer serves another queue.
    let mut worker = start_worker(
        &db,
        &valkey,
        &[("WORKER_QUEUES", "idle=1"), ("OUTBOX_TASK_RETENTION", "1h")],
    );

    let since = time::OffsetDateTime::now_utc().date();
    let envelopes = dispatch(&db, 20);
    wait_until(
        Duration::from_secs(60),
        "the Go server ran 20 tasks",
        || go_server.lines("done").len() >= 20,
    );

    // Each event once, as the Go kit sees it.
    let done = go_server.lines("done");
    let by_id: BTreeMap<&str, &Value> = done.iter().map(|d| (str_of(&d["id"]), d)).collect();
    assert_eq!((done.len(), by_id.len()), (20, 20), "{done:?}");
    assert!(go_server.lines("failed").is_empty());
    for sent in &envelopes {
        let id = str_of(&sent["id"]);
        let task = by_id
            .get(id)
            .unwrap_or_else(|| panic!("{id} did not reach Go"));
        assert_eq!(task["type"], "event:orderPlaced");
        assert_eq!(task["queue"], "default");
        assert_eq!(
            (&task["retried"], &task["max_retry"]),
            (&json!(0), &json!(25))
        );
        let seen = &task["envelope"];
        assert_eq!(seen["id"], sent["id"]);
        assert_eq!(seen["name"], "orderPlaced");
        assert_eq!(seen["payload"], sent["payload"]);
        assert_eq!(
            seen["payload"]["note"],
            format!("order {}", seen["payload"]["order_id"])
        );
        assert_eq!(instant(&seen["occurred_at"]), instant(&sent["occurred_at"]));
        assert_eq!(seen["metadata"], sent["metadata"]);
        let traceparent = str_of(&seen["metadata"]["traceparent"]);
        assert!(
            traceparent.starts_with(&format!("00-{TRACE_ID}-")),
            "{traceparent}"
        );
        assert_eq!(seen["metadata"]["tracestate"], TRACESTATE);
        // The same context in the task's headers, where Go middleware reads it.
        assert_eq!(
            task["headers"],
            json!({"traceparent": traceparent, "tracestate": TRACESTATE}),
            "the task's headers"
        );
    }

    // The Inspector's view of each task once Go has completed it.
    for sent in &envelopes {
        let info = wait_for_state(&peer, &valkey, "default", str_of(&sent["id"]), "completed");
        assert_eq!(info["type"], "event:orderPlaced");
        assert_eq!(info["retention"], 3600.0, "OUTBOX_TASK_RETENTION");
        assert_eq!(info["max_retry"], 25);
        assert_eq!(info["timeout"], 1800.0);
        assert_eq!(
            (&info["retried"], &info["last_err"]),
            (&json!(0), &json!(""))
        );
        assert!(info["completed_at"].as_i64().unwrap() > 0, "{info}");
    }
    assert_counters(&go_queue(&peer, &valkey, "default"), since, 20, 0);
    // All completed, so nothing can run again: still one run each.
    assert_eq!(go_server.lines("done").len(), 20);
    go_retries_a_run_that_outbox_cancel_stops(&peer, &valkey, &db, &go_server, &envelopes[0]);
    stop_worker(&mut worker, Duration::from_secs(35));
    go_server.stop(Duration::from_secs(15));
}

/// `outbox cancel` of a listener task that a Go server runs: Go asynq
/// treats the cancelled handler as failed and retries it (a kit worker
/// would not); a second `outbox cancel` deletes it from `retry`.
fn go_retries_a_run_that_outbox_cancel_stops(
    peer: &Path,
    valkey: &RedisServer,
    db: &Database,
    go_server: &GoServer,
    event: &Value,
) {
    // Arrange: the event's `audit` task, run by the Go server until cancelled.
    let event_id = str_of(&event["id"]);
    let shown = outbox_json(db, valkey, &["show", event_id]);
    let audit = shown["listener_tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|task| task["listener"] == "audit")
        .unwrap_or_else(|| panic!("no audit task in {shown}"));
    let task_id = str_of(&audit["id"]).to_string();
    let line = json!({"id": task_id, "payload": {"order_id": 1, "note": "sleep:60000"}});
    go_enqueue(
        peer,
        valkey,
        &["-type", "listener:orderPlaced:audit"],
        &[line],
    );
    wait_until(
        Duration::from_secs(30),
        "the Go server runs the task",
        || go_server.ids("start").contains(&task_id),
    );

    // Act
    let cancel = ["cancel", event_id, "--listener", "audit", "--yes"];
    let asked = outbox_json(db, valkey, &cancel);
    let info = wait_for_state(peer, valkey, "default", &task_id, "retry");
    let deleted = outbox_json(db, valkey, &cancel);

    // Assert
    assert_eq!(
        asked["asked_to_stop"][0]["task_id"],
        task_id.as_str(),
        "{asked}"
    );
    assert!(asked["workers_listening"].as_i64().unwrap() >= 1, "{asked}");
    assert_eq!(
        (&info["last_err"], &info["retried"]),
        (&json!("context canceled"), &json!(1)),
        "{info}"
    );
    assert_eq!(deleted["deleted"][0]["state"], "retry", "{deleted}");
    let key = format!("asynq:{{default}}:t:{task_id}");
    assert_eq!(valkey.cli(&["EXISTS", &key]).as_deref(), Some("0"));
}

/// Runs the project's `outbox` command with `--format json`; its output.
fn outbox_json(db: &Database, valkey: &RedisServer, args: &[&str]) -> Value {
    let output = Command::new(project().join(".bin/outbox"))
        .args(args)
        .args(["--format", "json"])
        .env("DATABASE_URL", db.url())
        .env("VALKEY_ADDR", valkey.addr())
        .env("WORKER_QUEUES", "idle=1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "outbox {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// Separate services on separate queues: the Rust `shop` service publishes
/// its events to its own queue and to the Go `billing` service's
/// (`OUTBOX_QUEUES=shop,billing`). The Go server, serving `billing` only,
/// gets every event once; the Rust worker, serving `shop` only, runs each of
/// its listeners once; neither takes the other's tasks.
/// A worker with ordered listeners (the project of `valkey_infra`) beside a
/// real Go asynq server consuming its queue: the worker does not start,
/// and names the Go server (a Go process would fan keyed events out
/// without taking their turns, and run ordered runs without moving their
/// keys on); once the Go server stops, the worker starts.
#[test]
#[ignore = "builds a generated project"]
fn a_worker_with_ordered_listeners_does_not_start_beside_a_go_server_on_its_queue() {
    let Some(peer) = go_peer("asynqpeer") else {
        return;
    };
    let project = crate::valkey_infra::project();
    let valkey = valkey();
    let db = Database::create("gpkit_ordered_go");
    migrate(project, &db, &["up"]);
    let mut go_server =
        GoServer::start(&peer, &valkey, &["-queues", "default", "-handle", "event:"]);
    let worker_bin = project.join(".bin/worker");
    let env = [
        ("WORKER_QUEUES", "default=1"),
        ("SCHEDULER_ENABLED", "false"),
    ];

    let mut refused = Worker::start_binary(&worker_bin, &db, &valkey, &env);
    let code = refused.wait(Duration::from_secs(60));
    go_server.stop(Duration::from_secs(10));
    let mut worker = start_ordered_worker(&worker_bin, &db, &valkey, &env);
    stop_worker(&mut worker, Duration::from_secs(35));

    assert_ne!(
        code,
        Some(0),
        "the worker started beside the Go server:\n{}",
        refused.log()
    );
    let log = refused.log();
    assert!(
        log.contains("consume its queues without keeping their order (a Go asynq server")
            && log.contains("on queue(s) default"),
        "{log}"
    );
}

/// Starts the worker `bin` and waits until its consumer runs.
fn start_ordered_worker(
    bin: &Path,
    db: &Database,
    valkey: &RedisServer,
    env: &[(&str, &str)],
) -> Worker {
    let worker = Worker::start_binary(bin, db, valkey, env);
    wait_until(Duration::from_secs(30), "the Rust worker consumes", || {
        worker.log().contains("consumer started")
    });
    worker
}

#[test]
#[ignore = "builds a generated project"]
fn separate_services_on_separate_queues_each_get_every_event() {
    let Some(peer) = go_peer("asynqpeer") else {
        return;
    };
    project();
    let valkey = valkey();
    let db = database();
    let mut go_server =
        GoServer::start(&peer, &valkey, &["-queues", "billing", "-handle", "event:"]);
    let mut worker = start_worker(
        &db,
        &valkey,
        &[
            ("WORKER_QUEUES", "shop=1"),
            ("OUTBOX_QUEUES", "shop,billing"),
        ],
    );

    let envelopes = dispatch(&db, 12);
    let mut ids: Vec<String> = envelopes
        .iter()
        .map(|e| str_of(&e["id"]).to_string())
        .collect();
    ids.sort();
    wait_until(Duration::from_secs(60), "Go ran 12 events", || {
        go_server.lines("done").len() >= 12
    });
    wait_until(
        Duration::from_secs(60),
        "each Rust listener ran 12 times",
        || {
            listener_runs(&db, "audit", "done").len() >= 12
                && listener_runs(&db, "email", "done").len() >= 12
        },
    );

    let mut go_ids = go_server.ids("done");
    go_ids.sort();
    assert_eq!(go_ids, ids, "Go got other events, or some twice");
    assert!(
        go_server
            .lines("done")
            .iter()
            .all(|d| d["queue"] == "billing")
    );
    for listener in ["audit", "email"] {
        let mut runs = listener_runs(&db, listener, "done");
        runs.sort();
        assert_eq!(runs, ids, "the Rust listener `{listener}`");
    }
    // Each queue's tasks were all processed by its own consumer: 12 event
    // tasks in `billing` (Go); 12 event and 24 listener tasks in `shop`.
    wait_until(
        Duration::from_secs(30),
        "the queues' counters settle",
        || {
            go_queue(&peer, &valkey, "billing")["processed_total"] == 12
                && go_queue(&peer, &valkey, "shop")["processed_total"] == 36
        },
    );
    stop_worker(&mut worker, Duration::from_secs(35));
    go_server.stop(Duration::from_secs(15));
}

/// Go-kit events enqueued by a Go asynq client (`event:orderPlaced`, task
/// id = envelope id) run each Rust listener exactly once with the typed
/// payload and the Go side's trace parent, through the Rust fan-out, whose
/// listener tasks Go's Inspector lists as completed; enqueuing an id again
/// is asynq.ErrTaskIDConflict on the Go side and runs nothing.
#[test]
#[ignore = "builds a generated project"]
fn go_kit_events_from_a_go_client_run_each_rust_listener_once() {
    let Some(peer) = go_peer("asynqpeer") else {
        return;
    };
    project();
    let redis = RedisServer::start();
    let db = database();
    let mut worker = start_worker(
        &db,
        &redis,
        &[
            ("WORKER_QUEUES", "default=1"),
            ("OUTBOX_TASK_RETENTION", "1h"),
        ],
    );
    let since = time::OffsetDateTime::now_utc().date();

    // The fifth task also carries a trace in its headers, as a Go tracing
    // middleware writes it: its listeners run in that trace.
    let lines: Vec<Value> = (1..=5)
        .map(|n| {
            let mut line = json!({
                "payload": {"order_id": n, "note": format!("from go {n}")},
                "metadata": {"traceparent": TRACEPARENT},
            });
            if n == 5 {
                line["headers"] = json!({"traceparent": HEADER_TRACEPARENT});
            }
            line
        })
        .collect();
    let options = ["-type", "event:orderPlaced", "-retention", "1h"];
    let enqueued = go_enqueue(&peer, &redis, &options, &lines);
    assert!(
        enqueued.iter().all(|e| e["result"] == "enqueued"),
        "{enqueued:?}"
    );

    // 5 event tasks and 10 listener tasks, all completed.
    let counts = wait_until_all_completed(&peer, &redis, "default", 15, Duration::from_secs(120));
    assert_counters(&counts, since, 15, 0);
    let mut expected = Vec::new();
    for listener in ["audit", "email"] {
        for (n, e) in (1..=5).zip(&enqueued) {
            let id = str_of(&e["id"]);
            expected.push(format!(
                "{listener}|{id}|{n}|from go {n}|{TRACEPARENT}|done"
            ));
        }
    }
    let runs = psql(
        &db.url(),
        "SELECT listener, event_id, order_id, note, traceparent, outcome FROM listener_runs \
         ORDER BY listener, order_id",
    );
    assert_eq!(runs, expected.join("\n"), "each listener once per event");
    let traces = psql(
        &db.url(),
        "SELECT order_id, running_in FROM listener_runs ORDER BY listener, order_id",
    );
    let expected: Vec<String> = ["audit", "email"]
        .iter()
        .flat_map(|_| 1..=5)
        .map(|n| {
            let trace = if n == 5 { HEADER_TRACE_ID } else { TRACE_ID };
            format!("{n}|{trace}")
        })
        .collect();
    assert_eq!(
        traces,
        expected.join("\n"),
        "the headers' trace first, else the envelope's"
    );

    // Go lists one completed task per listener per event, carrying the envelope.
    let completed = go(&peer, &redis, &["list", "default", "completed"], "");
    for e in &enqueued {
        let of_event = |task_type: &str| {
            completed
                .iter()
                .filter(|t| t["type"] == task_type)
                .filter(|t| {
                    serde_json::from_str::<Value>(str_of(&t["payload"])).unwrap()["id"] == e["id"]
                })
                .count()
        };
        assert_eq!(of_event("event:orderPlaced"), 1);
        assert_eq!(of_event(AUDIT_TASK), 1);
        assert_eq!(of_event("listener:orderPlaced:email"), 1);
    }
    // Completed by the Rust worker as by Go: with a completion time, kept
    // for their retention (the Go client's for events, OUTBOX_TASK_RETENTION
    // for listener tasks), with the fan-out's options on listener tasks.
    for task in &completed {
        assert!(task["completed_at"].as_i64().unwrap() > 0, "{task}");
        assert_eq!(task["retention"], 3600.0, "{task}");
        assert_eq!(task["timeout"], 1800.0, "{task}");
        assert_eq!(task["max_retry"], 25, "{task}");
        assert_eq!(
            (&task["retried"], &task["last_err"]),
            (&json!(0), &json!(""))
        );
    }

    // The same envelope again: a task id conflict, and nothing runs.
    let again = go_enqueue(
        &peer,
        &redis,
        &options,
        &[json!({"id": enqueued[0]["id"], "payload": {}})],
    );
    assert_eq!(again[0]["result"], "conflict");
    assert_eq!(go_queue(&peer, &redis, "default")["pending"], 0);
    stop_worker(&mut worker, Duration::from_secs(35));
    assert_eq!(psql(&db.url(), "SELECT count(*) FROM listener_runs"), "10");
}

/// A unique task (asynq.Unique) from a Go client holds its uniqueness lock
/// while it waits, and the Rust worker releases the lock when it completes
/// the task, as a Go server does: the same task can then be enqueued again.
#[test]
#[ignore = "builds a generated project"]
fn a_unique_go_task_completed_by_the_rust_worker_releases_its_lock() {
    let Some(peer) = go_peer("asynqpeer") else {
        return;
    };
    project();
    let redis = RedisServer::start();
    let db = database();
    // The same bytes twice: asynq's uniqueness is by queue, type and payload.
    let id = "0193a5c2-5b6e-7d1f-9a2b-000000000001";
    let task = json!({
        "id": id,
        "occurred_at": "2026-11-30T08:00:00Z",
        "payload": {"order_id": 1, "note": "unique"},
    });
    // Retention 0: a completed task is deleted, so only the lock can refuse it.
    let options = ["-type", AUDIT_TASK, "-unique", "1h", "-retention", "0s"];

    let first = go_enqueue(&peer, &redis, &options, &[task.clone(), task.clone()]);
    let results: Vec<&Value> = first.iter().map(|e| &e["result"]).collect();
    assert_eq!(
        results,
        ["enqueued", "duplicate"],
        "the lock holds while pending"
    );
    let mut worker = start_worker(&db, &redis, &[("WORKER_QUEUES", "default=1")]);
    wait_until(Duration::from_secs(30), "the task ran", || {
        count_runs(&db, "done") == 1
    });
    wait_until(Duration::from_secs(30), "the task is gone", || {
        go_info(&peer, &redis, "default", id)["error"] == "task not found"
    });

    let again = go_enqueue(&peer, &redis, &options, &[task]);
    assert_eq!(again[0]["result"], "enqueued", "the lock was released");
    wait_until(Duration::from_secs(30), "the task ran again", || {
        count_runs(&db, "done") == 2
    });
    stop_worker(&mut worker, Duration::from_secs(35));
}

/// A task a Go client schedules for later (asynq.ProcessIn) waits in
/// `scheduled`, and the Rust worker's forwarder runs it once it is due.
#[test]
#[ignore = "builds a generated project"]
fn a_go_task_scheduled_for_later_runs_on_the_rust_worker_when_due() {
    let Some(peer) = go_peer("asynqpeer") else {
        return;
    };
    project();
    let redis = RedisServer::start();
    let db = database();
    let mut worker = start_worker(&db, &redis, &[("WORKER_QUEUES", "default=1")]);

    let options = ["-type", AUDIT_TASK, "-process-in", "3s"];
    let later = [json!({"payload": {"order_id": 1, "note": "later"}})];
    let enqueued = go_enqueue(&peer, &redis, &options, &later);
    let id = str_of(&enqueued[0]["id"]);
    let scheduled = go_info(&peer, &redis, "default", id);
    assert_eq!(scheduled["state"], "scheduled");
    let due = scheduled["next_process_at"].as_i64().unwrap();

    wait_for_state(&peer, &redis, "default", id, "completed");
    assert_eq!(listener_runs(&db, "audit", "done"), [id]);
    let ran_at: i64 = psql(
        &db.url(),
        "SELECT floor(extract(epoch FROM at))::bigint FROM listener_runs",
    )
    .parse()
    .unwrap();
    assert!(ran_at >= due, "ran at {ran_at}, due at {due}");
    stop_worker(&mut worker, Duration::from_secs(35));
}

/// A task that hangs (its handler sleeps 10 min) running on a Go server
/// that serves the queue `goside` and on the Rust worker that serves
/// `default`, 7 handlers each: the set-up of the known-bug tests, where the
/// Go server is the control. Returns both sides and the ids of their
/// tasks, once both run.
fn hang_on_both_sides(
    peer: &Path,
    redis: &RedisServer,
    db: &Database,
) -> (GoServer, Worker, String, String) {
    let (go_server, worker, go_ids, rust_ids) = hang_tasks_on_both_sides(peer, redis, db, 1);
    let only = |ids: BTreeSet<String>| ids.into_iter().next().expect("one task");
    (go_server, worker, only(go_ids), only(rust_ids))
}

/// A Go server on `goside` and a Rust worker on `default`, 7 handlers
/// each, each running `tasks` audit tasks that sleep for 10 minutes;
/// returns both and the ids of each side's tasks, once all have started.
fn hang_tasks_on_both_sides(
    peer: &Path,
    redis: &RedisServer,
    db: &Database,
    tasks: usize,
) -> (GoServer, Worker, BTreeSet<String>, BTreeSet<String>) {
    let serve = [
        "-queues",
        "goside",
        "-handle",
        AUDIT_TASK,
        "-concurrency",
        "7",
        "-shutdown-timeout",
        "1s",
    ];
    let go_server = GoServer::start(peer, redis, &serve);
    let env = [
        ("WORKER_QUEUES", "default=1"),
        ("WORKER_CONCURRENCY", "7"),
        ("WORKER_SHUTDOWN_TIMEOUT", "1s"),
    ];
    let worker = start_worker(db, redis, &env);
    let hang: Vec<Value> = (0..tasks)
        .map(|n| json!({"payload": {"order_id": n, "note": "sleep:600000"}}))
        .collect();
    let enqueue = |queue: &str| -> BTreeSet<String> {
        let options = ["-type", AUDIT_TASK, "-queue", queue];
        go_enqueue(peer, redis, &options, &hang)
            .iter()
            .map(|enqueued| str_of(&enqueued["id"]).to_string())
            .collect()
    };
    let (go_ids, rust_ids) = (enqueue("goside"), enqueue("default"));
    wait_until(
        Duration::from_secs(30),
        "both sides run their tasks",
        || {
            let started: BTreeSet<String> = go_server.ids("start").into_iter().collect();
            started == go_ids && count_runs(db, "start") == tasks
        },
    );
    (go_server, worker, go_ids, rust_ids)
}

/// A Go asynq server announces itself in `asynq:servers`/`asynq:workers`
/// (queue-wire.md §5) every 5 s, which Inspector.Servers() and asynqmon's
/// Servers page read: the Go server of the control is listed with its
/// queue, concurrency and running tasks, one `WorkerInfo` per task, and so
/// must the Rust worker be, with the three tasks it runs at once.
#[test]
#[ignore = "builds a generated project"]
fn a_running_rust_worker_is_listed_by_inspector_servers_as_a_go_server_is() {
    let Some(peer) = go_peer("asynqpeer") else {
        return;
    };
    project();
    let redis = RedisServer::start();
    let db = database();
    let (mut go_server, mut worker, go_ids, rust_ids) =
        hang_tasks_on_both_sides(&peer, &redis, &db, 3);

    for (queue, ids, side) in [("goside", &go_ids, "Go"), ("default", &rust_ids, "Rust")] {
        let listed = || {
            go(&peer, &redis, &["servers"], "").iter().any(|server| {
                let workers = server["active_workers"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                let running: BTreeSet<String> = workers
                    .iter()
                    .map(|worker| str_of(&worker["task_id"]).to_string())
                    .collect();
                server["queues"] == json!({queue: 1})
                    && server["concurrency"] == 7
                    && server["status"] == "active"
                    && workers.len() == 3
                    && running == *ids
                    && workers
                        .iter()
                        .all(|worker| worker["task_type"] == AUDIT_TASK && worker["queue"] == queue)
            })
        };
        let what =
            format!("Inspector.Servers lists the {side} side with one worker per running task");
        wait_until(Duration::from_secs(15), &what, listed);
    }
    stop_worker(&mut worker, Duration::from_secs(10));
    go_server.stop(Duration::from_secs(10));
}

/// Inspector.CancelProcessing (asynqmon's Cancel button) publishes a task
/// id on the `asynq:cancel` channel; both sides stop the running handler.
/// A Go server retries the task with "context canceled" (the control); on
/// the Rust worker a cancelled listener run is final, as kit/docs/
/// operations.md says: the task is deleted, not retried, and recorded as
/// cancelled, not failed.
#[test]
#[ignore = "builds a generated project"]
fn inspector_cancel_processing_stops_a_task_on_the_rust_worker_and_on_a_go_server() {
    let Some(peer) = go_peer("asynqpeer") else {
        return;
    };
    project();
    let redis = RedisServer::start();
    let db = database();
    let (mut go_server, mut worker, go_id, rust_id) = hang_on_both_sides(&peer, &redis, &db);

    // The Go side: retried, with Go's error.
    go(&peer, &redis, &["cancel", &go_id], "");
    let mut info = Value::Null;
    let retried = || {
        info = go_info(&peer, &redis, "goside", &go_id);
        info["state"] == "retry"
    };
    wait_until(
        Duration::from_secs(15),
        "the Go side cancels its task",
        retried,
    );
    assert_eq!(
        (&info["retried"], &info["last_err"]),
        (&json!(1), &json!("context canceled"))
    );

    // The Rust side: deleted and recorded as cancelled.
    go(&peer, &redis, &["cancel", &rust_id], "");
    let task_key = format!("asynq:{{default}}:t:{rust_id}");
    wait_until(
        Duration::from_secs(15),
        "the Rust side cancels its task",
        || redis.cli(&["EXISTS", &task_key]).as_deref() == Some("0"),
    );
    let recorded = psql(
        &db.url(),
        &format!("SELECT listener, state FROM listener_cancellations WHERE task_id = '{rust_id}'"),
    );
    assert_eq!(recorded.trim(), "audit|active", "{}", worker.log());
    let failed = psql(&db.url(), "SELECT count(*) FROM listener_failures");
    assert_eq!(failed.trim(), "0");
    stop_worker(&mut worker, Duration::from_secs(10));
    go_server.stop(Duration::from_secs(10));
}

/// A Rust listener that fails is retried and then archived, and Go's
/// Inspector shows it exactly as a task a Go server failed the same way:
/// both are enqueued by the Go client as `listener:orderPlaced:audit` with
/// MaxRetry(1) (the fan-out's listener tasks get 25, too many to spend in a
/// test), fail, wait in `retry`, are run again at once with
/// Inspector.RunTask (instead of waiting out Go's 15-45 s retry delay),
/// fail again and are archived. RunTask on the archived Rust task, once the
/// cause is gone, makes the Rust worker run it again, to completion.
#[test]
#[ignore = "builds a generated project"]
fn a_failing_rust_listener_is_retried_and_archived_as_a_go_task_is() {
    let Some(peer) = go_peer("asynqpeer") else {
        return;
    };
    project();
    let redis = RedisServer::start();
    let db = database();
    let since = time::OffsetDateTime::now_utc().date();
    psql(&db.url(), "INSERT INTO refused_orders VALUES (7)");
    let refusal = "order 7 refused";
    let mut worker = start_worker(&db, &redis, &[("WORKER_QUEUES", "default=1")]);
    let serve = ["-queues", "gofail", "-handle", AUDIT_TASK, "-fail", refusal];
    let mut go_server = GoServer::start(&peer, &redis, &serve);

    // One envelope, enqueued to both queues: Rust serves `default`, Go `gofail`.
    let id = "0193a5c2-5b6e-7d1f-9a2b-3c4d5e6f7a8b";
    let order = [json!({
        "id": id,
        "occurred_at": "2026-11-30T08:00:00.123456Z",
        "payload": {"order_id": 7, "note": "refused"},
    })];
    for queue in ["default", "gofail"] {
        let options = ["-type", AUDIT_TASK, "-queue", queue, "-max-retry", "1"];
        assert_eq!(
            go_enqueue(&peer, &redis, &options, &order)[0]["result"],
            "enqueued"
        );
    }

    // Fail, retry, fail, archive: the same steps on both sides.
    let mut archived = Vec::new();
    for queue in ["default", "gofail"] {
        let retry = wait_for_state(&peer, &redis, queue, id, "retry");
        assert_eq!(
            (&retry["retried"], &retry["last_err"]),
            (&json!(1), &json!(refusal))
        );
        assert!(retry["next_process_at"].as_i64().unwrap() > 0, "{retry}");
        go(&peer, &redis, &["run", queue, id], "");
        archived.push(wait_for_state(&peer, &redis, queue, id, "archived"));
    }
    let (by_rust, by_go) = (&archived[0], &archived[1]);
    for field in [
        "id",
        "type",
        "payload",
        "state",
        "max_retry",
        "retried",
        "last_err",
        "timeout",
        "retention",
        "completed_at",
        "next_process_at",
    ] {
        assert_eq!(
            by_rust[field], by_go[field],
            "{field}: {by_rust} vs {by_go}"
        );
    }
    assert_eq!(by_rust["state"], "archived");
    assert_eq!(
        (&by_rust["retried"], &by_rust["max_retry"]),
        (&json!(1), &json!(1))
    );
    assert_eq!(by_rust["last_err"], refusal);
    for info in &archived {
        assert!(info["last_failed_at"].as_i64().unwrap() > 0, "{info}");
    }
    assert_eq!(listener_runs(&db, "audit", "failed"), [id, id]);
    assert_eq!(go_server.ids("failed"), [id, id]);
    for queue in ["default", "gofail"] {
        assert_counters(&go_queue(&peer, &redis, queue), since, 2, 2);
    }
    let listed = go(&peer, &redis, &["list", "default", "archived"], "");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["id"], id);

    // Run the archived task again once the order is no longer refused.
    psql(&db.url(), "DELETE FROM refused_orders");
    go(&peer, &redis, &["run", "default", id], "");
    wait_for_state(&peer, &redis, "default", id, "completed");
    assert_eq!(listener_runs(&db, "audit", "done"), [id]);
    assert_counters(&go_queue(&peer, &redis, "default"), since, 3, 2);
    stop_worker(&mut worker, Duration::from_secs(35));
    go_server.stop(Duration::from_secs(15));
}

/// A task whose worker died (SIGKILL) stays active under a lease that
/// nobody extends; once the lease has expired for longer than the 30 s
/// grace both implementations allow for clock skew, the other side's
/// recoverer retries it. Both ways at once, on two queues: a Go server
/// recovers the task of a killed Rust worker (queue `rustdies`), a Rust
/// worker the task of a killed Go server (`godies`). Go's Inspector lists
/// each task as active and orphaned while its lease is out, then waiting in
/// `retry` with one retry counted and asynq's lease-expired error.
#[test]
#[ignore = "builds a generated project"]
fn a_killed_sides_leased_task_is_recovered_by_the_other_side() {
    let Some(peer) = go_peer("asynqpeer") else {
        return;
    };
    project();
    let redis = RedisServer::start();
    let db = database();
    let hang = [json!({"payload": {"order_id": 1, "note": "sleep:600000"}})];
    let enqueue = |queue: &str| {
        let options = ["-type", AUDIT_TASK, "-queue", queue];
        str_of(&go_enqueue(&peer, &redis, &options, &hang)[0]["id"]).to_string()
    };
    let (of_rust, of_go) = (enqueue("rustdies"), enqueue("godies"));

    // Each side starts its task and is killed in the middle of it.
    let mut rust = start_worker(&db, &redis, &[("WORKER_QUEUES", "rustdies=1")]);
    let go_args = ["-queues", "godies", "-handle", AUDIT_TASK];
    let mut go_server = GoServer::start(&peer, &redis, &go_args);
    wait_until(Duration::from_secs(30), "both sides run their task", || {
        count_runs(&db, "start") == 1 && go_server.ids("start") == [of_go.as_str()]
    });
    rust.signal("-KILL");
    rust.wait(Duration::from_secs(10));
    go_server.kill();

    // The leases run out: Go lists both tasks as active and orphaned.
    let tasks = [("rustdies", &of_rust), ("godies", &of_go)];
    let orphaned = |queue: &str, id: &str| {
        let active = go(&peer, &redis, &["list", queue, "active"], "");
        active
            .iter()
            .any(|t| t["id"] == id && t["is_orphaned"] == true)
    };
    wait_until(Duration::from_secs(45), "both leases expired", || {
        tasks.iter().all(|(queue, id)| orphaned(queue, id))
    });

    // Past the grace, each side's recoverer (which runs at start) takes
    // the other's task. The Go server handles no task type of the queue:
    // only its recoverer acts.
    let lease_of = |queue: &str, id: &str| -> i64 {
        let key = format!("asynq:{{{queue}}}:lease");
        redis.cli(&["ZSCORE", &key, id]).unwrap().parse().unwrap()
    };
    wait_until(
        Duration::from_secs(45),
        "both leases expired 30 s ago",
        || {
            let cutoff = time::OffsetDateTime::now_utc().unix_timestamp() - 31;
            tasks.iter().all(|(queue, id)| lease_of(queue, id) < cutoff)
        },
    );
    let recovering_go = ["-queues", "rustdies", "-handle", "job:"];
    let mut go_server = GoServer::start(&peer, &redis, &recovering_go);
    let mut rust = start_worker(&db, &redis, &[("WORKER_QUEUES", "godies=1")]);
    for (queue, id) in tasks {
        let info = wait_for_state(&peer, &redis, queue, id, "retry");
        assert_eq!(
            (&info["retried"], &info["last_err"]),
            (&json!(1), &json!("asynq: task lease expired")),
            "{queue}: {info}"
        );
    }
    stop_worker(&mut rust, Duration::from_secs(35));
    go_server.stop(Duration::from_secs(15));
}

/// One side of the shared queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Side {
    Go,
    Rust,
}

impl Side {
    fn other(self) -> Self {
        match self {
            Self::Go => Self::Rust,
            Self::Rust => Self::Go,
        }
    }
}

/// How one side of a [`share_the_queue`] run is stopped midway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// SIGTERM to that side (the first Rust worker, for Rust).
    Term(Side),
    /// SIGKILL to the (first) Rust worker.
    KillRust,
}

/// A run of [`share_the_queue`].
struct Run {
    /// How many tasks the Go client enqueues.
    tasks: usize,
    /// How many Rust worker processes serve the queue beside the Go server.
    rust_workers: usize,
    /// How a side is stopped midway, if one is.
    stop: Option<Stop>,
}

/// The note of every task of a [`Stop::KillRust`] run: each sleeps 80 ms,
/// so that both sides hold tasks all along and the run outlasts the 30 s
/// the kill waits for (10,000 tasks on 20 handlers take 40 s at least),
/// while the Go server alone, after the kill, finishes the rest in about
/// the time its recoverer takes to come round (2 min after its start).
const KILL_RUN_NOTE: &str = "sleep:80";

/// What a [`Stop::KillRust`] run saw of the killed worker.
struct Killed {
    /// The tasks it held when killed: those whose lease expired and that
    /// Go's recoverer retried ("asynq: task lease expired", 1 retry).
    held: BTreeSet<String>,
    /// The tasks it had started before the kill (its `start` records).
    started: BTreeSet<String>,
    /// The tasks it had run to completion before the kill (its `done`
    /// records).
    finished: BTreeSet<String>,
}

/// What [`share_the_queue`] saw.
struct Shared {
    /// Task ids enqueued, with whether the task was a slow one.
    enqueued: BTreeMap<String, bool>,
    /// The ids of the completed runs of each side, one per run.
    done: BTreeMap<Side, Vec<String>>,
    /// The same runs by process: the Go server's, then each Rust worker's.
    by_process: Vec<(String, Vec<String>)>,
    /// Slow tasks the stopped side had started but never finished (with
    /// [`Stop::KillRust`], any task).
    interrupted: BTreeSet<String>,
    /// With [`Stop::KillRust`], what the killed worker left.
    killed: Option<Killed>,
    /// The queue's counts at the end.
    counts: Value,
    /// The UTC date the test began.
    since: time::Date,
}

/// The note of the slow tasks of a run that stops one side with SIGTERM
/// (every 500th): a run that long, on a side stopped with a shutdown
/// timeout of 1 s, is cut short, however late the test saw it start (with
/// 5 s, a machine busy with other tests saw one start so late that it
/// finished within the timeout, and nothing was cut short).
const SLOW_NOTE: &str = "sleep:15000";

/// A Go asynq server and `run.rust_workers` Rust worker processes, 10
/// handlers each, share the `default` queue of `redis`, where the Go client
/// enqueues `run.tasks` `listener:orderPlaced:audit` tasks (a task type
/// both sides handle: the Rust `audit` listener and a Go ServeMux handler)
/// while the queue is paused, and then unpauses it; they run until all are
/// completed.
///
/// With [`Stop::Term`], every 500th task sleeps 15 s ([`SLOW_NOTE`]), and once 3,000 runs
/// are done and the stopped side is in the middle of a slow task, that side
/// gets SIGTERM, with a shutdown timeout of 1 s.
///
/// With [`Stop::KillRust`], every task sleeps ([`KILL_RUN_NOTE`]), and once
/// 3,000 runs are done, the Rust worker runs tasks and the Go server has
/// been up 30 s, the Rust worker gets SIGKILL. The Go server runs what is
/// left; the tasks the killed worker held stay active under a lease nobody
/// extends until Go's recoverer (at the Go server's start and then every
/// minute) retries them, 30 s past their lease: that is its round at 2
/// min, 60 to 90 s after the kill. Inspector.RunTask then runs them at once
/// rather than after Go's 15-45 s retry delay.
fn share_the_queue(run: &Run, redis: RedisServer) -> Shared {
    let Run {
        tasks,
        rust_workers,
        stop,
    } = *run;
    let term = match stop {
        Some(Stop::Term(side)) => Some(side),
        _ => None,
    };
    let peer = go_peer("asynqpeer").expect("checked by the caller");
    let db = database();
    let go_timeout = if term == Some(Side::Go) { "1s" } else { "8s" };
    let serve = [
        "-handle",
        AUDIT_TASK,
        "-concurrency",
        "10",
        "-shutdown-timeout",
        go_timeout,
    ];
    // Before the Go server starts: its recoverer's rounds are counted from
    // its start.
    let go_started = Instant::now();
    let mut go_server = GoServer::start(&peer, &redis, &serve);
    let rust_timeout = if term == Some(Side::Rust) {
        "1s"
    } else {
        "30s"
    };
    let env = [
        ("WORKER_QUEUES", "default=1"),
        ("WORKER_CONCURRENCY", "10"),
        ("WORKER_SHUTDOWN_TIMEOUT", rust_timeout),
    ];
    let mut workers: Vec<Worker> = (0..rust_workers)
        .map(|_| start_worker(&db, &redis, &env))
        .collect();

    let lines: Vec<Value> = (0..tasks)
        .map(|n| {
            let slow = term.is_some() && n % 500 == 250;
            let note = if slow {
                SLOW_NOTE.to_string()
            } else if stop == Some(Stop::KillRust) {
                KILL_RUN_NOTE.to_string()
            } else {
                format!("task {n}")
            };
            json!({"payload": {"order_id": n, "note": note}})
        })
        .collect();
    // Enqueued while the queue is paused (which both sides honour), so
    // that all start on the whole backlog at once.
    let since = time::OffsetDateTime::now_utc().date();
    go(&peer, &redis, &["pause", "default"], "");
    let options = ["-type", AUDIT_TASK, "-retention", "1h"];
    let enqueued: BTreeMap<String, bool> = go_enqueue(&peer, &redis, &options, &lines)
        .iter()
        .map(|e| {
            assert_eq!(e["result"], "enqueued");
            let slow = e["envelope"]["payload"]["note"] == SLOW_NOTE;
            (str_of(&e["id"]).to_string(), slow)
        })
        .collect();
    assert_eq!(enqueued.len(), tasks);
    assert_eq!(go_queue(&peer, &redis, "default")["pending"], tasks);
    go(&peer, &redis, &["unpause", "default"], "");
    let start = Instant::now();

    // Slow tasks a side has started and not finished.
    let first_rust = workers.first().map(Worker::pid);
    let in_flight_slow = |side: Side, go_server: &GoServer| -> BTreeSet<String> {
        match side {
            Side::Go => {
                let done: BTreeSet<String> = go_server.ids("done").into_iter().collect();
                let started = go_server.ids("start").into_iter();
                started
                    .filter(|id| enqueued[id] && !done.contains(id))
                    .collect()
            }
            Side::Rust => audit_in_flight(&db, first_rust.expect("a Rust worker")),
        }
    };
    let mut interrupted = BTreeSet::new();
    let mut killed = None;
    if let Some(side) = term {
        let midway = || {
            let runs = go_server.ids("done").len() + count_runs(&db, "done");
            runs >= 3_000 && !in_flight_slow(side, &go_server).is_empty()
        };
        // A wait for the moment to stop, not a speed check: bounded
        // generously, for a machine busy with other tests.
        wait_until(
            Duration::from_secs(180),
            "3,000 runs and a slow task in flight",
            midway,
        );
        match side {
            Side::Go => go_server.stop(Duration::from_secs(10)),
            Side::Rust => stop_worker(&mut workers[0], Duration::from_secs(10)),
        }
        interrupted = in_flight_slow(side, &go_server);
    }
    if stop == Some(Stop::KillRust) {
        let rust = first_rust.expect("a Rust worker");
        let midway = || {
            let runs = go_server.ids("done").len() + count_runs(&db, "done");
            runs >= 3_000
                && go_started.elapsed() >= Duration::from_secs(30)
                && !audit_in_flight(&db, rust).is_empty()
        };
        wait_until(
            Duration::from_secs(180),
            "3,000 runs, tasks running on the Rust worker and the Go server up 30 s",
            midway,
        );
        workers[0].signal("-KILL");
        workers[0].wait(Duration::from_secs(10));
        let kill = Instant::now();
        let since_start = kill - go_started;
        let runs = go_server.ids("done").len() + count_runs(&db, "done");
        eprintln!(
            "SIGKILL to the Rust worker after {runs} runs, {since_start:.1?} after the Go \
             server's start"
        );
        // Go's first recoverer round later than 60 s after the kill (30 s
        // of lease, 30 s of grace), give or take the rounds' drift.
        let round = Duration::from_secs(60);
        let rounds_before = (since_start + round).as_secs() / round.as_secs();
        let next_round = go_started + round * (rounds_before as u32 + 1);
        let limit = next_round - Instant::now() + Duration::from_secs(20);
        // Recovered: in `retry` (where nothing else goes in this run), and
        // none left active under an expired lease.
        let mut counts = Value::Null;
        let recovered_or_done = || {
            counts = go_queue(&peer, &redis, "default");
            if counts["completed"] == tasks {
                return true;
            }
            counts["retry"].as_u64() > Some(0)
                && !go(&peer, &redis, &["list", "default", "active"], "")
                    .iter()
                    .any(|task| task["is_orphaned"] == true)
        };
        wait_until(
            limit,
            "Go's recoverer retries the tasks the killed Rust worker held",
            recovered_or_done,
        );
        eprintln!(
            "Go's recoverer retried {} tasks of the killed Rust worker {:.1?} after the kill",
            counts["retry"],
            kill.elapsed()
        );
        let retried = go(&peer, &redis, &["list", "default", "retry"], "");
        assert!(
            !retried.is_empty(),
            "the killed Rust worker held no task: nothing to recover ({counts})"
        );
        let started_on_go: BTreeSet<String> = go_server.ids("start").into_iter().collect();
        let mut held = BTreeSet::new();
        for task in &retried {
            let id = str_of(&task["id"]);
            assert_eq!(
                (&task["retried"], &task["last_err"]),
                (&json!(1), &json!("asynq: task lease expired")),
                "{task}"
            );
            assert!(
                !started_on_go.contains(id),
                "{id} was held by the killed Rust worker and started on Go before the recovery"
            );
            go(&peer, &redis, &["run", "default", id], "");
            held.insert(id.to_string());
        }
        killed = Some(held);
    }

    let limit = Duration::from_secs(60) + Duration::from_millis(6) * tasks as u32;
    let counts = wait_until_all_completed(&peer, &redis, "default", tasks as u64, limit);
    // What the killed worker recorded, it recorded before it was gone (read
    // now, when no write it sent can still be on its way).
    let killed = killed.map(|held| {
        let rust = first_rust.expect("a Rust worker");
        let records = |outcome: &str| -> BTreeSet<String> {
            let sql = format!(
                "SELECT event_id FROM listener_runs \
                 WHERE listener = 'audit' AND outcome = '{outcome}' AND pid = {rust}"
            );
            psql(&db.url(), &sql).lines().map(str::to_string).collect()
        };
        interrupted = audit_in_flight(&db, rust);
        Killed {
            held,
            started: records("start"),
            finished: records("done"),
        }
    });
    eprintln!(
        "{tasks} tasks shared by a Go server and {rust_workers} Rust worker(s) took {:.2?} \
         (stopped: {stop:?})",
        start.elapsed()
    );

    // Every recorded run, by process.
    let rust_runs = audit_runs_by_pid(&db);
    let pids: Vec<u32> = workers.iter().map(Worker::pid).collect();
    let strangers: Vec<&(u32, String)> = rust_runs
        .iter()
        .filter(|(pid, _)| !pids.contains(pid))
        .collect();
    assert!(
        strangers.is_empty(),
        "runs of no worker of this test: {strangers:?}"
    );
    let mut by_process = vec![("Go server".to_string(), go_server.ids("done"))];
    for (n, &pid) in pids.iter().enumerate() {
        let ids = rust_runs.iter().filter(|(p, _)| *p == pid);
        by_process.push((
            format!("Rust worker {} (pid {pid})", n + 1),
            ids.map(|(_, id)| id.clone()).collect(),
        ));
    }
    let done = [
        (Side::Go, go_server.ids("done")),
        (
            Side::Rust,
            rust_runs.into_iter().map(|(_, id)| id).collect(),
        ),
    ]
    .into();

    let first_stopped = matches!(stop, Some(Stop::Term(Side::Rust) | Stop::KillRust));
    for (n, worker) in workers.iter_mut().enumerate() {
        if !(n == 0 && first_stopped) {
            stop_worker(worker, Duration::from_secs(35));
        }
    }
    if term != Some(Side::Go) {
        go_server.stop(Duration::from_secs(15));
    }
    Shared {
        enqueued,
        done,
        by_process,
        interrupted,
        killed,
        counts,
        since,
    }
}

impl Shared {
    /// Completed runs per task id, over all processes.
    fn runs_per_id(&self) -> BTreeMap<&str, usize> {
        let mut runs = BTreeMap::new();
        for id in self.done.values().flatten() {
            *runs.entry(id.as_str()).or_default() += 1;
        }
        runs
    }

    /// The ids that ran more than once, with their number of runs.
    fn run_more_than_once(&self) -> BTreeMap<&str, usize> {
        self.runs_per_id()
            .into_iter()
            .filter(|(_, runs)| *runs > 1)
            .collect()
    }

    /// Each process's number of completed runs.
    fn shares(&self) -> Vec<(&str, usize)> {
        self.by_process
            .iter()
            .map(|(name, ids)| (name.as_str(), ids.len()))
            .collect()
    }

    /// Prints each process's share of the tasks.
    fn print_shares(&self) {
        let tasks = self.enqueued.len();
        for (name, runs) in self.shares() {
            let percent = 100.0 * runs as f64 / tasks as f64;
            eprintln!("{name} ran {runs} of the {tasks} tasks ({percent:.1}%)");
        }
    }

    /// Asserts that every enqueued task ran, and prints each process's share.
    fn assert_nothing_lost(&self) {
        let runs = self.runs_per_id();
        let ran: BTreeSet<&str> = runs.keys().copied().collect();
        let enqueued: BTreeSet<&str> = self.enqueued.keys().map(String::as_str).collect();
        self.print_shares();
        let lost = enqueued.difference(&ran).count();
        let strangers = ran.difference(&enqueued).count();
        assert_eq!(
            (lost, strangers),
            (0, 0),
            "(enqueued ids that never ran, ids that ran but were not enqueued)"
        );
    }

    /// Asserts the queue's processed counters: every task completed once
    /// (both sides count their runs in Go's counters, under Go's keys), and
    /// none failed.
    fn assert_counted_once_each(&self) {
        assert_counters(&self.counts, self.since, self.enqueued.len(), 0);
    }

    /// Asserts that the Go server and the Rust workers each ran some tasks.
    fn assert_both_sides_ran(&self) {
        let (go, rust) = (self.done[&Side::Go].len(), self.done[&Side::Rust].len());
        assert!(
            go > 0 && rust > 0,
            "one side ran nothing: Go {go}, Rust {rust}"
        );
    }
}

/// 20,000 tasks on one queue served by a Go server and three Rust worker
/// processes, 10 handlers each, with nothing stopped or crashing: every
/// task runs exactly once (every recorded run of every process is counted,
/// per task id), Go's counters count each once, and each of the four
/// processes runs a fair-ish share, at least 10% of the tasks (a fair
/// share is 25%).
#[test]
#[ignore = "builds a generated project"]
fn twenty_thousand_tasks_shared_by_go_and_three_rust_workers_run_exactly_once() {
    if go_peer("asynqpeer").is_none() {
        return;
    }
    project();
    let run = Run {
        tasks: 20_000,
        rust_workers: 3,
        stop: None,
    };
    let shared = share_the_queue(&run, valkey());

    shared.assert_nothing_lost();
    let twice = shared.run_more_than_once();
    assert!(
        twice.is_empty(),
        "{} tasks ran more than once: {twice:?}",
        twice.len()
    );
    let runs: usize = shared.runs_per_id().values().sum();
    assert_eq!(runs, run.tasks, "completed runs over all processes");
    shared.assert_counted_once_each();
    let floor = run.tasks / 10;
    let shares = shared.shares();
    let short: Vec<&(&str, usize)> = shares.iter().filter(|(_, runs)| *runs < floor).collect();
    assert!(
        short.is_empty(),
        "processes that ran less than 10% ({floor}) of the {} tasks: {short:?} (all: {shares:?})",
        run.tasks
    );
}

/// SIGTERM to one side while it runs a task that outlasts its shutdown
/// timeout: nothing is lost, and each task cut short goes back to the queue
/// (no lease is left to expire) and is finished by the other side.
///
/// A graceful stop repeats nothing: the stopped side finishes the short
/// tasks it holds and records each in Valkey before it exits, and a task
/// cut short at the shutdown timeout never recorded a completed run (the
/// handlers record a run only at its end, and a handler cut short is
/// dropped before that). So this asserts that no task runs to completion
/// twice, on either side or across them: every task exactly once.
fn sigterm_to_one_side_midway(side: Side) {
    let run = Run {
        tasks: 10_000,
        rust_workers: 1,
        stop: Some(Stop::Term(side)),
    };
    let shared = share_the_queue(&run, RedisServer::start());

    shared.assert_nothing_lost();
    shared.assert_both_sides_ran();
    let other = side.other();
    assert!(!shared.interrupted.is_empty(), "nothing was cut short");
    for id in &shared.interrupted {
        assert!(
            shared.done[&other].contains(id),
            "{id} was cut short on {side:?} and never finished on {other:?}"
        );
    }
    let twice = shared.run_more_than_once();
    eprintln!(
        "cut short on {side:?} and finished on {other:?}: {}; ran twice: {twice:?}",
        shared.interrupted.len()
    );
    let on = |id: &str, s: Side| shared.done[&s].iter().filter(|d| *d == id).count();
    let twice_by_side: Vec<(&str, usize, usize)> = twice
        .keys()
        .map(|&id| (id, on(id, side), on(id, other)))
        .collect();
    assert!(
        twice.is_empty(),
        "tasks that ran more than once after SIGTERM to {side:?} \
         (id, runs on {side:?}, runs on {other:?}): {twice_by_side:?}"
    );
    shared.assert_counted_once_each();
}

/// SIGKILL to the Rust worker midway through 10,000 tasks it shares with a
/// Go server (10 handlers each, every task sleeping 80 ms): no shutdown,
/// so the tasks it held stay active under leases nobody extends. The Go
/// server runs the rest, and its own recoverer takes the held tasks back
/// once their leases are 30 s past expiry (60-90 s after the kill, see
/// [`share_the_queue`]): each waits in `retry` with one retry and asynq's
/// lease-expired error, and then completes on Go. Every task completes.
///
/// What is allowed to repeat, and this asserts: only a task the killed
/// worker held (its lease is among those Go recovered: at most its 10
/// handler slots and the 10 tasks it may take ahead for slots whose
/// completions are on their way) whose handler the killed worker had
/// started and run to completion before the kill (both recorded under its
/// pid: the handler finished, but the worker died before Valkey recorded
/// the completion); at most 10 such tasks (its concurrency), each run
/// exactly twice, once on the killed worker and once on Go after the
/// recovery. Every other task runs exactly once; no held task
/// was started on Go before the recovery; every task the killed worker had
/// started and not finished is among the held ones and finished on Go; and
/// Go's counters count each task's completion once plus, for each held
/// task, the recoverer's retry as processed and failed.
///
/// Only this direction: the other (the Go server killed, the Rust worker's
/// recoverer taking its tasks back) would need the generated worker's
/// recoverer interval shortened, and its environment has no setting for it
/// (the consumer's 1 min default); a single task recovered both ways is
/// [`a_killed_sides_leased_task_is_recovered_by_the_other_side`].
#[test]
#[ignore = "builds a generated project"]
fn sigkill_to_the_rust_worker_midway_loses_nothing_and_go_recovers_its_leased_tasks() {
    if go_peer("asynqpeer").is_none() {
        return;
    }
    project();
    let run = Run {
        tasks: 10_000,
        rust_workers: 1,
        stop: Some(Stop::KillRust),
    };
    let shared = share_the_queue(&run, valkey());
    let killed = shared.killed.as_ref().expect("the Rust worker was killed");

    shared.assert_nothing_lost();
    shared.assert_both_sides_ran();
    let on = |id: &str, side: Side| shared.done[&side].iter().filter(|d| *d == id).count();
    let twice = shared.run_more_than_once();
    eprintln!(
        "the killed Rust worker held {} tasks: {:?}; {} of them started and not finished; \
         ran twice: {twice:?}",
        killed.held.len(),
        killed.held,
        shared.interrupted.len()
    );
    assert!(
        killed.held.len() <= 20,
        "more tasks recovered than the killed worker's 10 handler slots and 10 taken ahead: {:?}",
        killed.held
    );
    assert!(
        twice.len() <= 10,
        "more tasks ran twice than the killed worker's 10 handler slots: {twice:?}"
    );
    for id in &shared.interrupted {
        assert!(
            killed.held.contains(id),
            "{id} was running on the killed Rust worker, and its lease was not recovered"
        );
    }
    for id in &killed.held {
        assert_eq!(
            on(id, Side::Go),
            1,
            "{id}: held by the killed worker, runs on Go"
        );
    }
    for (&id, &runs) in &twice {
        assert_eq!(
            (runs, on(id, Side::Rust), on(id, Side::Go)),
            (2, 1, 1),
            "{id}: (runs, on the killed Rust worker, on Go)"
        );
        assert!(
            killed.held.contains(id),
            "{id} ran twice but the killed Rust worker did not hold it"
        );
        assert!(
            killed.started.contains(id) && killed.finished.contains(id),
            "{id} ran twice but was not started and finished on the killed worker before the kill"
        );
    }
    let held = killed.held.len();
    assert_counters(&shared.counts, shared.since, run.tasks + held, held);
}

#[test]
#[ignore = "builds a generated project"]
fn sigterm_to_the_rust_worker_midway_loses_nothing_and_go_finishes_its_tasks() {
    if go_peer("asynqpeer").is_none() {
        return;
    }
    project();
    sigterm_to_one_side_midway(Side::Rust);
}

#[test]
#[ignore = "builds a generated project"]
fn sigterm_to_the_go_server_midway_loses_nothing_and_rust_finishes_its_tasks() {
    if go_peer("asynqpeer").is_none() {
        return;
    }
    project();
    sigterm_to_one_side_midway(Side::Go);
}
