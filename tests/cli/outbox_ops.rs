//! The generated `outbox` command against real Postgres and Redis, in one
//! scripted scenario: events published, one listener (`audit`) refusing
//! them until they are archived, one event left unpublished. Each
//! subcommand is checked through its text and JSON output; `replay`
//! delivers the chosen events exactly once more and nothing else;
//! `retry-archived` makes the refusing listener run again; `purge` deletes
//! only old published rows, in batches; `--max-lag` sets the exit code; and
//! every bad argument is a clear error that changes nothing.
//!
//! One project, built once; the worker runs in three short rounds between
//! the commands.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;

use crate::e2e::{Database, build_binaries, migrate, psql};
use crate::support::gpkit;
use crate::worker_e2e::{RedisServer, Worker, free_port, metric, wait_until};

/// `audit` refuses every order while `refused` has a row, giving up at once
/// (SkipRetry, so its task is archived without waiting out 25 retries);
/// otherwise both listeners record each run.
fn listener_body(listener: &str) -> String {
    let refuse = if listener == "audit" {
        r#"    let (refused,): (i64,) = sqlx::query_as("SELECT count(*) FROM refused")
        .fetch_one(ctx.pool())
        .await?;
    if refused > 0 {
        return Err(SkipRetry(format!("order {} refused", event.order_id)).into());
    }
"#
    } else {
        ""
    };
    let imports = if listener == "audit" {
        "ListenerContext, ListenerError, SkipRetry"
    } else {
        "ListenerContext, ListenerError"
    };
    format!(
        r#"//! `{listener}`: a listener of `orderPlaced`, filled in by the test.

use crate::events::order_placed::OrderPlaced;
use kit::worker::listeners::{{{imports}}};

/// Records the run.
pub async fn handle(event: OrderPlaced, ctx: ListenerContext) -> Result<(), ListenerError> {{
{refuse}    sqlx::query("INSERT INTO listener_runs (listener, event_id, order_id) VALUES ($1, $2, $3)")
        .bind("{listener}")
        .bind(ctx.event_id())
        .bind(event.order_id)
        .execute(ctx.pool())
        .await?;
    Ok(())
}}
"#
    )
}

/// The generated project and its binaries' directory, built once for
/// every test here and the console's (`console.rs`).
pub fn built() -> &'static (PathBuf, PathBuf) {
    static BUILT: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    BUILT.get_or_init(project)
}

fn project() -> (PathBuf, PathBuf) {
    let project = crate::e2e::new_shop_in("e2e-outbox-ops", &["--worker"]);
    gpkit(&project)
        .args(["add", "event", "orderPlaced", "--field", "order_id:i64"])
        .args(["--listener", "audit", "--listener", "email"])
        .assert()
        .success();
    for listener in ["audit", "email"] {
        std::fs::write(
            project.join(format!("src/listeners/order_placed/{listener}.rs")),
            listener_body(listener),
        )
        .unwrap();
    }
    let bins = build_binaries(&project);
    (project, bins)
}

/// Runs the `outbox` command, never on a terminal.
struct Ops<'a> {
    bin: PathBuf,
    project: &'a Path,
    db: &'a Database,
    redis: &'a RedisServer,
}

