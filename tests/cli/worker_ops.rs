//! The generated worker as an operator meets it when something is wrong:
//! an unreachable or silent Postgres at start-up, SIGTERM while Postgres
//! or Valkey hangs, the readiness probe while Postgres hangs and answers
//! again and while Valkey is down and back, and the
//! warning about a Valkey that persists nothing. Every server that is
//! stopped or frozen is the test's own: a Redis server, a TCP listener that
//! never answers, or a proxy to the shared Postgres that stops passing
//! bytes on.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::e2e::Database;
use crate::support::http_get;
use crate::worker_e2e::{
    RedisServer, Worker, database_with_events, free_port, relay_rounds, wait_until,
};

/// A TCP proxy on a loopback port to `upstream` that can be frozen: from
/// then on it holds every byte, so each connection through it hangs, as
/// with a stopped server or a broken network path.
struct FreezableProxy {
    port: u16,
    frozen: Arc<AtomicBool>,
}

impl FreezableProxy {
    fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let frozen = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&frozen);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                for (from, to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let flag = Arc::clone(&flag);
                    std::thread::spawn(move || pump(from, to, &flag));
                }
            }
        });
        Self { port, frozen }
    }

    fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }

    /// Passes bytes on again, first the ones held meanwhile.
    fn unfreeze(&self) {
        self.frozen.store(false, Ordering::SeqCst);
    }
}

