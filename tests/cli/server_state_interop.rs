//! The generated worker as Go asynq v0.26's `Inspector` sees it (what
//! asynqmon shows): its `ServerInfo` and `WorkerInfo` on the Servers page,
//! and `CancelProcessing` (asynqmon's Cancel) stopping a running listener
//! for good (a kit worker does not retry a cancelled run).
//! The Go side is `tests/interop/go/cmd/inspectpeer`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::e2e::{Database, build_binaries, migrate};
use crate::go_peers::go_peer;
use crate::support::gpkit;
use crate::worker_e2e::{RedisServer, Worker, wait_until};

/// A listener that runs until it is cancelled.
const ENDLESS_LISTENER: &str = r#"//! `endless`: a listener of `orderPlaced` that never finishes by itself.

use crate::events::order_placed::OrderPlaced;
use kit::worker::listeners::{ListenerContext, ListenerError};

/// Waits forever: only a cancellation or shutdown ends it.
pub async fn handle(_event: OrderPlaced, _ctx: ListenerContext) -> Result<(), ListenerError> {
    std::future::pending::<()>().await;
    Ok(())
}
"#;

/// A worker project with the event `orderPlaced` and its listener `endless`,
/// built once (and ahead in scripts/test's run: `SHARED_PROJECTS`).
pub(crate) fn project_with_an_endless_listener() -> &'static Path {
    static PROJECT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PROJECT.get_or_init(endless_project)
}

fn endless_project() -> PathBuf {
    let project = crate::e2e::new_shop_in("e2e-server-state", &[]);
    gpkit(&project)
        .args(["add", "event", "orderPlaced", "--field", "order_id:i64"])
        .args(["--listener", "endless"])
        .assert()
        .success();
    std::fs::write(
        project.join("src/listeners/order_placed/endless.rs"),
        ENDLESS_LISTENER,
    )
    .unwrap();
    build_binaries(&project);
    project
}

/// Runs the Go peer against `redis`; its JSON output.
fn inspect(peer: &Path, redis: &RedisServer, args: &[&str]) -> Value {
    let output = Command::new(peer)
        .arg(redis.addr())
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "inspectpeer {args:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    if output.stdout.is_empty() {
        return Value::Null;
    }
    serde_json::from_slice(&output.stdout).unwrap()
}

/// The entry of `Inspector.Servers()` for the process `pid`.
fn server_of(peer: &Path, redis: &RedisServer, pid: u32) -> Option<Value> {
    let servers = inspect(peer, redis, &["servers"]);
    servers
        .as_array()
        .unwrap()
        .iter()
        .find(|server| server["PID"] == pid)
        .cloned()
}

/// A time of Go's JSON (RFC 3339) in Unix seconds.
fn unix_seconds(time: &Value) -> i64 {
    let text = time.as_str().unwrap();
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|err| panic!("not an RFC 3339 time: {text}: {err}"))
        .unix_timestamp()
}

fn now() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    i64::try_from(since.as_secs()).unwrap()
}

#[test]
#[ignore = "builds a generated project"]
fn go_asynq_lists_the_worker_and_cancels_its_running_task() {
    let Some(peer) = go_peer("inspectpeer") else {
        return;
    };
    // Arrange: a worker of the default queue (weight 2), three slots.
    let project = project_with_an_endless_listener();
    let db = Database::create("gpkit_server_state");
    migrate(project, &db, &["up"]);
    let redis = RedisServer::start();
    let started = now();
    let mut worker = Worker::start_binary(
        &project.join(".bin/worker"),
        &db,
        &redis,
        &[("WORKER_QUEUES", "default=2"), ("WORKER_CONCURRENCY", "3")],
    );
    let pid = worker.pid();

    // Act: Go enqueues a listener task; the worker runs it.
    let task_id = format!("0192aaaa-bbbb-7ccc-8ddd-{:012x}", now());
    let envelope = serde_json::json!({
        "id": task_id,
        "name": "orderPlaced",
        "payload": {"order_id": 7},
        "occurred_at": "2026-11-30T08:00:00Z",
    });
    inspect(
        &peer,
        &redis,
        &[
            "enqueue",
            "default",
            "listener:orderPlaced:endless",
            &task_id,
            &envelope.to_string(),
        ],
    );
    wait_until(
        Duration::from_secs(30),
        "Go's Inspector lists the worker running the task",
        || {
            server_of(&peer, &redis, pid)
                .is_some_and(|server| server["ActiveWorkers"].as_array().unwrap().len() == 1)
        },
    );
    let server = server_of(&peer, &redis, pid).unwrap();

    // Assert: the ServerInfo and WorkerInfo, as Go decodes them.
    assert!(!server["Host"].as_str().unwrap().is_empty(), "{server}");
    assert_eq!(server["ID"].as_str().unwrap().len(), 36, "a UUID: {server}");
    assert_eq!(server["Concurrency"], 3, "{server}");
    assert_eq!(server["Queues"], serde_json::json!({"default": 2}));
    assert_eq!(server["Status"], "active");
    let since_start = unix_seconds(&server["Started"]) - started;
    assert!((-1..=60).contains(&since_start), "{server}");
    let running = &server["ActiveWorkers"][0];
    assert_eq!(running["TaskID"], task_id.as_str());
    assert_eq!(running["TaskType"], "listener:orderPlaced:endless");
    assert_eq!(running["Queue"], "default");
    let budget = unix_seconds(&running["Deadline"]) - unix_seconds(&running["Started"]);
    assert!(
        (1799..=1800).contains(&budget),
        "Go's 30 min timeout: {running}"
    );

    // Act: asynqmon's Cancel.
    inspect(&peer, &redis, &["cancel", &task_id]);

    // Assert: on a kit worker a cancelled run is final (a Go server would
    // retry it): the task is deleted, not retried, and recorded as
    // cancelled, not failed.
    let task_key = format!("asynq:{{default}}:t:{task_id}");
    wait_until(Duration::from_secs(15), "the task is cancelled", || {
        redis.cli(&["EXISTS", &task_key]).as_deref() == Some("0")
    });
    let recorded = crate::sql::psql(
        &db.url(),
        &format!("SELECT listener, state FROM listener_cancellations WHERE task_id = '{task_id}'"),
    );
    assert_eq!(recorded.trim(), "endless|active", "{}", worker.log());
    let failed = crate::sql::psql(&db.url(), "SELECT count(*) FROM listener_failures");
    assert_eq!(failed.trim(), "0");
    wait_until(
        Duration::from_secs(15),
        "the next heartbeat shows no running task",
        || {
            server_of(&peer, &redis, pid)
                .is_some_and(|server| server["ActiveWorkers"].as_array().is_none_or(Vec::is_empty))
        },
    );

    // Shutdown removes the worker from the list at once.
    worker.signal("-TERM");
    assert_eq!(worker.wait(Duration::from_secs(30)), Some(0));
    assert_eq!(server_of(&peer, &redis, pid), None, "{}", worker.log());
}