impl Ops<'_> {
    fn run(&self, args: &[&str]) -> Output {
        self.run_with(&[], args)
    }

    /// Runs with `env` on top of the test's environment.
    fn run_with(&self, env: &[(&str, &str)], args: &[&str]) -> Output {
        Command::new(&self.bin)
            .args(args)
            .current_dir(self.project)
            .env_clear()
            .env("DATABASE_URL", self.db.url())
            .env("VALKEY_ADDR", self.redis.addr())
            .env("WORKER_QUEUES", "default=1")
            .env("OUTBOX_RETENTION", "168h")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// Runs and expects exit 0; stdout.
    fn ok(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert_eq!(
            output.status.code(),
            Some(0),
            "outbox {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    /// Runs with `--format json` and expects exit 0; the document.
    fn json(&self, args: &[&str]) -> Value {
        let mut args = args.to_vec();
        args.extend(["--format", "json"]);
        serde_json::from_str(&self.ok(&args)).unwrap()
    }

    /// Runs and expects exit `code`, nothing on stdout; stderr.
    fn fails(&self, code: i32, args: &[&str]) -> String {
        let output = self.run(args);
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(
            output.status.code(),
            Some(code),
            "outbox {args:?}: {stderr}"
        );
        assert!(output.stdout.is_empty(), "outbox {args:?} printed output");
        stderr
    }
}

/// Everything the commands could change: the table and the queue.
fn state(db: &Database, redis: &RedisServer) -> String {
    let rows = psql(
        &db.url(),
        "SELECT count(*), count(published_at), (SELECT count(*) FROM listener_runs) \
         FROM outbox_events",
    );
    let mut keys = redis
        .cli(&["KEYS", "asynq:{default}:*"])
        .unwrap_or_default();
    for set in ["pending", "active"] {
        let key = format!("asynq:{{default}}:{set}");
        keys.push_str(&redis.cli(&["LRANGE", &key, "0", "-1"]).unwrap_or_default());
    }
    for set in ["scheduled", "retry", "archived", "completed"] {
        let key = format!("asynq:{{default}}:{set}");
        keys.push_str(&redis.cli(&["ZRANGE", &key, "0", "-1"]).unwrap_or_default());
    }
    let mut lines: Vec<&str> = keys.lines().collect();
    lines.sort_unstable();
    format!("{rows}\n{}", lines.join("\n"))
}

/// The orders each listener ran for, sorted: `audit:1,2 email:1,2`.
pub fn runs(db: &Database) -> String {
    psql(
        &db.url(),
        "SELECT string_agg(listener || ':' || orders, ' ' ORDER BY listener) FROM ( \
           SELECT listener, string_agg(order_id::text, ',' ORDER BY order_id) AS orders \
           FROM listener_runs GROUP BY listener) r",
    )
}

fn count(redis: &RedisServer, command: &str, set: &str) -> String {
    redis
        .cli(&[command, &format!("asynq:{{default}}:{set}")])
        .unwrap_or_default()
}

/// The event id of order `order`.
fn event_id(db: &Database, order: i64) -> String {
    psql(
        &db.url(),
        &format!("SELECT event_id FROM outbox_events WHERE payload->>'order_id' = '{order}'"),
    )
}

/// Runs the worker until `done`, checks its per-listener counters, and
/// stops it.
fn worker_round(
    bins: &Path,
    db: &Database,
    redis: &RedisServer,
    what: &str,
    done: impl Fn() -> bool,
    counters: &[(&str, &str, u64)],
) {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let env = [
        ("WORKER_QUEUES", "default=1"),
        ("WORKER_METRICS_ADDR", addr.as_str()),
        ("OUTBOX_POLL_INTERVAL", "100ms"),
    ];
    let mut worker = Worker::start_binary(&bins.join("worker"), db, redis, &env);
    wait_until(Duration::from_secs(60), what, || {
        done() && count(redis, "LLEN", "pending") == "0" && count(redis, "LLEN", "active") == "0"
    });
    for (outcome, listener, expected) in counters {
        let name = format!(
            "outbox_listener_{outcome}_total{{event=\"orderPlaced\",listener=\"{listener}\"}}"
        );
        assert_eq!(metric(port, &name), Some(*expected), "{name}");
    }
    worker.signal("-TERM");
    assert_eq!(
        worker.wait(Duration::from_secs(35)),
        Some(0),
        "{}",
        worker.log()
    );
}

#[test]
#[ignore = "builds a generated project"]
fn the_outbox_command_follows_replays_retries_and_purges_events() {
    let (project, bins) = built();
    let db = Database::create("gpkit_outbox_ops");
    migrate(project, &db, &["up"]);
    psql(
        &db.url(),
        "CREATE TABLE listener_runs (listener text NOT NULL, event_id uuid NOT NULL, \
         order_id bigint NOT NULL); CREATE TABLE refused (x int); INSERT INTO refused VALUES (1); \
         INSERT INTO outbox_events (event_id, event_name, payload, metadata) \
         SELECT gen_random_uuid(), 'orderPlaced', jsonb_build_object('order_id', n), \
           jsonb_build_object('traceparent', \
             '00-4bf92f3577b34da6a3ce929d0e0e473' || n || '-00f067aa0ba902b7-01') \
         FROM generate_series(1, 3) n; \
         INSERT INTO outbox_events (event_id, event_name, payload) \
         VALUES (gen_random_uuid(), 'orderShipped', '{\"order_id\": 10}')",
    );
    let redis = RedisServer::start();
    let ops = Ops {
        bin: bins.join("outbox"),
        project,
        db: &db,
        redis: &redis,
    };

    // Round 1: published; `email` ran, `audit` refused and was archived.
    worker_round(
        bins,
        &db,
        &redis,
        "three orders archived for audit",
        || count(&redis, "ZCARD", "archived") == "3" && runs(&db) == "email:1,2,3",
        &[("succeeded", "email", 3), ("failed", "audit", 3)],
    );
    // Order 4, unpublished, created 40 s ago: the relay's lag `status`
    // reports.
    psql(
        &db.url(),
        "INSERT INTO outbox_events (event_id, event_name, payload, created_at) \
         VALUES (gen_random_uuid(), 'orderPlaced', '{\"order_id\": 4}', \
                 now() - interval '40 seconds')",
    );
    let (one, two, three, four) = (
        event_id(&db, 1),
        event_id(&db, 2),
        event_id(&db, 3),
        event_id(&db, 4),
    );

    // status: the lag of the unpublished event, and the queue by state.
    let status = ops.json(&["status"]);
    assert_eq!(status["outbox"]["unpublished"], 1, "{status}");
    assert_eq!(status["outbox"]["published_last_minute"], 4);
    assert_eq!(status["outbox"]["published_last_hour"], 4);
    assert_eq!(status["outbox"]["due_for_cleanup"], 0);
    assert!(status["outbox"]["table_bytes"].as_i64().unwrap() > 0);
    // 40 s, plus the moments between the insert and the command.
    let lag = status["outbox"]["oldest_unpublished_age_seconds"]
        .as_f64()
        .unwrap();
    assert!((40.0..45.0).contains(&lag), "the lag of order 4: {lag} s");
    assert_eq!(status["retention_seconds"], 604_800);
    let default = &status["queues"][0];
    assert_eq!(default["queue"], "default");
    // 4 event tasks (orderShipped has no listener) + 3 email tasks.
    assert_eq!(
        (
            &default["archived"],
            &default["completed"],
            &default["pending"]
        ),
        (&Value::from(3), &Value::from(7), &Value::from(0))
    );
    assert_eq!(status["lag_exceeded"], false);
    let text = ops.ok(&["status"]);
    assert!(text.contains("unpublished            1"), "{text}");
    assert!(text.contains("published last minute  4"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()
                == ["default", "0", "0", "0", "0", "3", "7"]),
        "{text}"
    );

    // --max-lag: exit 2 above the 40 s lag, 0 below.
    let lagging = ops.run(&["status", "--max-lag", "30s", "--format", "json"]);
    assert_eq!(lagging.status.code(), Some(2));
    let lagging: Value = serde_json::from_slice(&lagging.stdout).unwrap();
    assert_eq!(
        (&lagging["lag_exceeded"], &lagging["max_lag_seconds"]),
        (&Value::from(true), &Value::from(30.0))
    );
    assert!(
        ops.ok(&["status", "--max-lag", "1h"])
            .contains("max lag 1h: ok")
    );

    // show: the row, the event task and each listener's task.
    let shown = ops.json(&["show", &one]);
    assert_eq!(shown["event"]["id"], one.as_str());
    assert_eq!(shown["event"]["name"], "orderPlaced");
    assert_eq!(
        shown["event"]["payload"],
        serde_json::json!({"order_id": 1})
    );
    assert!(shown["event"]["published_at"].is_string());
    assert_eq!(shown["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4731");
    let event_task = &shown["event_tasks"][0];
    assert_eq!(
        (&event_task["id"], &event_task["type"], &event_task["state"]),
        (
            &Value::from(one.as_str()),
            &Value::from("event:orderPlaced"),
            &Value::from("completed")
        )
    );
    let listeners = shown["listener_tasks"].as_array().unwrap();
    assert_eq!(listeners.len(), 2, "{shown}");
    let (audit, email) = (&listeners[0], &listeners[1]);
    assert_eq!(
        (&audit["listener"], &audit["state"], &audit["type"]),
        (
            &Value::from("audit"),
            &Value::from("archived"),
            &Value::from("listener:orderPlaced:audit")
        )
    );
    assert_eq!(audit["last_error"], "order 1 refused (not retried)");
    assert!(audit["archived_at"].is_string());
    assert_eq!(
        (&email["listener"], &email["state"]),
        (&Value::from("email"), &Value::from("completed"))
    );
    assert_ne!(audit["id"], email["id"]);
    // Each listener's retry policy: the kit's default, or what
    // `WORKER_RETRIES` says where the command runs.
    assert_eq!(audit["policy"], "retries:25,timeout:30m,backoff:asynq");
    let overridden = ops.run_with(
        &[(
            "WORKER_RETRIES",
            "orderPlaced.email=retries:3,backoff:fixed:20s",
        )],
        &["show", &one, "--format", "json"],
    );
    assert!(overridden.status.success(), "{overridden:?}");
    let overridden: Value = serde_json::from_slice(&overridden.stdout).unwrap();
    assert_eq!(
        (
            &overridden["listener_tasks"][0]["policy"],
            &overridden["listener_tasks"][1]["policy"]
        ),
        (
            &Value::from("retries:25,timeout:30m,backoff:asynq"),
            &Value::from("retries:3,timeout:30m,backoff:fixed:20s")
        )
    );
    let text = ops.ok(&["show", &one]);
    for expected in [
        format!("event      {one} orderPlaced"),
        "trace id   4bf92f3577b34da6a3ce929d0e0e4731".to_string(),
        "payload    {\"order_id\":1}".to_string(),
        "order 1 refused (not retried)".to_string(),
        "policy retries:25,timeout:30m,backoff:asynq".to_string(),
    ] {
        assert!(text.contains(&expected), "{expected:?} in\n{text}");
    }
    assert!(
        text.lines()
            .any(|l| l.starts_with("event task") && l.contains("completed")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("listener audit") && l.contains("archived")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("listener email") && l.contains("completed")),
        "{text}"
    );
    let pending = ops.json(&["show", &four]);
    assert_eq!(pending["event"]["published_at"], Value::Null);
    assert_eq!(pending["event_tasks"][0]["state"], "missing");
    assert!(
        ops.ok(&["show", &four])
            .contains("not yet (waiting for the relay)")
    );

    // list: filters, newest first.
    let ids = |list: &Value| -> Vec<String> {
        list["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(ids(&ops.json(&["list", "--unpublished"])), [four.as_str()]);
    assert_eq!(
        ids(&ops.json(&["list", "--published", "--name", "orderPlaced"])),
        [three.as_str(), two.as_str(), one.as_str()]
    );
    assert_eq!(ids(&ops.json(&["list", "--limit", "2"])).len(), 2);
    assert_eq!(ids(&ops.json(&["list", "--since", "1h"])).len(), 5);
    assert!(ids(&ops.json(&["list", "--until", "1h"])).is_empty());
    let listed = ops.json(&["list", "--name", "orderShipped"]);
    assert_eq!(listed["events"][0]["name"], "orderShipped");
    assert!(listed["events"][0]["published_at"].is_string());
    let text = ops.ok(&["list"]);
    assert_eq!(text.lines().count(), 6, "a header and 5 events:\n{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with(&four) && l.trim_end().ends_with('-')),
        "{text}"
    );

    // Bad arguments: clear errors, nothing changed.
    let before = state(&db, &redis);
    let unknown = "0193a5c2-5b6e-7d1f-9a2b-3c4d5e6f7a8b";
    let err = ops.fails(1, &["show", unknown]);
    assert!(
        err.contains(&format!("no event {unknown} in outbox_events")),
        "{err}"
    );
    let err = ops.fails(1, &["replay", unknown, &one, "--yes"]);
    assert!(
        err.contains(&format!("no event {unknown}")) && err.contains("nothing was replayed"),
        "{err}"
    );
    let err = ops.fails(1, &["replay", &four, "--yes"]);
    assert!(err.contains("is not published yet"), "{err}");
    let err = ops.fails(1, &["replay", &one, "--yes", "--listener", "sms"]);
    assert!(
        err.contains("has no listener `sms`") && err.contains("audit, email"),
        "{err}"
    );
    let err = ops.fails(1, &["replay", &one]);
    assert!(err.contains("pass --yes"), "{err}");
    let err = ops.fails(64, &["show", "order-1"]);
    assert!(err.contains("invalid value 'order-1'"), "{err}");
    let err = ops.fails(64, &["list", "--since", "yesterday"]);
    assert!(
        err.contains("`yesterday` is not a time; expected a duration such as 30m"),
        "{err}"
    );
    let err = ops.fails(
        64,
        &[
            "replay",
            &one,
            "--name",
            "orderPlaced",
            "--since",
            "1h",
            "--yes",
        ],
    );
    assert!(err.contains("cannot be used with"), "{err}");
    let err = ops.fails(64, &["replay", "--name", "orderPlaced", "--yes"]);
    assert!(err.contains("--since"), "{err}");
    let err = ops.fails(64, &["purge", "--published-before", "last week", "--yes"]);
    assert!(err.contains("`last week` is not a time"), "{err}");
    let err = ops.fails(
        64,
        &["purge", "--published-before", "7d", "--batch-size", "0"],
    );
    assert!(err.contains("--batch-size"), "{err}");
    let err = ops.fails(64, &["status", "--max-lag", "soon"]);
    assert!(err.contains("`soon` is not a duration"), "{err}");
    assert_eq!(
        state(&db, &redis),
        before,
        "a bad argument changed something"
    );

    // Without Valkey, `list` still works and `status` says what it needs.
    let offline = [("VALKEY_ADDR", "127.0.0.1:1")];
    let listed = ops.run_with(&offline, &["list", "--unpublished"]);
    assert_eq!(listed.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&listed.stdout).contains(&four));
    let status = ops.run_with(&offline, &["status"]);
    let err = String::from_utf8_lossy(&status.stderr);
    assert_eq!(status.status.code(), Some(1), "{err}");
    assert!(
        err.contains("this command needs Valkey") && err.contains("127.0.0.1:1"),
        "{err}"
    );

    // replay: order 2 to every listener, order 3 to `email` alone, and the
    // orderShipped events by name; new task ids, the same event ids.
    let replayed = ops.json(&["replay", &two, "--yes"]);
    let task = &replayed["replayed"][0];
    assert_eq!(
        (&task["event_id"], &task["type"], &task["queue"]),
        (
            &Value::from(two.as_str()),
            &Value::from("event:orderPlaced"),
            &Value::from("default")
        )
    );
    assert_ne!(
        task["task_id"],
        two.as_str(),
        "a replay needs a new task id"
    );
    let text = ops.ok(&["replay", &three, "--listener", "email", "--yes"]);
    assert!(
        text.starts_with(&format!(
            "replayed {three} as listener:orderPlaced:email task "
        )),
        "{text}"
    );
    let by_name = ops.json(&["replay", "--name", "orderShipped", "--since", "1h", "--yes"]);
    assert_eq!(
        by_name["replayed"].as_array().unwrap().len(),
        1,
        "{by_name}"
    );
    let none = ops.ok(&[
        "replay",
        "--name",
        "orderPlaced",
        "--since",
        "1h",
        "--until",
        "2h",
        "--yes",
    ]);
    assert_eq!(none.trim(), "no published event matches; nothing replayed");

    // Round 2: each replay delivered once, and order 4 published and
    // delivered; `audit` still refuses orders 2 (its replay) and 4.
    worker_round(
        bins,
        &db,
        &redis,
        "the replays are delivered",
        || count(&redis, "ZCARD", "archived") == "5" && runs(&db) == "email:1,2,2,3,3,4",
        &[("succeeded", "email", 3), ("failed", "audit", 2)],
    );
    assert_eq!(
        ops.json(&["show", &two])["listener_tasks"][1]["state"],
        "completed"
    );

    // retry-archived: none for `email`; `audit`'s five run again once the
    // refusal is lifted.
    assert_eq!(
        ops.json(&["retry-archived", "--listener", "email"])["retried"],
        serde_json::json!([])
    );
    assert!(
        ops.json(&[
            "retry-archived",
            "--since",
            "2026-01-01T00:00:00Z",
            "--listener",
            "orderShipped:audit"
        ])["retried"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    psql(&db.url(), "DELETE FROM refused");
    let retried = ops.json(&[
        "retry-archived",
        "--listener",
        "orderPlaced:audit",
        "--since",
        "1h",
    ]);
    let retried = retried["retried"].as_array().unwrap();
    assert_eq!(retried.len(), 5, "{retried:?}");
    assert!(retried.iter().all(|t| {
        t["type"] == "listener:orderPlaced:audit"
            && t["last_error"]
                .as_str()
                .unwrap()
                .ends_with("refused (not retried)")
    }));
    assert_eq!(count(&redis, "ZCARD", "archived"), "0");
    assert_eq!(count(&redis, "LLEN", "pending"), "5");

    // Round 3: `audit` runs each once, order 2 twice (its replay).
    worker_round(
        bins,
        &db,
        &redis,
        "audit runs again",
        || runs(&db) == "audit:1,2,2,3,4 email:1,2,2,3,3,4",
        &[("succeeded", "audit", 5)],
    );
    assert_eq!(count(&redis, "ZCARD", "archived"), "0");
    assert_eq!(count(&redis, "ZCARD", "retry"), "0");
    assert_eq!(
        ops.json(&["show", &one])["listener_tasks"][0]["state"],
        "completed"
    );

    // purge: only rows published before the cutoff, in batches of 1; an
    // old unpublished row stays.
    psql(
        &db.url(),
        &format!(
            "UPDATE outbox_events SET published_at = now() - interval '8 days' \
             WHERE event_id IN ('{one}', '{two}'); \
             INSERT INTO outbox_events (event_id, event_name, payload, created_at) \
             VALUES (gen_random_uuid(), 'orderPlaced', '{{\"order_id\": 5}}', \
                     now() - interval '30 days')"
        ),
    );
    assert_eq!(ops.json(&["status"])["outbox"]["due_for_cleanup"], 2);
    let purged = ops.json(&[
        "purge",
        "--published-before",
        "7d",
        "--batch-size",
        "1",
        "--yes",
    ]);
    assert_eq!(
        (&purged["deleted"], &purged["batches"]),
        (&Value::from(2), &Value::from(3))
    );
    let text = ops.ok(&["purge", "--published-before", "7d", "--yes"]);
    assert!(
        text.starts_with("deleted 0 event(s) published before "),
        "{text}"
    );
    assert_eq!(
        psql(
            &db.url(),
            "SELECT payload->>'order_id' FROM outbox_events ORDER BY id"
        ),
        "3\n10\n4\n5",
        "orders 1 and 2 are purged; recent and unpublished rows stay"
    );
}

/// On a terminal, `replay` asks first; `n` queues nothing.
#[cfg(unix)]
#[test]
#[ignore = "builds a generated project"]
fn replay_asks_on_a_terminal() {
    use rexpect::session::spawn_command;

    let (project, bins) = built();
    let db = Database::create("gpkit_outbox_ask");
    migrate(project, &db, &["up"]);
    psql(
        &db.url(),
        "INSERT INTO outbox_events (event_id, event_name, payload, published_at) \
         VALUES ('0193a5c2-5b6e-7d1f-9a2b-3c4d5e6f7a8b', 'orderPlaced', '{\"order_id\": 1}', now())",
    );
    let redis = RedisServer::start();
    let mut command = Command::new(bins.join("outbox"));
    command
        .args(["replay", "0193a5c2-5b6e-7d1f-9a2b-3c4d5e6f7a8b"])
        .current_dir(project)
        .env("DATABASE_URL", db.url())
        .env("VALKEY_ADDR", redis.addr())
        .env("TERM", "dumb");
    let mut session = spawn_command(command, Some(20_000)).unwrap();
    session
        .exp_string("replay 1 event(s) through queue(s) default [y/N]")
        .unwrap();
    session.send_line("n").unwrap();
    session.exp_string("nothing replayed").unwrap();
    session.exp_eof().unwrap();
    assert_eq!(count(&redis, "LLEN", "pending"), "0");
}