/// Copies `from` to `to` until either closes, holding the bytes while
/// `frozen` is set.
fn pump(mut from: TcpStream, mut to: TcpStream, frozen: &AtomicBool) {
    let mut buffer = [0u8; 16 * 1024];
    loop {
        let read = match from.read(&mut buffer) {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        while frozen.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if to.write_all(&buffer[..read]).is_err() {
            return;
        }
    }
}

/// The parts of a `postgres://[user[:password]@]host[:port]/database` URL:
/// what comes before the host, `host:port`, and the path onwards.
fn split_url(url: &str) -> (String, String, String) {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (user, host) = match authority.rsplit_once('@') {
        Some((user, host)) => (format!("{user}@"), host),
        None => (String::new(), authority),
    };
    let host = if host.contains(':') {
        host.to_string()
    } else {
        format!("{host}:5432")
    };
    (format!("{scheme}://{user}"), host, path.to_string())
}

/// `url` with its host and port replaced by 127.0.0.1:`port`.
fn through_port(url: &str, port: u16) -> String {
    let (before, _, path) = split_url(url);
    format!("{before}127.0.0.1:{port}{path}")
}

/// `host:port` of the Postgres server of `url`.
fn upstream(url: &str) -> String {
    split_url(url).1
}

/// Waits until `/readyz` on `port` answers 503; its body.
fn wait_until_not_ready(port: u16) -> String {
    let mut body = String::new();
    wait_until(Duration::from_secs(10), "/readyz answers 503", || {
        let (status, answer) = http_get(port, "/readyz");
        body = answer;
        status == 503
    });
    body
}

/// How long the relay's round count must stay the same for the relay to
/// count as stuck: 20 of the tests' 50 ms poll intervals.
const STUCK_FOR: Duration = Duration::from_secs(1);

/// Waits until the relay of the worker whose metrics are on `port` is
/// stuck in a round: its round count did not move for [`STUCK_FOR`]. The
/// count it stopped at.
fn wait_until_the_relay_is_stuck(port: u16) -> u64 {
    let mut last = (relay_rounds(port), Instant::now());
    wait_until(
        Duration::from_secs(10),
        &format!("the relay's round count stays the same for {STUCK_FOR:?}"),
        || {
            let rounds = relay_rounds(port);
            if rounds != last.0 {
                last = (rounds, Instant::now());
            }
            last.1.elapsed() >= STUCK_FOR
        },
    );
    last.0
}

/// A worker whose Postgres is reached through `proxy` and whose metrics
/// are on `metrics`, after the relay ran three rounds and `/readyz` said
/// ready.
fn worker_behind(
    proxy: &FreezableProxy,
    db: &Database,
    redis: &RedisServer,
    metrics: u16,
) -> Worker {
    let addr = format!("127.0.0.1:{metrics}");
    let url = through_port(&db.url(), proxy.port);
    let worker = Worker::start(
        db,
        redis,
        &[
            ("DATABASE_URL", &url),
            ("OUTBOX_POLL_INTERVAL", "50ms"),
            ("WORKER_METRICS_ADDR", &addr),
        ],
    );
    wait_until(Duration::from_secs(30), "the relay runs rounds", || {
        relay_rounds(metrics) >= 3
    });
    assert_eq!(http_get(metrics, "/readyz"), (200, "ready".to_string()));
    worker
}

/// Waits for the worker to exit; how long it took and its exit code.
fn exit_of(worker: &mut Worker, limit: Duration) -> (Duration, Option<i32>) {
    let start = Instant::now();
    let code = worker.wait(limit);
    (start.elapsed(), code)
}

#[test]
#[ignore = "builds a generated project"]
fn a_worker_whose_postgres_refuses_stops_at_once_naming_it_and_the_reason() {
    let redis = RedisServer::start();
    let db = Database::create("gpkit_ops");
    let closed = free_port();
    let url = format!("postgres://app:hunter2@127.0.0.1:{closed}/shop");
    let mut worker = Worker::start(&db, &redis, &[("DATABASE_URL", &url)]);

    let (took, code) = exit_of(&mut worker, Duration::from_secs(10));

    assert_eq!(code, Some(1), "{}", worker.log());
    assert!(took < Duration::from_secs(3), "took {took:?}");
    let log = worker.log();
    assert!(
        log.contains(&format!(
            "the worker needs Postgres at start-up: cannot reach Postgres at postgres://app:***@127.0.0.1:{closed}/shop"
        )),
        "{log}"
    );
    assert!(log.contains("Connection refused"), "{log}");
    assert!(!log.contains("hunter2"), "the password leaked: {log}");
    assert!(!log.contains("worker started"), "{log}");
}

#[test]
#[ignore = "builds a generated project"]
fn a_worker_whose_postgres_never_answers_stops_after_the_connect_timeout() {
    let redis = RedisServer::start();
    let db = Database::create("gpkit_ops");
    // Connections complete in the kernel's backlog; nothing ever answers.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let url = format!("postgres://app@127.0.0.1:{port}/shop");
    let mut worker = Worker::start(
        &db,
        &redis,
        &[("DATABASE_URL", &url), ("DATABASE_CONNECT_TIMEOUT", "1s")],
    );

    let (took, code) = exit_of(&mut worker, Duration::from_secs(10));

    assert_eq!(code, Some(1), "{}", worker.log());
    assert!(took < Duration::from_secs(4), "took {took:?}");
    let log = worker.log();
    assert!(
        log.contains("no answer within 1s (DATABASE_CONNECT_TIMEOUT)"),
        "{log}"
    );
    drop(silent);
}

#[test]
#[ignore = "builds a generated project"]
fn readyz_fails_while_postgres_hangs_and_recovers_when_it_answers_again() {
    let redis = RedisServer::start();
    let (db, _) = database_with_events(0);
    let proxy = FreezableProxy::start(upstream(&db.url()));
    let metrics = free_port();
    let mut worker = worker_behind(&proxy, &db, &redis, metrics);

    proxy.freeze();
    let stuck_at = wait_until_the_relay_is_stuck(metrics);
    let body = wait_until_not_ready(metrics);
    assert!(body.contains("postgres: no answer within 2s"), "{body}");
    assert!(body.contains("valkey: ok"), "{body}");
    assert_eq!(
        http_get(metrics, "/healthz").0,
        200,
        "alive while not ready"
    );

    // Postgres answers again: ready again, and the relay runs rounds.
    proxy.unfreeze();
    let took = wait_until(Duration::from_secs(20), "ready again", || {
        http_get(metrics, "/readyz").0 == 200
    });
    wait_until(
        Duration::from_secs(20),
        "the relay runs rounds again",
        || relay_rounds(metrics) >= stuck_at + 3,
    );
    eprintln!("ready again {took:?} after Postgres answered");

    worker.signal("-TERM");
    assert_eq!(
        worker.wait(Duration::from_secs(30)),
        Some(0),
        "{}",
        worker.log()
    );
}

#[test]
#[ignore = "builds a generated project"]
fn sigterm_while_postgres_hangs_stops_the_worker_within_two_seconds() {
    let redis = RedisServer::start();
    let (db, _) = database_with_events(0);
    let proxy = FreezableProxy::start(upstream(&db.url()));
    let metrics = free_port();
    let mut worker = worker_behind(&proxy, &db, &redis, metrics);

    proxy.freeze();
    wait_until_the_relay_is_stuck(metrics);
    let body = wait_until_not_ready(metrics);
    assert!(body.contains("postgres: no answer within 2s"), "{body}");
    assert!(body.contains("valkey: ok"), "{body}");

    worker.signal("-TERM");
    let (took, code) = exit_of(&mut worker, Duration::from_secs(30));

    assert_eq!(code, Some(0), "{}", worker.log());
    assert!(
        took < Duration::from_secs(2),
        "the worker took {took:?} to exit after SIGTERM"
    );
    eprintln!("exit after SIGTERM with Postgres hung: {took:?}");
    assert!(
        worker.log().contains("relay round abandoned at shutdown"),
        "{}",
        worker.log()
    );
}

#[test]
#[ignore = "builds a generated project"]
fn sigterm_while_valkey_hangs_stops_the_worker_within_two_seconds() {
    let redis = RedisServer::start();
    let (db, _) = database_with_events(0);
    let metrics = free_port();
    let addr = format!("127.0.0.1:{metrics}");
    let mut worker = Worker::start(
        &db,
        &redis,
        &[("WORKER_METRICS_ADDR", &addr), ("OUTBOX_WAKE", "valkey")],
    );
    wait_until(Duration::from_secs(30), "the worker is ready", || {
        TcpStream::connect(("127.0.0.1", metrics)).is_ok() && http_get(metrics, "/readyz").0 == 200
    });

    // The server stops answering; connections stay open.
    let pid = redis.pid().unwrap().to_string();
    assert!(
        Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .unwrap()
            .success()
    );
    let body = wait_until_not_ready(metrics);
    assert!(body.contains("valkey: no answer within 2s"), "{body}");
    assert!(body.contains("postgres: ok"), "{body}");

    worker.signal("-TERM");
    let (took, code) = exit_of(&mut worker, Duration::from_secs(30));
    let _ = Command::new("kill").args(["-CONT", &pid]).status();

    assert_eq!(code, Some(0), "{}", worker.log());
    assert!(
        took < Duration::from_secs(2),
        "the worker took {took:?} to exit after SIGTERM"
    );
    eprintln!("exit after SIGTERM with Valkey hung: {took:?}");
}

#[test]
#[ignore = "builds a generated project"]
fn readyz_fails_while_valkey_is_down_and_recovers_when_it_is_back() {
    let mut redis = RedisServer::start();
    let (db, _) = database_with_events(0);
    let metrics = free_port();
    let addr = format!("127.0.0.1:{metrics}");
    let mut worker = Worker::start(&db, &redis, &[("WORKER_METRICS_ADDR", &addr)]);
    wait_until(Duration::from_secs(30), "the worker is ready", || {
        TcpStream::connect(("127.0.0.1", metrics)).is_ok() && http_get(metrics, "/readyz").0 == 200
    });
    assert_eq!(http_get(metrics, "/healthz"), (200, "ok".to_string()));

    redis.stop();
    let (status, body) = http_get(metrics, "/readyz");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("postgres: ok"), "{body}");
    assert!(
        body.lines()
            .any(|l| l.starts_with("valkey: ") && l != "valkey: ok"),
        "{body}"
    );
    assert!(body.contains("relay: ok"), "{body}");
    assert_eq!(
        http_get(metrics, "/healthz").0,
        200,
        "alive while not ready"
    );

    redis.restart();
    wait_until(Duration::from_secs(30), "ready again", || {
        http_get(metrics, "/readyz").0 == 200
    });
    worker.signal("-TERM");
    assert_eq!(worker.wait(Duration::from_secs(30)), Some(0));
}

