//! `gpkit new project --example`: the orders slice works end to end (an
//! order posted over HTTP is stored with its event and its reminder for a
//! day later, the worker relays the event, and the `confirm` listener's
//! confirmation shows in `GET /orders/{id}`),
//! bad input gets a 400 with a JSON error, and the project is what the
//! commands make, so an upgrade finds nothing to do.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::e2e::{Database, build_and_test, cargo_failing, migrate, psql};
use crate::support::free_port;
use crate::support::gpkit;
use crate::worker_e2e::{RedisServer, Worker, metric, wait_until};

/// `method path` on `addr` with an optional JSON body: the status and the
/// body, or `None` while nothing answers.
pub fn request(addr: &str, method: &str, path: &str, json: Option<&str>) -> Option<(u16, String)> {
    request_with_headers(addr, method, path, json, &[])
}

/// [`request`], with more request headers.
pub fn request_with_headers(
    addr: &str,
    method: &str,
    path: &str,
    json: Option<&str>,
    headers: &[(&str, &str)],
) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(addr).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    let body = json.unwrap_or("");
    let mut extra: String = headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect();
    if json.is_some() {
        extra.insert_str(0, "Content-Type: application/json\r\n");
    }
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{extra}\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n")?.1.to_string();
    Some((status, body))
}

/// Starts the example's server (on a free port) and worker on `db` and
/// `redis`, and waits for the server to answer: its address, both, and the
/// port of the worker's metrics.
fn start_slice(
    bins: &std::path::Path,
    dir: &std::path::Path,
    db: &Database,
    redis: &RedisServer,
) -> (String, Server, Worker, u16) {
    let addr = format!("127.0.0.1:{}", free_port());
    let server = Server(
        Command::new(bins.join("server"))
            .current_dir(dir)
            .env_clear()
            .env("DATABASE_URL", db.url())
            .env("VALKEY_ADDR", redis.addr())
            .env("HTTP_ADDR", &addr)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let metrics_port = free_port();
    let worker = Worker::start_binary(
        &bins.join("worker"),
        db,
        redis,
        &[
            ("WORKER_QUEUES", "default=1"),
            ("WORKER_METRICS_ADDR", &format!("127.0.0.1:{metrics_port}")),
        ],
    );
    wait_until(Duration::from_secs(30), "the server answers", || {
        request(&addr, "GET", "/healthz", None).is_some()
    });
    (addr, server, worker, metrics_port)
}

/// Stops the worker and the server with SIGTERM; both exit cleanly.
fn stop_slice(mut server: Server, mut worker: Worker) {
    worker.signal("-TERM");
    assert_eq!(
        worker.wait(Duration::from_secs(35)),
        Some(0),
        "{}",
        worker.log()
    );
    Command::new("kill")
        .args(["-TERM", &server.0.id().to_string()])
        .status()
        .unwrap();
    assert!(server.0.wait().unwrap().success());
}

/// A server process, killed if the test ends before stopping it.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|err| panic!("not JSON ({err}): {text}"))
}

