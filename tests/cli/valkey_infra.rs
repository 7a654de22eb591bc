//! The generated worker on production-style Valkey set-ups, each started by
//! the test on free loopback ports: TLS with a private CA (and a wrong CA
//! refused), an ACL user limited to `asynq:*` keys (and a wrong password
//! refused), a Sentinel group whose master is killed with SIGKILL, a
//! cluster of three masters (whose tasks Go asynq's cluster client reads
//! too), and a Sentinel group and a cluster that speak only TLS
//! (`VALKEY_TLS`). Each run goes from committed outbox rows to listener
//! runs recorded in Postgres; the Sentinel and cluster tests count every
//! run, repeats included, and check each key's order and the bound of
//! `email`'s concurrency limit from the times each run recorded. The
//! TLS-against-plaintext, Sentinel and cluster tests print their figures
//! (relay throughput, failover time, repeated runs, events delivered);
//! nothing is asserted on speed.

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::e2e::{Database, build_binaries, migrate, psql};
use crate::support::gpkit;
use crate::test_ca::{make_ca, make_server_cert};
use crate::worker_e2e::wait_until;

/// A port nothing listens on right now (below 55535, see the cluster bus).
fn free_port() -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if port < 55_535 {
            return port;
        }
    }
}

/// A listener of the project: records its run, with the time it started
/// (read from Postgres once its slot is taken) and, by the column's
/// default, the time it ended (before it frees its slot).
fn listener_body(listener: &str) -> String {
    format!(
        r#"//! `{listener}`: a listener of `orderPlaced`, filled in by the test.

use crate::events::order_placed::OrderPlaced;
use kit::worker::listeners::{{ListenerContext, ListenerError}};

/// Records the run, with the event id, the typed payload and its start.
pub async fn handle(event: OrderPlaced, ctx: ListenerContext) -> Result<(), ListenerError> {{
    let (started,): (String,) = sqlx::query_as("SELECT clock_timestamp()::text")
        .fetch_one(ctx.pool())
        .await?;
    sqlx::query(
        "INSERT INTO listener_runs (listener, event_id, order_id, note, started_at) \
         VALUES ($1, $2, $3, $4, $5::timestamptz)",
    )
    .bind("{listener}")
    .bind(ctx.event_id())
    .bind(event.order_id)
    .bind(&event.note)
    .bind(started)
    .execute(ctx.pool())
    .await?;
    Ok(())
}}
"#
    )
}

/// What makes the project's listeners ordered (`gpkit add event
/// --ordered-by order_id` writes it, and the test's bodies replace it):
/// events committed with a key ([`commit_keyed_events`]) run one at a time
/// per key; the others as they come.
const ORDERED: &str = r#"
/// One event of each `order_id` at a time, in the order they committed.
pub fn options() -> kit::prelude::ListenerOptions<OrderPlaced> {
    kit::prelude::ListenerOptions::new().ordered()
}
"#;

/// A project with the event `orderPlaced` (ordered by `order_id`) and two
/// ordered listeners that record each run in `listener_runs`, the job schedule `pulse` (every second;
/// its scheduler runs only where a test enables it, see [`SCHEDULER_ON`])
/// and the route `POST /orders`; built once, its binaries directory.
///
/// Named `shop`, as the other tests' projects of the same options are, so
/// that its kit is the build of theirs (see `e2e::cargo_lock`).
pub(crate) fn project() -> &'static Path {
    static BINS: OnceLock<PathBuf> = OnceLock::new();
    BINS.get_or_init(|| {
        let project = crate::e2e::new_shop_in("e2e-valkey", &[]);
        gpkit(&project)
            .args(["add", "event", "orderPlaced"])
            .args(["--field", "order_id:i64", "--field", "note:string"])
            .args(["--listener", "audit", "--listener", "email"])
            .args(["--ordered-by", "order_id"])
            .assert()
            .success();
        gpkit(&project)
            .env("SOURCE_DATE_EPOCH", "1800000000")
            .args(["new", "migration", "listener_runs"])
            .assert()
            .success();
        std::fs::write(
            project.join("migrations/20270115080000_listener_runs.sql"),
            "-- +goose Up\nCREATE TABLE listener_runs (listener text NOT NULL, event_id uuid NOT NULL, \
             order_id bigint NOT NULL, note text NOT NULL, started_at timestamptz NOT NULL, \
             ran_at timestamptz NOT NULL DEFAULT clock_timestamp());\n\n-- +goose Down\nDROP TABLE listener_runs;\n",
        )
        .unwrap();
        for listener in ["audit", "email"] {
            std::fs::write(
                project.join(format!("src/listeners/order_placed/{listener}.rs")),
                format!("{}{ORDERED}", listener_body(listener)),
            )
            .unwrap();
        }
        gpkit(&project)
            .args(["add", "schedule", "pulse", "--cron", "@every 1s", "--job"])
            .assert()
            .success();
        // `POST /orders`: a commit in the server, whose wake-up is the
        // server's own Valkey connection (secrets.rs).
        std::fs::write(
            project.join("src/routes/orders.rs"),
            crate::asynq_interop::ORDERS_ROUTE,
        )
        .unwrap();
        std::fs::write(
            project.join("src/routes/mod.rs"),
            crate::asynq_interop::ROUTES,
        )
        .unwrap();
        build_binaries(&project);
        project
    })
}

/// `email` limited to 3 runs at once (`WORKER_LIMITS`), so that its runs
/// take slots from the limiter's scripts and some are deferred.
const LIMITED_EMAIL: &str = "orderPlaced.email=concurrency:3";

/// Asserts that the concurrency limit of `email` (`WORKER_LIMITS`) deferred
/// some of its runs, read from the worker's metrics on 127.0.0.1:`metrics`,
/// so that the test exercised the limiter on its setup (`setup`, for the
/// messages).
fn assert_the_limit_deferred_email(metrics: u16, setup: &str) {
    let deferred = crate::metrics::value(
        &crate::metrics::scrape(metrics),
        "outbox_listener_limit_deferred_total",
        &[("listener", "email"), ("limit", "concurrency")],
    )
    .expect("the limit's deferrals are exported");
    eprintln!("{setup}: {deferred} runs of `email` deferred by its concurrency limit");
    assert!(
        deferred > 0.0,
        "no run of `email` was deferred: the limit was not exercised ({setup})"
    );
}