/// The start-up log of a worker on `redis`, up to "worker started".
fn start_up_log(redis: &RedisServer) -> String {
    let (db, _) = database_with_events(0);
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut worker = Worker::start(&db, redis, &[("WORKER_METRICS_ADDR", &addr)]);
    wait_until(Duration::from_secs(30), "the worker started", || {
        worker.log().contains("worker started")
    });
    // The worker logs "worker started" before it listens for SIGTERM (its
    // shutdown future is first polled once its tasks are spawned): a
    // SIGTERM in between ends it by the signal's default action. Its
    // endpoints answer once those tasks run.
    wait_until(
        Duration::from_secs(30),
        "the worker's endpoints answer",
        || http_get(port, "/healthz").0 == 200,
    );
    let log = worker.log();
    worker.signal("-TERM");
    assert_eq!(worker.wait(Duration::from_secs(30)), Some(0));
    log
}

const PERSISTENCE_WARNING: &str = "Valkey persists nothing";

#[test]
#[ignore = "builds a generated project"]
fn a_valkey_without_persistence_is_warned_about_and_one_with_aof_is_not() {
    let bare = RedisServer::start_with_persistence("redis-server", &["--appendonly", "no"]);
    let log = start_up_log(&bare);
    let warning = log
        .lines()
        .find(|line| line.contains(PERSISTENCE_WARNING))
        .unwrap_or_else(|| panic!("no warning: {log}"));
    assert!(warning.contains("\"WARN\""), "{warning}");
    assert!(
        warning.contains("appendonly yes, appendfsync everysec"),
        "{warning}"
    );

    let persistent = RedisServer::start();
    let log = start_up_log(&persistent);
    assert!(!log.contains(PERSISTENCE_WARNING), "{log}");
}

#[test]
#[ignore = "builds a generated project"]
fn where_config_is_refused_the_worker_says_nothing_about_persistence() {
    let bare = RedisServer::start_with_persistence("redis-server", &["--appendonly", "no"]);
    bare.cli(&["ACL", "SETUSER", "default", "-config"]).unwrap();
    assert!(
        bare.cli(&["CONFIG", "GET", "appendonly"])
            .is_none_or(|out| out.contains("NOPERM")),
        "CONFIG is still allowed"
    );

    let log = start_up_log(&bare);

    assert!(!log.contains(PERSISTENCE_WARNING), "{log}");
}