#[test]
#[ignore = "builds a generated project"]
fn the_example_places_an_order_and_its_listener_confirms_it() {
    let parent = tempfile::tempdir().unwrap();
    gpkit(parent.path())
        .args(["new", "project", "shop", "--example"])
        .assert()
        .success();
    let project = parent.path().join("shop");

    // What `add event` records, and nothing for an upgrade to do.
    let manifest = std::fs::read_to_string(project.join("gpkit.toml")).unwrap();
    for event in [
        "name = \"orderPlaced\"\nlisteners = [\"confirm\"]",
        "name = \"orderReminderDue\"\nlisteners = [\"remind\"]",
    ] {
        assert!(manifest.contains(event), "{manifest}");
    }
    gpkit(&project)
        .args(["upgrade", "templates", "--check"])
        .assert()
        .code(0);

    // A second event and listener, with the test `add event` writes.
    gpkit(&project)
        .args(["add", "event", "orderShipped", "--field", "order_id:uuid"])
        .args(["--listener", "notify"])
        .assert()
        .success();

    // Its own tests, with the example's migration among the project's.
    let (bins, _) = build_and_test(&project);
    the_tests_fail_when_the_slice_breaks(&project);

    let db = Database::create("gpkit_example");
    migrate(&project, &db, &["up"]);
    let redis = RedisServer::start();
    let (addr, server, worker, _) = start_slice(&bins, parent.path(), &db, &redis);

    // Bad input: 400, with what is wrong in a JSON body; nothing stored.
    for bad in [
        r#"{"sku": "", "quantity": 1}"#,
        r#"{"sku": "tea", "quantity": 0}"#,
        r#"{"sku": "tea"}"#,
        "not json",
    ] {
        let (status, body) = request(&addr, "POST", "/orders", Some(bad)).unwrap();
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(json(&body)["error"].is_string(), "{bad}: {body}");
    }
    let (status, body) = request(&addr, "GET", "/orders/not-a-uuid", None).unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(json(&body)["error"].is_string(), "{body}");
    assert_eq!(psql(&db.url(), "SELECT count(*) FROM outbox_events"), "0");

    // An order: stored with its event in one transaction.
    let (status, body) = request(
        &addr,
        "POST",
        "/orders",
        Some(r#"{"sku": "tea", "quantity": 2}"#),
    )
    .unwrap();
    assert_eq!(status, 201, "{body}");
    let order = json(&body);
    let id = order["id"].as_str().unwrap().to_string();
    assert_eq!(
        (order["sku"].as_str(), order["quantity"].as_i64()),
        (Some("tea"), Some(2))
    );
    assert_eq!(
        psql(
            &db.url(),
            "SELECT event_name || ' ' || (payload->>'order_id') FROM outbox_events"
        ),
        format!("orderPlaced {id}")
    );
    // Its reminder waits for a day, where the relay does not look.
    assert_eq!(
        psql(
            &db.url(),
            "SELECT event_name || ' ' || (payload->>'order_id') || ' ' || \
             (due_at - created_at BETWEEN interval '23:59' AND interval '24:00:01') \
             FROM outbox_later"
        ),
        format!("orderReminderDue {id} true")
    );

    // The listener's effect: the order is confirmed, once, on the envelope id.
    wait_until(Duration::from_secs(60), "the order is confirmed", || {
        let (status, body) = request(&addr, "GET", &format!("/orders/{id}"), None).unwrap();
        assert_eq!(status, 200, "{body}");
        json(&body)["confirmed"] == serde_json::Value::Bool(true)
    });
    assert_eq!(
        psql(
            &db.url(),
            "SELECT c.order_id = o.id AND c.event_id = e.event_id \
             FROM order_confirmations c, orders o, outbox_events e"
        ),
        "t"
    );
    let (status, _) = request(
        &addr,
        "GET",
        "/orders/00000000-0000-7000-8000-000000000000",
        None,
    )
    .unwrap();
    assert_eq!(status, 404);

    stop_slice(server, worker);

    wake_ups_survive_a_valkey_outage(&bins, parent.path(), &db);
}

/// The generated tests test something: a listener that fails fails the
/// example's flow test and the new listener's own test, a route that no
/// longer dispatches its event fails the flow test, and one that dispatches
/// the reminder at once instead of a day later fails the reminder's test.
/// Each break is undone.
fn the_tests_fail_when_the_slice_breaks(project: &std::path::Path) {
    let tests = [
        "test",
        "--no-fail-fast",
        "--test",
        "listeners",
        "--test",
        "orders",
    ];
    let listeners = [
        "src/listeners/order_placed/confirm.rs",
        "src/listeners/order_reminder_due/remind.rs",
        "src/listeners/order_shipped/notify.rs",
    ];
    let originals: Vec<String> = listeners
        .iter()
        .map(|path| std::fs::read_to_string(project.join(path)).unwrap())
        .collect();
    for (path, original) in listeners.iter().zip(&originals) {
        let at = original
            .rfind("    Ok(())\n}")
            .expect("a listener's last `Ok(())`");
        let broken = format!(
            "{}    Err(anyhow::anyhow!(\"broken\"))\n}}{}",
            &original[..at],
            &original[at + "    Ok(())\n}".len()..]
        );
        std::fs::write(project.join(path), broken).unwrap();
    }
    let output = cargo_failing(project, &tests);
    for test in [
        "an_order_placed_is_confirmed_by_its_listener ... FAILED",
        "an_orders_reminder_runs_a_day_later_and_not_before ... FAILED",
        "order_reminder_due_remind::remind_handles_an_order_reminder_due ... FAILED",
        "order_shipped_notify::notify_handles_an_order_shipped ... FAILED",
    ] {
        assert!(output.contains(test), "{test} is not in:\n{output}");
    }
    for (path, original) in listeners.iter().zip(&originals) {
        std::fs::write(project.join(path), original).unwrap();
    }

    let route = project.join("src/routes/orders.rs");
    let original = std::fs::read_to_string(&route).unwrap();
    let dispatch = "            kit::dispatch(&mut *tx, &event).await?;\n";
    assert!(original.contains(dispatch), "{original}");
    std::fs::write(&route, original.replace(dispatch, "")).unwrap();
    let output = cargo_failing(project, &tests);
    assert!(
        output.contains("an_order_placed_is_confirmed_by_its_listener ... FAILED"),
        "{output}"
    );

    let later = "kit::dispatch_in(&mut *tx, &reminder, Duration::from_secs(24 * 60 * 60))";
    assert!(original.contains(later), "{original}");
    // At once, and without the import only the delay used.
    let at_once = original
        .replace(later, "kit::dispatch(&mut *tx, &reminder)")
        .replace("use std::time::Duration;\n\n", "");
    std::fs::write(&route, at_once).unwrap();
    let output = cargo_failing(project, &tests);
    for failure in [
        "an_orders_reminder_runs_a_day_later_and_not_before ... FAILED",
        "expected a `orderReminderDue` dispatched for later matching the predicate",
    ] {
        assert!(output.contains(failure), "{failure} is not in:\n{output}");
    }
    std::fs::write(&route, original).unwrap();
}

/// `--example --db sea-orm`: the same slice written with SeaORM entities
/// (the route's transaction is SeaORM's, the listener's `ctx.once` hands a
/// SeaORM transaction) builds cleanly and works end to end, and a replay of
/// the event runs the listener again without confirming the order twice.
#[test]
#[ignore = "builds a generated project"]
fn the_seaorm_example_confirms_an_order_once_however_often_it_arrives() {
    // Kept: seaorm.rs's projects share its kit's build.
    let parent = crate::e2e::kept_dir("seaorm-example");
    gpkit(&parent)
        .args(["new", "project", "shop", "--example", "--db", "sea-orm"])
        .assert()
        .success();
    let project = parent.join("shop");
    gpkit(&project)
        .args(["upgrade", "templates", "--check"])
        .assert()
        .code(0);
    // Its own tests: the flow and the redelivery check on SeaORM too.
    let (bins, _) = build_and_test(&project);

    let db = Database::create("gpkit_example_orm");
    migrate(&project, &db, &["up"]);
    let redis = RedisServer::start();
    let (addr, server, worker, metrics_port) = start_slice(&bins, &parent, &db, &redis);
    let duplicates = r#"outbox_inbox_duplicates_total{event="orderPlaced",listener="confirm"}"#;
    wait_until(Duration::from_secs(30), "no duplicate counted yet", || {
        metric(metrics_port, duplicates) == Some(0)
    });
    let (status, body) = request(
        &addr,
        "POST",
        "/orders",
        Some(r#"{"sku": "", "quantity": 1}"#),
    )
    .unwrap();
    assert_eq!(status, 400, "{body}");

    let (status, body) = request(
        &addr,
        "POST",
        "/orders",
        Some(r#"{"sku": "tea", "quantity": 2}"#),
    )
    .unwrap();
    assert_eq!(status, 201, "{body}");
    let id = json(&body)["id"].as_str().unwrap().to_string();
    wait_until(Duration::from_secs(60), "the order is confirmed", || {
        let (status, body) = request(&addr, "GET", &format!("/orders/{id}"), None).unwrap();
        assert_eq!(status, 200, "{body}");
        json(&body)["confirmed"] == serde_json::Value::Bool(true)
    });
    let event_id = psql(&db.url(), "SELECT event_id FROM outbox_events");

    // A second delivery of the same event: the listener runs, and skips.
    let replay = Command::new(bins.join("outbox"))
        .args(["replay", &event_id, "--yes"])
        .current_dir(&parent)
        .env_clear()
        .env("DATABASE_URL", db.url())
        .env("VALKEY_ADDR", redis.addr())
        .output()
        .unwrap();
    assert!(
        replay.status.success(),
        "{}",
        String::from_utf8_lossy(&replay.stderr)
    );
    // Completed: the event task and the listener task, twice each.
    wait_until(
        Duration::from_secs(60),
        "the replayed listener task ran",
        || {
            redis
                .cli(&["ZCARD", "asynq:{default}:completed"])
                .as_deref()
                == Some("4")
        },
    );
    assert_eq!(
        psql(
            &db.url(),
            "SELECT count(*) || ' ' || (SELECT count(*) FROM inbox_processed) \
             FROM order_confirmations"
        ),
        "1 1"
    );
    assert_eq!(
        psql(
            &db.url(),
            "SELECT count(*) FROM orders WHERE id = (SELECT order_id FROM order_confirmations)"
        ),
        "1"
    );
    // The skipped delivery is counted.
    assert_eq!(metric(metrics_port, duplicates), Some(1));

    stop_slice(server, worker);
}

/// At their defaults (`OUTBOX_WAKE` is not set: `valkey`), the server
/// starts and takes orders while Valkey is down (wake-ups are best-effort),
/// and once Valkey is back a commit wakes the worker's relay at once: with
/// a 60 s poll interval, only a wake-up confirms an order within seconds.
fn wake_ups_survive_a_valkey_outage(bins: &std::path::Path, dir: &std::path::Path, db: &Database) {
    let mut redis = RedisServer::start();
    redis.stop();
    let addr = format!("127.0.0.1:{}", free_port());
    // Killed when the test ends (Drop).
    let _server = Server(
        Command::new(bins.join("server"))
            .current_dir(dir)
            .env_clear()
            .env("DATABASE_URL", db.url())
            .env("VALKEY_ADDR", redis.addr())
            .env("HTTP_ADDR", &addr)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until(
        Duration::from_secs(30),
        "the server answers while Valkey is down",
        || request(&addr, "GET", "/healthz", None).is_some_and(|(status, _)| status == 200),
    );
    let order = |sku: &str| {
        let (status, body) = request(
            &addr,
            "POST",
            "/orders",
            Some(&format!(r#"{{"sku": "{sku}", "quantity": 1}}"#)),
        )
        .unwrap();
        assert_eq!(status, 201, "{body}");
        json(&body)["id"].as_str().unwrap().to_string()
    };
    let confirmed = |id: &str| {
        let (status, body) = request(&addr, "GET", &format!("/orders/{id}"), None).unwrap();
        assert_eq!(status, 200, "{body}");
        json(&body)["confirmed"] == serde_json::Value::Bool(true)
    };
    let before_valkey = order("coffee");

    redis.restart();
    let mut worker = Worker::start_binary(
        &bins.join("worker"),
        db,
        &redis,
        &[
            ("WORKER_QUEUES", "default=1"),
            ("OUTBOX_POLL_INTERVAL", "60s"),
        ],
    );
    // The relay's first round at start-up finds the order taken during
    // the outage; from then on it waits 60 s between polls.
    wait_until(
        Duration::from_secs(60),
        "the earlier order is confirmed",
        || confirmed(&before_valkey),
    );
    wait_until(
        Duration::from_secs(30),
        "the relay subscribes to wake-ups",
        || {
            redis
                .cli(&["PUBSUB", "NUMSUB", "outbox:wake"])
                .is_some_and(|out| out.lines().nth(1).is_some_and(|n| n.trim() != "0"))
        },
    );
    let after_valkey = order("cocoa");
    wait_until(
        Duration::from_secs(15),
        "a wake-up from the server confirms the order before the next poll",
        || confirmed(&after_valkey),
    );

    worker.signal("-TERM");
    assert_eq!(
        worker.wait(Duration::from_secs(35)),
        Some(0),
        "{}",
        worker.log()
    );
}

/// The example's `orders` migration comes after every migration of the
/// kit, even with a clock before the newest of them (goose would refuse
/// it as missing otherwise).
#[test]
fn the_examples_migration_is_newer_than_every_kit_migration() {
    let dir = tempfile::tempdir().unwrap();
    gpkit(dir.path())
        // 2023-11-14, before every kit migration but the outbox's.
        .env("SOURCE_DATE_EPOCH", "1700000000")
        .args(["new", "project", "shop", "--example", "--no-input"])
        .assert()
        .success();
    let mut migrations: Vec<String> = std::fs::read_dir(dir.path().join("shop/migrations"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    migrations.sort();
    assert!(
        migrations.len() > 1 && migrations.last().unwrap().ends_with("_orders.sql"),
        "{migrations:?}"
    );
}