/// Asserts that no more than `limit` runs of `email` overlapped, each from
/// its start to its end as it recorded them (both inside the time it held
/// its slot, so the overlap counted is never more than the runs that held
/// one), over the runs `runs` selects from `listener_runs r` (a WHERE
/// clause).
fn assert_at_most_concurrent_email_runs(db: &Database, limit: u64, runs: &str, setup: &str) {
    let most = psql(
        &db.url(),
        &format!(
            "WITH runs AS (SELECT started_at, ran_at FROM listener_runs r \
               WHERE r.listener = 'email' AND {runs}), \
             edges AS (SELECT started_at AS at, 1 AS d FROM runs \
               UNION ALL SELECT ran_at, -1 FROM runs) \
             SELECT coalesce(max(n), 0) || ' ' || (SELECT count(*) FROM runs) FROM \
               (SELECT sum(d) OVER (ORDER BY at, d ROWS UNBOUNDED PRECEDING) AS n FROM edges) o"
        ),
    );
    let (most, counted) = most.split_once(' ').unwrap();
    let most: u64 = most.parse().unwrap();
    eprintln!("{setup}: at most {most} of {counted} runs of `email` at once (limit {limit})");
    assert!(
        most <= limit,
        "{setup}: {most} runs of `email` at once, over its concurrency limit of {limit}"
    );
}

/// The setting that runs the scheduler of `pulse` in a test's worker.
const SCHEDULER_ON: (&str, &str) = ("SCHEDULER_ENABLED", "true");

/// The scheduler's lease key: the kit names the service after its own
/// package, `shop-kit`.
const LEASE_KEY: &str = "scheduler:{shop-kit}:leader";

/// What the scheduler of `pulse` left in the worker's log: it led, and how
/// many ticks it enqueued as new and how many the job ran.
fn pulse_ticks(log: &str) -> (bool, usize, usize) {
    let (mut led, mut enqueued, mut ran) = (false, 0, 0);
    for line in log.lines() {
        let Ok(json) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let fields = &json["fields"];
        match fields["message"].as_str().unwrap_or_default() {
            "scheduler: this replica leads" => led = true,
            "scheduler: tick enqueued"
                if fields["schedule"] == "pulse" && fields["new"] == true =>
            {
                enqueued += 1;
            }
            "pulse" if json["span"]["name"] == "job" => ran += 1,
            _ => {}
        }
    }
    (led, enqueued, ran)
}

/// While `worker` runs with the scheduler on: it leads, holds the lease on
/// the server `read` reaches, and lists `pulse` on asynqmon's Schedulers
/// page with the ticks it enqueued (Go asynq's keys, read as asynqmon
/// does), and the job runs.
fn assert_the_scheduler_leads(worker: &Worker, read: &dyn Fn(&[&str]) -> Option<String>) {
    wait_until(
        Duration::from_secs(30),
        "the scheduler leads and `pulse` runs twice",
        || {
            let (led, enqueued, ran) = pulse_ticks(&worker.log());
            led && enqueued >= 2 && ran >= 2
        },
    );
    let holder = read(&["GET", LEASE_KEY]).unwrap_or_default();
    assert!(!holder.is_empty(), "no lease on the server");
    let schedulers = read(&["ZRANGE", "asynq:schedulers", "0", "-1"]).unwrap_or_default();
    let schedulers: Vec<&str> = schedulers.lines().collect();
    assert_eq!(schedulers.len(), 1, "one scheduler listed: {schedulers:?}");
    let entries = read(&["LRANGE", schedulers[0], "0", "-1"]).unwrap_or_default();
    assert!(
        entries.contains("job:pulse") && entries.contains("@every 1s"),
        "the Schedulers page does not list `pulse`: {entries:?}"
    );
    let history = read(&["KEYS", "asynq:scheduler_history:*"]).unwrap_or_default();
    let history: Vec<&str> = history.lines().collect();
    assert_eq!(history.len(), 1, "one schedule's history: {history:?}");
    let ticks: u64 = read(&["ZCARD", history[0]])
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(ticks >= 2, "the history holds {ticks} ticks");
}

/// After a clean stop: the lease is handed back and the Schedulers page is
/// empty.
fn assert_the_scheduler_stepped_down(read: &dyn Fn(&[&str]) -> Option<String>) {
    assert_eq!(read(&["EXISTS", LEASE_KEY]).as_deref(), Some("0"));
    assert_eq!(
        read(&["ZRANGE", "asynq:schedulers", "0", "-1"]).as_deref(),
        Some("")
    );
}

pub(crate) fn bin(name: &str) -> PathBuf {
    project().join(".bin").join(name)
}

/// A migrated database of the project.
pub(crate) fn database() -> Database {
    let db = Database::create("gpkit_valkey");
    migrate(project(), &db, &["up"]);
    db
}

/// Commits `count` `orderPlaced` events; returns all event ids so far.
pub(crate) fn commit_events(db: &Database, count: u32) -> BTreeSet<String> {
    psql(
        &db.url(),
        &format!(
            "INSERT INTO outbox_events (event_id, event_name, payload) \
             SELECT gen_random_uuid(), 'orderPlaced', jsonb_build_object('order_id', g, 'note', 'n') \
             FROM generate_series(1, {count}) g"
        ),
    );
    psql(&db.url(), "SELECT event_id FROM outbox_events")
        .lines()
        .map(str::to_string)
        .collect()
}

/// Commits `count` `orderPlaced` events as keyed events of `keys` orders
/// (`order_id` 0 to `keys - 1`, five events of one order after another, so
/// that unordered they would run at once), each numbered after the
/// events of its key already committed, as `Event::order_key`'s dispatch
/// numbers them (in one epoch, 1); the ids of every event in the outbox,
/// as [`commit_events`].
pub(crate) fn commit_keyed_events(db: &Database, count: u32, keys: u32) -> BTreeSet<String> {
    psql(
        &db.url(),
        &format!(
            "WITH n AS (SELECT g, ((g - 1) / 5) % {keys} AS k FROM generate_series(1, {count}) g), \
             prior AS (SELECT metadata ->> 'order_key' AS key, count(*) AS c FROM outbox_events \
               WHERE metadata ? 'order_key' GROUP BY 1) \
             INSERT INTO outbox_events (event_id, event_name, payload, metadata) \
             SELECT gen_random_uuid(), 'orderPlaced', jsonb_build_object('order_id', n.k, 'note', 'n'), \
               jsonb_build_object('order_key', 'order_id:' || n.k, 'order_epoch', '1', 'order_seq', \
                 (coalesce(p.c, 0) + row_number() OVER (PARTITION BY n.k ORDER BY n.g))::text) \
             FROM n LEFT JOIN prior p ON p.key = 'order_id:' || n.k ORDER BY n.g"
        ),
    );
    psql(&db.url(), "SELECT event_id FROM outbox_events")
        .lines()
        .map(str::to_string)
        .collect()
}

/// Asserts that each listener ran each key's events in their order: by
/// the time of its runs, each run is of the key's first event, of the
/// event its previous run was of (a run again, at least once), or of the
/// next one.
fn assert_each_key_ran_in_order(db: &Database, setup: &str) {
    let out_of_order = psql(
        &db.url(),
        "SELECT count(*) FROM ( \
           SELECT (e.metadata ->> 'order_seq')::int AS seq, \
             lag((e.metadata ->> 'order_seq')::int) OVER ( \
               PARTITION BY r.listener, e.metadata ->> 'order_key' ORDER BY r.ran_at) AS prev \
           FROM listener_runs r JOIN outbox_events e USING (event_id) \
           WHERE e.metadata ? 'order_key') runs \
         WHERE (prev IS NULL AND seq <> 1) OR (prev IS NOT NULL AND seq NOT IN (prev, prev + 1))",
    );
    assert_eq!(out_of_order, "0", "{setup}: runs out of their key's order");
    let keyed_runs = psql(
        &db.url(),
        "SELECT count(DISTINCT (r.listener, r.event_id)) FROM listener_runs r \
         JOIN outbox_events e USING (event_id) WHERE e.metadata ? 'order_key'",
    );
    eprintln!("{setup}: {keyed_runs} keyed listener runs, each key in its order");
}

fn count(db: &Database, sql: &str) -> u64 {
    psql(&db.url(), sql).parse().unwrap()
}

fn unpublished(db: &Database) -> u64 {
    count(
        db,
        "SELECT count(*) FROM outbox_events WHERE published_at IS NULL",
    )
}

/// Distinct (listener, event) pairs that ran: what waiting for delivery
/// needs; a repeated run is seen only by [`listener_runs`].
fn listener_pairs(db: &Database) -> u64 {
    count(
        db,
        "SELECT count(*) FROM (SELECT DISTINCT listener, event_id FROM listener_runs) runs",
    )
}

/// Every listener run recorded, repeats included.
fn listener_runs(db: &Database) -> u64 {
    count(db, "SELECT count(*) FROM listener_runs")
}

/// The time now as Unix seconds, comparable with Postgres timestamps on
/// the same machine.
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Waits until both listeners ran for each of `events` events.
pub(crate) fn wait_for_listeners(db: &Database, events: usize, limit: Duration) {
    wait_until(limit, "every listener ran for every event", || {
        listener_pairs(db) == 2 * events as u64
    });
    assert_eq!(unpublished(db), 0);
}

/// The worker binary with `env` (and nothing else of the environment but
/// PATH): consuming `default`, metrics on a free port, JSON logs.
struct Worker {
    child: Child,
    log: PathBuf,
}

impl Worker {
    fn start(db: &Database, dir: &Path, env: &[(&str, &str)]) -> Self {
        let log = dir.join(format!("worker-{}.log", free_port()));
        let mut command = Command::new(bin("worker"));
        command
            .current_dir(project())
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("DATABASE_URL", db.url())
            .env("WORKER_QUEUES", "default=1")
            .env("WORKER_METRICS_ADDR", "127.0.0.1:0")
            .env("OUTBOX_POLL_INTERVAL", "100ms")
            // The tests that count tasks count events only.
            .env("SCHEDULER_ENABLED", "false")
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

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the process to exit on its own; its exit code.
    fn exit_code(&mut self, limit: Duration) -> Option<i32> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(
                start.elapsed() < limit,
                "the worker did not exit: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, and a clean exit.
    fn stop(mut self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        assert_eq!(
            self.exit_code(Duration::from_secs(40)),
            Some(0),
            "{}",
            self.log()
        );
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A redis-server (or sentinel) of the test's own, killed on drop.
struct Server {
    child: Option<Child>,
    port: u16,
}

impl Server {
    fn start_on(port: u16, dir: &Path, args: &[&str]) -> Self {
        let child = Command::new("redis-server")
            .args(args)
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server runs (Debian: redis-server)");
        Self {
            child: Some(child),
            port,
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill(); // SIGKILL
            let _ = child.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// redis-cli with `args`; stdout when it succeeded.
fn cli(args: &[&str]) -> Option<String> {
    let output = Command::new("redis-cli").args(args).output().ok()?;
    let out = String::from_utf8_lossy(&output.stdout).trim().to_string();
    (output.status.success() && !out.starts_with("ERR") && !out.contains("Could not connect"))
        .then_some(out)
}

/// A TLS Redis on a free port with a certificate for 127.0.0.1 signed by
/// a fresh test CA `ca.pem` in `dir`.
fn tls_server(dir: &Path) -> Server {
    let port = free_port();
    let args = tls_only_args(dir, port);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = Server::start_on(port, dir, &args);
    wait_until(Duration::from_secs(10), "the TLS server answers", || {
        tls_cli(dir, &["-p", &port.to_string(), "PING"]).as_deref() == Some("PONG")
    });
    server
}

#[test]
#[ignore = "builds a generated project"]
fn over_tls_with_a_private_ca_the_relay_and_the_listeners_run_and_a_wrong_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = tls_server(dir.path());
    let url = format!("rediss://127.0.0.1:{}", server.port);
    let ca = dir.path().join("ca.pem").display().to_string();
    let db = database();
    let events = commit_events(&db, 1_000);

    let worker = Worker::start(
        &db,
        dir.path(),
        &[("VALKEY_URL", &url), ("VALKEY_CA_CERT", &ca)],
    );
    wait_for_listeners(&db, events.len(), Duration::from_secs(180));
    worker.stop();

    // Another CA: the certificate does not verify, and the worker says so.
    make_ca(dir.path(), "other");
    let other = dir.path().join("other.pem").display().to_string();
    let mut refused = Worker::start(
        &db,
        dir.path(),
        &[("VALKEY_URL", &url), ("VALKEY_CA_CERT", &other)],
    );
    assert_ne!(refused.exit_code(Duration::from_secs(60)), Some(0));
    let log = refused.log();
    assert!(
        log.contains(&format!(
            "cannot connect to Valkey at 127.0.0.1:{}",
            server.port
        )),
        "{log}"
    );
    assert!(log.contains("UnknownIssuer"), "{log}");

    // Without VALKEY_CA_CERT the public roots do not know the test CA either.
    let mut public_roots = Worker::start(&db, dir.path(), &[("VALKEY_URL", &url)]);
    assert_ne!(public_roots.exit_code(Duration::from_secs(60)), Some(0));
    assert!(
        public_roots.log().contains("UnknownIssuer"),
        "{}",
        public_roots.log()
    );
}

#[test]
#[ignore = "builds a generated project"]
fn an_acl_user_limited_to_the_readmes_keys_works_and_a_wrong_password_is_refused() {
    const PASSWORD: &str = "relay-secret-7f3a";
    let dir = tempfile::tempdir().unwrap();
    let port = free_port().to_string();
    let _server = Server::start_on(port.parse().unwrap(), dir.path(), &["--port", &port]);
    wait_until(Duration::from_secs(10), "redis-server answers", || {
        cli(&["-p", &port, "PING"]).as_deref() == Some("PONG")
    });
    // The keys the ACL of kit/docs/valkey.md names (asynq:, the scheduler's, and the
    // limits' slots and woken marks), the two channels the worker uses, no
    // admin commands; the default user is switched off.
    let acl = |args: &[&str]| {
        let mut all = vec![
            "-p",
            &port,
            "--user",
            "admin",
            "--pass",
            "admin",
            "--no-auth-warning",
        ];
        all.extend_from_slice(args);
        cli(&all)
    };
    cli(&[
        "-p", &port, "ACL", "SETUSER", "admin", "on", ">admin", "~*", "&*", "+@all",
    ])
    .unwrap();
    acl(&[
        "ACL",
        "SETUSER",
        "relay",
        "on",
        &format!(">{PASSWORD}"),
        "resetkeys",
        "~asynq:*",
        "~scheduler:*",
        "~limits:*",
        "~deferred:*",
        "~ordered:*",
        "resetchannels",
        "&outbox:*",
        "&asynq:cancel",
        "+@all",
        "-@dangerous",
    ])
    .unwrap();
    acl(&["ACL", "SETUSER", "default", "off"]).unwrap();

    let db = database();
    let events = commit_events(&db, 200);
    let worker = Worker::start(
        &db,
        dir.path(),
        &[
            (
                "VALKEY_URL",
                &format!("redis://relay:{PASSWORD}@127.0.0.1:{port}"),
            ),
            ("OUTBOX_WAKE", "valkey"),
            // A limited listener: its limiter's keys (`limits:*`) too.
            ("WORKER_LIMITS", LIMITED_EMAIL),
            SCHEDULER_ON,
        ],
    );
    wait_for_listeners(&db, events.len(), Duration::from_secs(120));
    // The scheduler too works with the keys the ACL of kit/docs/valkey.md names.
    assert_the_scheduler_leads(&worker, &|args: &[&str]| acl(args));
    worker.stop();
    assert_the_scheduler_stepped_down(&|args: &[&str]| acl(args));
    // The one refusal expected: the start-up persistence check's `CONFIG
    // GET` (`-@dangerous`), after which the worker says nothing about it.
    let denied = acl(&["ACL", "LOG"]).unwrap_or_default();
    let lines: Vec<&str> = denied.lines().collect();
    let objects: Vec<&str> = lines
        .windows(2)
        .filter(|pair| pair[0] == "object")
        .map(|pair| pair[1])
        .collect();
    assert!(
        objects.iter().all(|object| *object == "config|get"),
        "the relay was denied something besides CONFIG GET: {denied}"
    );

    // The ADDR form with a user, and a wrong password: a clear error.
    let mut refused = Worker::start(
        &db,
        dir.path(),
        &[
            ("VALKEY_ADDR", &format!("127.0.0.1:{port}")),
            ("VALKEY_USERNAME", "relay"),
            ("VALKEY_PASSWORD", "not-the-password"),
        ],
    );
    assert_ne!(refused.exit_code(Duration::from_secs(60)), Some(0));
    let log = refused.log();
    assert!(
        log.contains(&format!("cannot connect to Valkey at 127.0.0.1:{port}")),
        "{log}"
    );
    assert!(log.contains("Password authentication failed"), "{log}");
    assert!(
        !log.contains("not-the-password"),
        "the password leaked: {log}"
    );
}

#[test]
#[ignore = "builds a generated project"]
fn the_worker_refuses_two_valkey_forms_naming_both() {
    let db = database();
    let output = Command::new(bin("worker"))
        .current_dir(project())
        .env_clear()
        .env("DATABASE_URL", db.url())
        .env("VALKEY_URL", "redis://app:hunter2@127.0.0.1:1")
        .env("VALKEY_ADDR", "127.0.0.1:1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("VALKEY_URL and VALKEY_ADDR are both set"),
        "{stderr}"
    );
    assert!(!stderr.contains("hunter2"), "{stderr}");
}

/// `INFO replication` field `name` of the server on `port`.
fn replication(port: u16, name: &str) -> Option<String> {
    let info = cli(&["-p", &port.to_string(), "INFO", "replication"])?;
    info.lines()
        .find_map(|line| line.strip_prefix(&format!("{name}:")))
        .map(|value| value.trim().to_string())
}

/// The members of the sorted set or list `key` on the server on `port`
/// (a failed read fails the test: it is not an empty set).
fn members(port: u16, command: &str, key: &str) -> Vec<String> {
    cli(&["-p", &port.to_string(), command, key, "0", "-1"])
        .unwrap_or_else(|| panic!("redis-cli could not read {key} on port {port}"))
        .lines()
        .filter(|line| !line.is_empty())
        .map(str::to_string)
        .collect()
}

/// `WORKER_CONCURRENCY` of the Sentinel test's worker: low, so that the
/// master can be killed while tasks are in flight.
const SENTINEL_CONCURRENCY: u64 = 2;

/// What the kit's `docs/valkey.md` states about a Sentinel failover, and the
/// bound it names: the worker publishes and runs again within this long
/// of the promotion.
const SENTINEL_RECOVERY_STATEMENT: &str = "within 30 s of the promotion";
const SENTINEL_RECOVERY: Duration = Duration::from_secs(30);

#[test]
#[ignore = "builds a generated project"]
fn under_sentinel_events_keep_flowing_after_the_master_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let (master_port, replica_port) = (free_port(), free_port());
    for name in ["master", "replica"] {
        std::fs::create_dir_all(dir.path().join(name)).unwrap();
    }
    let mut master = Server::start_on(
        master_port,
        &dir.path().join("master"),
        &["--port", &master_port.to_string()],
    );
    let _replica = Server::start_on(
        replica_port,
        &dir.path().join("replica"),
        &[
            "--port",
            &replica_port.to_string(),
            "--replicaof",
            "127.0.0.1",
            &master_port.to_string(),
        ],
    );
    wait_until(Duration::from_secs(20), "the replica is in sync", || {
        replication(replica_port, "master_link_status").as_deref() == Some("up")
    });
    let sentinel_ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let _sentinels: Vec<SentinelProcess> = sentinel_ports
        .iter()
        .map(|port| SentinelProcess::start(dir.path(), *port, master_port))
        .collect();
    wait_until(
        Duration::from_secs(30),
        "every sentinel knows the replica and the other sentinels",
        || {
            sentinel_ports.iter().all(|port| {
                let info =
                    cli(&["-p", &port.to_string(), "SENTINEL", "MASTER", "m1"]).unwrap_or_default();
                let field = |name: &str| {
                    let lines: Vec<&str> = info.lines().collect();
                    lines
                        .iter()
                        .position(|line| *line == name)
                        .and_then(|i| lines.get(i + 1).map(|v| v.to_string()))
                };
                field("num-slaves").as_deref() == Some("1")
                    && field("num-other-sentinels").as_deref() == Some("2")
            })
        },
    );
    let sentinel_addrs = sentinel_ports
        .iter()
        .map(|port| format!("127.0.0.1:{port}"))
        .collect::<Vec<_>>()
        .join(",");

    // Events flow through the master, and the master is SIGKILLed while
    // the worker is working through them: some listener runs done, not all,
    // and tasks active on the master.
    let db = database();
    let first = commit_keyed_events(&db, 1000, 100);
    let metrics = free_port();
    let worker = Worker::start(
        &db,
        dir.path(),
        &[
            ("VALKEY_SENTINEL_ADDRS", &sentinel_addrs),
            ("VALKEY_SENTINEL_MASTER", "m1"),
            ("OUTBOX_WAKE", "valkey"),
            ("WORKER_CONCURRENCY", &SENTINEL_CONCURRENCY.to_string()),
            // `email` limited to one run at once (the worker runs two): its
            // slots, waiters and deferred runs are on the master that dies,
            // and must not keep it from running.
            ("WORKER_LIMITS", "orderPlaced.email=concurrency:1"),
            ("WORKER_METRICS_ADDR", &format!("127.0.0.1:{metrics}")),
        ],
    );
    // Every event's task on the replica first: an enqueue the master had
    // not passed on when it died is lost with it, as kit/docs/valkey.md says.
    wait_until(
        Duration::from_secs(60),
        "the relay published every event",
        || unpublished(&db) == 0,
    );
    let published_up_to: u64 = replication(master_port, "master_repl_offset")
        .expect("the master's replication offset")
        .parse()
        .unwrap();
    wait_until(
        Duration::from_secs(10),
        "the replica has every enqueue",
        || {
            replication(replica_port, "master_repl_offset")
                .is_some_and(|offset| offset.parse::<u64>().unwrap() >= published_up_to)
        },
    );
    let active_at_kill = loop {
        let runs = listener_runs(&db);
        assert!(
            runs < 2 * first.len() as u64,
            "every listener ran before the master could be killed with tasks in flight"
        );
        if runs > 0 {
            let active = members(master_port, "LRANGE", "asynq:{default}:active").len();
            if active > 0 {
                break active;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let killed_at = unix_now();
    master.kill();
    let runs_at_kill = listener_runs(&db);

    // More events after the kill: the relay meets the dead master, asks the
    // sentinels, and finds the promoted replica.
    let all = commit_keyed_events(&db, 300, 100);
    wait_until(Duration::from_secs(30), "the replica is promoted", || {
        replication(replica_port, "role").as_deref() == Some("master")
    });
    let promoted = unix_now() - killed_at;
    wait_for_listeners(&db, all.len(), Duration::from_secs(120));
    // The bound, but for the runs in flight at the kill: a slot taken on
    // the master and not yet on the replica is lost with it.
    assert_at_most_concurrent_email_runs(
        &db,
        1,
        &format!(
            "NOT (r.started_at <= to_timestamp({killed_at}) AND r.ran_at >= to_timestamp({killed_at}))"
        ),
        "sentinel",
    );
    assert_the_limit_deferred_email(metrics, "sentinel");
    assert_each_key_ran_in_order(&db, "sentinel");
    // Every task settled on the new master: a task whose completion the
    // replica never had is run again once its lease runs out.
    wait_until(
        Duration::from_secs(180),
        "no task is pending, active or retrying on the new master",
        || {
            [
                ("LRANGE", "asynq:{default}:pending"),
                ("LRANGE", "asynq:{default}:active"),
                ("ZRANGE", "asynq:{default}:retry"),
            ]
            .iter()
            .all(|(command, key)| members(replica_port, command, key).is_empty())
        },
    );
    worker.stop();

    // The failover as the relay saw it: from the SIGKILL to the start of
    // the first relay round that published (its transaction's `now()`,
    // which `published_at` records), and to the first listener run of an
    // event committed after the kill; bounded by what kit/docs/valkey.md states.
    let since_kill = |sql: &str| -> f64 {
        psql(&db.url(), &sql.replace("KILLED", &killed_at.to_string()))
            .parse::<f64>()
            .unwrap()
    };
    let published = since_kill(
        "SELECT extract(epoch FROM min(published_at)) - KILLED FROM outbox_events \
         WHERE published_at >= to_timestamp(KILLED)",
    );
    let ran = since_kill(
        "SELECT extract(epoch FROM min(r.ran_at)) - KILLED FROM listener_runs r \
         JOIN outbox_events e USING (event_id) WHERE e.created_at >= to_timestamp(KILLED)",
    );
    eprintln!(
        "failover: the replica was promoted {promoted:.2}s after the SIGKILL; the relay published \
         {published:.2}s after it, and the first event committed after it ran at {ran:.2}s"
    );
    let doc = std::fs::read_to_string(project().join("kit/docs/valkey.md")).unwrap();
    assert!(
        doc.contains(SENTINEL_RECOVERY_STATEMENT),
        "kit/docs/valkey.md no longer says: {SENTINEL_RECOVERY_STATEMENT}"
    );
    assert!(
        published <= promoted + SENTINEL_RECOVERY.as_secs_f64()
            && ran <= promoted + SENTINEL_RECOVERY.as_secs_f64(),
        "the worker took longer than kit/docs/valkey.md's {SENTINEL_RECOVERY:?} after the promotion \
         ({promoted:.2}s after the kill): published at {published:.2}s, ran at {ran:.2}s"
    );
    assert_eq!(replication(replica_port, "role").as_deref(), Some("master"));

    // Every run counts (no DISTINCT). Each (listener, event) pair ran at
    // least once (waited for above). A pair runs again only when its task
    // was in flight at the kill: its dequeue or its completion had not
    // reached the replica, so it first ran in the moment before the kill
    // (a second is ample for replication on loopback) or after it, from
    // the tasks the master listed as active. The bound is computed from
    // those tasks; a repeat of a task settled earlier fails the test.
    let pairs = 2 * all.len() as u64;
    let runs = listener_runs(&db);
    assert_eq!(listener_pairs(&db), pairs, "a listener ran for no event");
    let repeated = runs - pairs;
    let first_runs = "(SELECT min(extract(epoch FROM ran_at)) - KILLED AS at, count(*) AS runs \
                      FROM listener_runs GROUP BY listener, event_id) pair";
    let ran_just_before_kill = since_kill(&format!(
        "SELECT count(*) FROM {first_runs} WHERE at BETWEEN -1 AND 0"
    )) as u64;
    let earliest_repeated = since_kill(&format!(
        "SELECT coalesce(min(at), 0) FROM {first_runs} WHERE runs > 1"
    ));
    let in_flight = ran_just_before_kill + active_at_kill as u64;
    eprintln!(
        "sentinel: killed with {runs_at_kill} of {} listener runs done and {active_at_kill} tasks \
         active; {runs} runs for {pairs} (listener, event) pairs: {repeated} repeated, \
         of {in_flight} in flight at the kill ({ran_just_before_kill} ran in its last second)",
        2 * first.len()
    );
    assert!(
        earliest_repeated >= -1.0,
        "a pair that first ran {:.2}s before the kill, long before it, ran again",
        -earliest_repeated
    );
    assert!(
        repeated <= in_flight,
        "{repeated} listener runs repeated, more than the {in_flight} tasks in flight at the kill"
    );

    // Every event's task exists exactly once: completed, and nowhere else.
    let completed: BTreeSet<String> = members(replica_port, "ZRANGE", "asynq:{default}:completed")
        .into_iter()
        .collect();
    assert!(all.is_subset(&completed), "an event task is missing");
    for (command, key) in [
        ("LRANGE", "asynq:{default}:pending"),
        ("LRANGE", "asynq:{default}:active"),
        ("ZRANGE", "asynq:{default}:retry"),
        ("ZRANGE", "asynq:{default}:archived"),
        ("ZRANGE", "asynq:{default}:scheduled"),
    ] {
        let elsewhere = members(replica_port, command, key);
        assert!(
            elsewhere.iter().all(|id| !all.contains(id)),
            "an event task is also in {key}"
        );
    }
}

/// A sentinel watching `m1` on `master_port`, from a config file of its own
/// (sentinel rewrites it).
struct SentinelProcess(Child);

impl SentinelProcess {
    fn start(dir: &Path, port: u16, master_port: u16) -> Self {
        let conf = dir.join(format!("sentinel-{port}.conf"));
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor m1 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds m1 1000\n\
                 sentinel failover-timeout m1 4000\n",
                dir.display()
            ),
        )
        .unwrap();
        let child = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        Self(child)
    }
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Drains `events` committed events with one relay-only worker (it
/// consumes the queue `idle`) over `env`; the time taken, after checking
/// that the queue on `port` (reached with `tls_args`) holds each once.
fn drain(events: u32, env: &[(&str, &str)], port: u16, tls_args: &[&str]) -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let db = database();
    let ids = commit_events(&db, events);
    let mut env = env.to_vec();
    env.push(("WORKER_QUEUES", "idle=1"));
    let start = Instant::now();
    let worker = Worker::start(&db, dir.path(), &env);
    wait_until(Duration::from_secs(300), "every event is published", || {
        unpublished(&db) == 0
    });
    let elapsed = start.elapsed();
    worker.stop();
    let mut args = tls_args.to_vec();
    let port = port.to_string();
    args.extend(["-p", &port, "LRANGE", "asynq:{default}:pending", "0", "-1"]);
    let queued: Vec<String> = cli(&args)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect();
    let unique: BTreeSet<String> = queued.iter().cloned().collect();
    assert_eq!(queued.len(), unique.len(), "an event was queued twice");
    assert!(unique == ids, "the queue does not hold exactly the events");
    elapsed
}

/// Checks that TLS delivers the same backlog exactly once, and prints the
/// relay throughput of both. The figure means something only when the test
/// runs alone (`--test-threads 1`) on a quiet machine; it is never asserted.
#[test]
#[ignore = "builds a generated project"]
fn the_relay_drains_the_same_backlog_over_tls_and_over_plaintext() {
    const EVENTS: u32 = 5_000;
    let dir = tempfile::tempdir().unwrap();
    let tls = tls_server(dir.path());
    let ca = dir.path().join("ca.pem").display().to_string();
    let plain_port = free_port();
    let plain_dir = tempfile::tempdir().unwrap();
    let _plain = Server::start_on(
        plain_port,
        plain_dir.path(),
        &["--port", &plain_port.to_string()],
    );
    wait_until(Duration::from_secs(10), "redis-server answers", || {
        cli(&["-p", &plain_port.to_string(), "PING"]).as_deref() == Some("PONG")
    });

    let over_tls = drain(
        EVENTS,
        &[
            ("VALKEY_URL", &format!("rediss://127.0.0.1:{}", tls.port)),
            ("VALKEY_CA_CERT", &ca),
        ],
        tls.port,
        &["--tls", "--cacert", &ca],
    );
    let plain = drain(
        EVENTS,
        &[("VALKEY_URL", &format!("redis://127.0.0.1:{plain_port}"))],
        plain_port,
        &[],
    );
    let rate = |elapsed: Duration| f64::from(EVENTS) / elapsed.as_secs_f64();
    eprintln!(
        "relay throughput, {EVENTS} events, one worker (debug build, including start-up): \
         TLS {:.0} events/s, plaintext {:.0} events/s, TLS/plaintext {:.2}",
        rate(over_tls),
        rate(plain),
        rate(over_tls) / rate(plain)
    );
}

/// Sum over the nodes on `ports` of `PUBSUB NUMSUB channel` (node-local).
fn subscribers(ports: &[u16], channel: &str) -> u64 {
    ports
        .iter()
        .filter_map(|port| cli(&["-p", &port.to_string(), "PUBSUB", "NUMSUB", channel]))
        .filter_map(|out| {
            out.lines()
                .nth(1)
                .and_then(|n| n.trim().parse::<u64>().ok())
        })
        .sum()
}

#[test]
#[ignore = "builds a generated project"]
fn on_a_cluster_of_three_masters_ten_thousand_events_become_tasks_exactly_once() {
    const EVENTS: u32 = 10_000;
    let dir = tempfile::tempdir().unwrap();
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let _nodes: Vec<Server> = ports
        .iter()
        .map(|port| {
            let node_dir = dir.path().join(port.to_string());
            std::fs::create_dir_all(&node_dir).unwrap();
            Server::start_on(
                *port,
                &node_dir,
                &[
                    "--port",
                    &port.to_string(),
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                ],
            )
        })
        .collect();
    for port in &ports {
        wait_until(Duration::from_secs(10), "the node answers", || {
            cli(&["-p", &port.to_string(), "PING"]).as_deref() == Some("PONG")
        });
    }
    let addrs: Vec<String> = ports
        .iter()
        .map(|port| format!("127.0.0.1:{port}"))
        .collect();
    let mut create = vec!["--cluster", "create"];
    create.extend(addrs.iter().map(String::as_str));
    create.push("--cluster-yes");
    cli(&create).expect("redis-cli --cluster create");
    for port in &ports {
        wait_until(Duration::from_secs(30), "the cluster is ok", || {
            cli(&["-p", &port.to_string(), "CLUSTER", "INFO"])
                .is_some_and(|info| info.contains("cluster_state:ok"))
        });
    }

    // The relay, the fan-out and both listeners, ordered over 1,000 keys,
    // on the cluster (where the worker enqueues each run the chains' scripts
    // make the head).
    let db = database();
    let events = commit_keyed_events(&db, EVENTS, 1_000);
    let cluster_addrs = addrs.join(",");
    let metrics = free_port();
    let start = Instant::now();
    let worker = Worker::start(
        &db,
        dir.path(),
        &[
            ("VALKEY_CLUSTER_ADDRS", &cluster_addrs),
            ("OUTBOX_WAKE", "valkey"),
            ("OUTBOX_POLL_INTERVAL", "30s"),
            // `email` limited: the limiter's scripts, the deferral and the
            // promotion of its runs, on the cluster too.
            ("WORKER_LIMITS", LIMITED_EMAIL),
            ("WORKER_METRICS_ADDR", &format!("127.0.0.1:{metrics}")),
        ],
    );
    wait_for_listeners(&db, events.len(), Duration::from_secs(600));
    eprintln!(
        "cluster: {EVENTS} events relayed and both listeners run in {:.1?}",
        start.elapsed()
    );
    assert_at_most_concurrent_email_runs(&db, 3, "true", "cluster");
    assert_the_limit_deferred_email(metrics, "cluster");
    assert_each_key_ran_in_order(&db, "cluster");

    // A wake-up published on any node reaches the relay (it polls only
    // every 30 s).
    wait_until(Duration::from_secs(30), "the relay subscribed", || {
        subscribers(&ports, "outbox:wake") > 0
    });
    let all = commit_events(&db, 1);
    for port in &ports {
        cli(&["-p", &port.to_string(), "PUBLISH", "outbox:wake", ""]).unwrap();
    }
    wait_until(Duration::from_secs(10), "the woken relay publishes", || {
        unpublished(&db) == 0
    });
    wait_for_listeners(&db, all.len(), Duration::from_secs(60));
    worker.stop();

    // Every event's task exists exactly once: completed, and nowhere else.
    let in_cluster = |command: &str, key: &str| -> Vec<String> {
        cli(&["-c", "-p", &ports[0].to_string(), command, key, "0", "-1"])
            .unwrap_or_else(|| panic!("redis-cli could not read {key} in the cluster"))
            .lines()
            .filter(|line| !line.is_empty())
            .map(str::to_string)
            .collect()
    };
    let completed: BTreeSet<String> = in_cluster("ZRANGE", "asynq:{default}:completed")
        .into_iter()
        .collect();
    let delivered = all.iter().filter(|id| completed.contains(*id)).count();
    eprintln!(
        "cluster: {delivered} of {} events delivered as tasks",
        all.len()
    );
    assert_eq!(delivered, all.len(), "an event task is missing");
    // asynq's count of processed tasks (what asynqmon shows): per event,
    // its event task and the task of each of its two listeners, so a task
    // run twice would show here too.
    let processed: u64 = cli(&[
        "-c",
        "-p",
        &ports[0].to_string(),
        "GET",
        "asynq:{default}:processed",
    ])
    .expect("redis-cli reads the processed counter")
    .parse()
    .unwrap();
    assert_eq!(
        processed,
        3 * all.len() as u64,
        "tasks processed: a task ran twice or not at all"
    );
    // Every run counts (the listeners record each one, no DISTINCT here):
    // both listeners ran exactly once for every event.
    let runs = count(&db, "SELECT count(*) FROM listener_runs");
    assert_eq!(
        runs,
        2 * all.len() as u64,
        "a listener ran twice or not at all"
    );
    // And no task of any kind is left anywhere else.
    for (command, key) in [
        ("LRANGE", "asynq:{default}:pending"),
        ("LRANGE", "asynq:{default}:active"),
        ("ZRANGE", "asynq:{default}:scheduled"),
        ("ZRANGE", "asynq:{default}:retry"),
        ("ZRANGE", "asynq:{default}:archived"),
    ] {
        let left = in_cluster(command, key);
        assert!(
            left.is_empty(),
            "{key} still holds {} task(s): {left:?}",
            left.len()
        );
    }

    // Go asynq's cluster client (RedisClusterClientOpt) reads the same
    // tasks: every event task is a completed `event:orderPlaced` to it.
    let Some(peer) = crate::go_peers::go_peer("asynqpeer") else {
        return;
    };
    let listed = Command::new(peer)
        .args(["list", "default", "completed"])
        .env("VALKEY_CLUSTER_ADDRS", &cluster_addrs)
        .output()
        .unwrap();
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    let seen_by_go: BTreeSet<String> = String::from_utf8(listed.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter(|task| task["type"] == "event:orderPlaced")
        .map(|task| task["id"].as_str().unwrap().to_string())
        .collect();
    eprintln!(
        "cluster: Go asynq's cluster client lists {} completed event tasks",
        seen_by_go.len()
    );
    assert!(
        all.iter().all(|id| seen_by_go.contains(id)),
        "Go asynq's cluster client misses some event tasks"
    );
}

/// The TLS arguments of a server whose certificate (for 127.0.0.1) and CA
/// are `srv.pem`/`srv.key` and `ca.pem` in `dir`, made once per directory.
fn tls_only_args(dir: &Path, port: u16) -> Vec<String> {
    if !dir.join("srv.pem").exists() {
        make_ca(dir, "ca");
        make_server_cert(dir, "ca", "srv", "127.0.0.1", "IP:127.0.0.1,DNS:localhost");
    }
    let file = |name: &str| dir.join(name).display().to_string();
    vec![
        "--port".into(),
        "0".into(),
        "--tls-port".into(),
        port.to_string(),
        "--tls-cert-file".into(),
        file("srv.pem"),
        "--tls-key-file".into(),
        file("srv.key"),
        "--tls-ca-cert-file".into(),
        file("ca.pem"),
        "--tls-auth-clients".into(),
        "no".into(),
    ]
}

/// redis-cli over TLS, trusting `ca.pem` in `dir`, with `args`.
fn tls_cli(dir: &Path, args: &[&str]) -> Option<String> {
    let ca = dir.join("ca.pem").display().to_string();
    let mut all = vec!["--tls", "--cacert", &ca];
    all.extend(args);
    cli(&all)
}

#[test]
#[ignore = "builds a generated project"]
fn with_valkey_tls_a_sentinel_group_speaking_only_tls_carries_events() {
    let dir = tempfile::tempdir().unwrap();
    let (master_port, sentinel_port) = (free_port(), free_port());
    let mut args = tls_only_args(dir.path(), master_port);
    args.extend(["--tls-replication".into(), "yes".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let _master = Server::start_on(master_port, dir.path(), &args);
    wait_until(Duration::from_secs(10), "the TLS master answers", || {
        tls_cli(dir.path(), &["-p", &master_port.to_string(), "PING"]).as_deref() == Some("PONG")
    });
    let file = |name: &str| dir.path().join(name).display().to_string();
    let conf = dir.path().join("sentinel.conf");
    std::fs::write(
        &conf,
        format!(
            "port 0\ntls-port {sentinel_port}\nbind 127.0.0.1\ndir {}\n\
             tls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n\
             tls-auth-clients no\ntls-replication yes\n\
             sentinel monitor m1 127.0.0.1 {master_port} 1\n",
            dir.path().display(),
            file("srv.pem"),
            file("srv.key"),
            file("ca.pem"),
        ),
    )
    .unwrap();
    let sentinel = Command::new("redis-server")
        .arg(&conf)
        .arg("--sentinel")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let _sentinel = SentinelProcess(sentinel);
    wait_until(
        Duration::from_secs(20),
        "the TLS sentinel names the master",
        || {
            tls_cli(
                dir.path(),
                &[
                    "-p",
                    &sentinel_port.to_string(),
                    "SENTINEL",
                    "GET-MASTER-ADDR-BY-NAME",
                    "m1",
                ],
            )
            .is_some_and(|out| out.contains(&master_port.to_string()))
        },
    );

    let db = database();
    let events = commit_events(&db, 300);
    let sentinels = format!("127.0.0.1:{sentinel_port}");
    let master_port_text = master_port.to_string();
    let ca = file("ca.pem");
    let worker = Worker::start(
        &db,
        dir.path(),
        &[
            ("VALKEY_SENTINEL_ADDRS", &sentinels),
            ("VALKEY_SENTINEL_MASTER", "m1"),
            ("VALKEY_TLS", "true"),
            ("VALKEY_CA_CERT", &ca),
            ("OUTBOX_WAKE", "valkey"),
            SCHEDULER_ON,
        ],
    );
    wait_for_listeners(&db, events.len(), Duration::from_secs(120));
    let on_master = |args: &[&str]| {
        let mut all = vec!["-p", &*master_port_text];
        all.extend_from_slice(args);
        tls_cli(dir.path(), &all)
    };
    assert_the_scheduler_leads(&worker, &on_master);
    worker.stop();
    assert_the_scheduler_stepped_down(&on_master);

    // Without VALKEY_TLS the worker speaks plaintext to a TLS-only sentinel
    // and cannot start.
    let mut plaintext = Worker::start(
        &db,
        dir.path(),
        &[
            ("VALKEY_SENTINEL_ADDRS", &sentinels),
            ("VALKEY_SENTINEL_MASTER", "m1"),
        ],
    );
    assert_ne!(plaintext.exit_code(Duration::from_secs(60)), Some(0));
    assert!(
        plaintext.log().contains("cannot connect to Valkey"),
        "{}",
        plaintext.log()
    );
}

#[test]
#[ignore = "builds a generated project"]
fn with_valkey_tls_a_cluster_speaking_only_tls_carries_events() {
    let dir = tempfile::tempdir().unwrap();
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let _nodes: Vec<Server> = ports
        .iter()
        .map(|port| {
            let node_dir = dir.path().join(port.to_string());
            std::fs::create_dir_all(&node_dir).unwrap();
            let mut args = tls_only_args(dir.path(), *port);
            args.extend(["--tls-cluster", "yes", "--cluster-enabled", "yes"].map(String::from));
            args.extend(["--cluster-config-file".into(), "nodes.conf".into()]);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            Server::start_on(*port, &node_dir, &args)
        })
        .collect();
    for port in &ports {
        wait_until(Duration::from_secs(10), "the TLS node answers", || {
            tls_cli(dir.path(), &["-p", &port.to_string(), "PING"]).as_deref() == Some("PONG")
        });
    }
    let addrs: Vec<String> = ports
        .iter()
        .map(|port| format!("127.0.0.1:{port}"))
        .collect();
    let mut create = vec!["--cluster", "create"];
    create.extend(addrs.iter().map(String::as_str));
    create.push("--cluster-yes");
    tls_cli(dir.path(), &create).expect("redis-cli --tls --cluster create");
    for port in &ports {
        wait_until(Duration::from_secs(30), "the cluster is ok", || {
            tls_cli(dir.path(), &["-p", &port.to_string(), "CLUSTER", "INFO"])
                .is_some_and(|info| info.contains("cluster_state:ok"))
        });
    }

    let db = database();
    let events = commit_events(&db, 500);
    let ca = dir.path().join("ca.pem").display().to_string();
    let worker = Worker::start(
        &db,
        dir.path(),
        &[
            ("VALKEY_CLUSTER_ADDRS", &addrs.join(",")),
            ("VALKEY_TLS", "true"),
            ("VALKEY_CA_CERT", &ca),
            ("OUTBOX_WAKE", "valkey"),
            SCHEDULER_ON,
        ],
    );
    wait_for_listeners(&db, events.len(), Duration::from_secs(180));
    // Keys are read with redirects followed; KEYS asks every node.
    let port_texts: Vec<String> = ports.iter().map(u16::to_string).collect();
    let in_cluster = |args: &[&str]| {
        if args[0] == "KEYS" {
            let mut found = String::new();
            for port in &port_texts {
                let mut all = vec!["-p", port.as_str()];
                all.extend_from_slice(args);
                let keys = tls_cli(dir.path(), &all)?;
                if !keys.is_empty() {
                    found = format!("{found}{keys}\n");
                }
            }
            return Some(found.trim_end().to_string());
        }
        let mut all = vec!["-c", "-p", port_texts[0].as_str()];
        all.extend_from_slice(args);
        tls_cli(dir.path(), &all)
    };
    assert_the_scheduler_leads(&worker, &in_cluster);
    worker.stop();
    assert_the_scheduler_stepped_down(&in_cluster);

    // Every event's task is completed on the cluster, once.
    let completed: Vec<String> = tls_cli(
        dir.path(),
        &[
            "-c",
            "-p",
            &ports[0].to_string(),
            "ZRANGE",
            "asynq:{default}:completed",
            "0",
            "-1",
        ],
    )
    .unwrap_or_default()
    .lines()
    .map(str::to_string)
    .collect();
    let unique: BTreeSet<String> = completed.iter().cloned().collect();
    assert_eq!(unique.len(), completed.len());
    assert!(
        events.iter().all(|id| unique.contains(id)),
        "an event task is missing"
    );
}
