//! Secrets in healthy runs. A Postgres cluster of the test's own that asks
//! the service's role for its password (scram-sha-256; the suite's own
//! cluster trusts every connection, so there a password is never sent), a
//! Redis that requires passwords (the default user's and an ACL user's),
//! and a Sentinel with a password of its own. The generated `server`,
//! `worker`, `migrate` and `outbox` and `gpkit doctor` each do real work
//! with logs at debug level, given the passwords in every accepted form:
//! Postgres `user:password@` and `?password=`, `VALKEY_URL` with
//! `user:password@`, `VALKEY_ADDR` with `VALKEY_PASSWORD`, the Sentinel's
//! `VALKEY_SENTINEL_PASSWORD`, and all of it once through `.env`. Each run
//! must have authenticated (rows written, a task processed, the doctor's
//! checks passed), and none of their output (stdout, stderr, the log
//! files) holds a password, raw or URL-encoded. A wrong password is
//! refused, so the password path is real.
//!
//! The project is the one `valkey_infra` builds (an event with two
//! listeners that record their runs); the runs happen in a copy of its
//! directory, so that the `.env` written here is seen by no other test.

use std::hash::{BuildHasher, RandomState};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::e2e::psql;
use crate::kit_migrations::KIT;
use crate::own_postgres::OwnPostgres;
use crate::support::{gpkit, http_get, read_tree};
use crate::worker_e2e::{RedisServer, free_port, wait_until};

/// A password: a random token in a text that URL encoding changes, so that
/// its raw and its encoded form differ.
struct Secret {
    raw: String,
    token: String,
}

impl Secret {
    fn new(kind: &str) -> Self {
        let token = format!("{:016x}", RandomState::new().hash_one(kind));
        Self {
            raw: format!("{kind}-{token}@:/%+!"),
            token,
        }
    }

    /// The password as it goes into a URL.
    fn encoded(&self) -> String {
        encode(&self.raw)
    }

    /// Where `text` shows this password: raw, URL-encoded, or any other way
    /// that keeps its random token.
    fn found_in(&self, text: &str) -> Option<usize> {
        [self.raw.clone(), self.encoded(), self.token.clone()]
            .iter()
            .find_map(|form| text.find(form.as_str()))
    }
}

/// Percent-encodes everything but the unreserved characters.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Every password of the test, with the name its leak is reported under.
struct Secrets {
    postgres: Secret,
    valkey: Secret,
    acl_user: Secret,
    sentinel: Secret,
    wrong: Secret,
}

impl Secrets {
    /// Fails naming `run` and the password when `text` holds any of them
    /// (the text logs' colours taken out first, so none can split one).
    fn assert_absent(&self, run: &str, text: &str) {
        let text = &without_colours(text);
        for (name, secret) in [
            ("the Postgres password", &self.postgres),
            ("the Valkey password", &self.valkey),
            ("the ACL user's password", &self.acl_user),
            ("the Sentinel password", &self.sentinel),
            ("the wrong password", &self.wrong),
        ] {
            if let Some(at) = secret.found_in(text) {
                let start = text[..at]
                    .char_indices()
                    .rev()
                    .nth(200)
                    .map_or(0, |(i, _)| i);
                let end = text[at..]
                    .char_indices()
                    .nth(200)
                    .map_or(text.len(), |(i, _)| at + i);
                panic!(
                    "{run}: the output holds {name} (raw, URL-encoded or its token):\n...{}...",
                    &text[start..end]
                );
            }
        }
    }
}

/// `text` without its ANSI escape sequences (`ESC [ ... letter`).
fn without_colours(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The environment made of `parts`, in order (a later value wins).
fn with<'a>(parts: &[&[(&'a str, &'a str)]]) -> Vec<(&'a str, &'a str)> {
    parts.concat()
}

/// Standard output and error of `output`, as one text.
fn both(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The project's binary `name`, started in `dir` with only `env` (and PATH).
/// The project's schedule stays off, so that its tasks are the events'.
fn command(name: &str, dir: &Path, env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(crate::valkey_infra::bin(name));
    command
        .current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("SCHEDULER_ENABLED", "false")
        .envs(env.iter().copied())
        .stdin(Stdio::null());
    command
}

/// `server` or `worker`, its stdout and stderr in files.
struct Service {
    child: Child,
    out: PathBuf,
    err: PathBuf,
}

impl Service {
    fn start(name: &str, dir: &Path, env: &[(&str, &str)]) -> Self {
        let port = free_port();
        let out = dir.join(format!("{name}-{port}.out"));
        let err = dir.join(format!("{name}-{port}.err"));
        let child = command(name, dir, env)
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap();
        Self { child, out, err }
    }

    fn output(&self) -> String {
        let read = |path: &Path| std::fs::read_to_string(path).unwrap_or_default();
        format!("{}{}", read(&self.out), read(&self.err))
    }

    /// SIGTERM, a clean exit within 30 s; everything it wrote.
    fn stop(mut self) -> String {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "did not stop: {}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "{status}: {}", self.output());
        self.output()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A sentinel watching `m1` on `master_port`, asking its clients for
/// `password`; killed on drop.
struct Sentinel(Child);

impl Sentinel {
    fn start(dir: &Path, port: u16, master_port: u16, master: &str, password: &str) -> Self {
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nrequirepass \"{password}\"\n\
                 sentinel monitor m1 127.0.0.1 {master_port} 1\n\
                 sentinel auth-pass m1 \"{master}\"\n",
                dir.display()
            ),
        )
        .unwrap();
        let child = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server runs (Debian: redis-server)");
        Self(child)
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `gpkit doctor --format json` in `dir` with only `env` of the project's
/// settings: its exit code, its report and everything it wrote.
fn doctor(dir: &Path, env: &[(&str, &str)]) -> (i32, Value, String) {
    let mut cmd = gpkit(dir);
    for (name, _) in std::env::vars() {
        if name.starts_with("VALKEY_") || name.starts_with("DATABASE_") || name == "GOOSE_TABLE" {
            cmd.env_remove(name);
        }
    }
    let output = cmd
        .args(["doctor", "--format", "json"])
        .env("RUST_LOG", "debug")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let report = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|err| panic!("{err}: {}", both(&output)));
    (output.status.code().unwrap(), report, both(&output))
}

/// The status of `check` in a doctor report, with its detail.
fn finding(report: &Value, check: &str) -> (String, String) {
    let found = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == check)
        .unwrap_or_else(|| panic!("no {check} in {report}"));
    let text = |key: &str| found[key].as_str().unwrap_or_default().to_string();
    (text("status"), text("detail"))
}

/// Asserts that doctor passed every check that needs a password.
fn assert_doctor_ok(run: &str, (code, report, _): &(i32, Value, String)) {
    for check in ["env", "postgres", "migrations", "valkey"] {
        assert_eq!(finding(report, check).0, "ok", "{run}: {check}: {report}");
    }
    assert_eq!(*code, 0, "{run}: {report}");
}

#[test]
#[ignore = "builds a generated project"]
fn every_binary_authenticates_with_every_password_form_and_prints_no_password() {
    // Built once for this test binary (valkey_infra's tests use it too).
    let project = crate::valkey_infra::project();
    let started = Instant::now();
    let secrets = Secrets {
        postgres: Secret::new("pg"),
        valkey: Secret::new("vk"),
        acl_user: Secret::new("acl"),
        sentinel: Secret::new("sen"),
        wrong: Secret::new("wrong"),
    };

    // Postgres: the superuser is trusted (for the test's own SQL), the
    // service's role `app` must give its password.
    let pg = OwnPostgres::start(
        &[("password_encryption", "scram-sha-256")],
        Some(
            "local all all trust\n\
             host all postgres 127.0.0.1/32 trust\n\
             host all all 127.0.0.1/32 scram-sha-256\n",
        ),
    );
    let admin = |db: &str| format!("postgres://postgres@127.0.0.1:{}/{db}", pg.port);
    psql(
        &admin("postgres"),
        &format!("CREATE ROLE app LOGIN PASSWORD '{}'", secrets.postgres.raw),
    );
    psql(&admin("postgres"), "CREATE DATABASE shop OWNER app");
    assert_eq!(
        psql(
            &admin("postgres"),
            "SELECT rolpassword LIKE 'SCRAM-SHA-256$%' FROM pg_authid WHERE rolname = 'app'"
        ),
        "t"
    );
    let shop = admin("shop");
    let pg_userinfo = format!(
        "postgres://app:{}@127.0.0.1:{}/shop",
        secrets.postgres.encoded(),
        pg.port
    );
    let pg_query = format!(
        "postgres://app@127.0.0.1:{}/shop?password={}",
        pg.port,
        secrets.postgres.encoded()
    );

    // Redis: the default user's password, an ACL user with its own, and a
    // sentinel with a third.
    let redis = RedisServer::start_with_persistence(
        "redis-server",
        &["--requirepass", &secrets.valkey.raw, "--appendonly", "no"],
    );
    let as_default = ["--no-auth-warning", "-a", secrets.valkey.raw.as_str()];
    let acl_pass = format!(">{}", secrets.acl_user.raw);
    let mut setuser = as_default.to_vec();
    setuser.extend([
        "ACL", "SETUSER", "relay", "on", &acl_pass, "~*", "&*", "+@all",
    ]);
    assert_eq!(redis.cli(&setuser).as_deref(), Some("OK"));
    let valkey_port = redis.addr().rsplit_once(':').unwrap().1.to_string();
    let sentinel_dir = tempfile::tempdir().unwrap();
    let sentinel_port = free_port();
    let _sentinel = Sentinel::start(
        sentinel_dir.path(),
        sentinel_port,
        valkey_port.parse().unwrap(),
        &secrets.valkey.raw,
        &secrets.sentinel.raw,
    );
    wait_until(
        Duration::from_secs(20),
        "the sentinel names the master",
        || {
            let out = Command::new("redis-cli")
                .args(["-p", &sentinel_port.to_string(), "--no-auth-warning", "-a"])
                .args([
                    &secrets.sentinel.raw,
                    "SENTINEL",
                    "GET-MASTER-ADDR-BY-NAME",
                    "m1",
                ])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).contains(&valkey_port)
        },
    );
    let valkey_url = format!(
        "redis://relay:{}@{}/0",
        secrets.acl_user.encoded(),
        redis.addr()
    );
    let sentinel_addrs = format!("127.0.0.1:{sentinel_port}");
    let url_form = [("VALKEY_URL", valkey_url.as_str())];
    let valkey_addr = redis.addr();
    let addr_form = [
        ("VALKEY_ADDR", valkey_addr.as_str()),
        ("VALKEY_PASSWORD", secrets.valkey.raw.as_str()),
    ];
    let sentinel_form = [
        ("VALKEY_SENTINEL_ADDRS", sentinel_addrs.as_str()),
        ("VALKEY_SENTINEL_MASTER", "m1"),
        ("VALKEY_SENTINEL_PASSWORD", secrets.sentinel.raw.as_str()),
        ("VALKEY_PASSWORD", secrets.valkey.raw.as_str()),
    ];

    // A copy of the project, for the runs and for `.env`.
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("infra");
    for (path, contents) in read_tree(project, &[".bin", ".env"]) {
        let dest = dir.join(path);
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::write(dest, contents).unwrap();
    }
    let debug = [("RUST_LOG", "debug")];
    let run = |name: &str, label: &str, env: &[(&str, &str)], args: &[&str]| -> Output {
        let output = command(name, &dir, env).args(args).output().unwrap();
        secrets.assert_absent(label, &both(&output));
        output
    };
    let ok = |name: &str, label: &str, env: &[(&str, &str)], args: &[&str]| -> String {
        let output = run(name, label, env, args);
        assert!(output.status.success(), "{label}: {}", both(&output));
        both(&output)
    };
    let stdout_json = |name: &str, label: &str, env: &[(&str, &str)], args: &[&str]| {
        let output = run(name, label, env, args);
        assert!(output.status.success(), "{label}: {}", both(&output));
        serde_json::from_slice::<Value>(&output.stdout).unwrap()
    };

    // A wrong password is refused: Postgres really asks for it.
    let wrong_url = format!(
        "postgres://app:{}@127.0.0.1:{}/shop",
        secrets.wrong.encoded(),
        pg.port
    );
    let refused = run(
        "migrate",
        "migrate status, a wrong password",
        &with(&[&debug, &[("DATABASE_URL", wrong_url.as_str())]]),
        &["status"],
    );
    assert!(!refused.status.success());
    assert!(
        both(&refused).contains("password authentication failed for user \"app\""),
        "{}",
        both(&refused)
    );
    let wrong_valkey = [
        ("DATABASE_URL", wrong_url.as_str()),
        ("VALKEY_ADDR", &redis.addr()),
        ("VALKEY_PASSWORD", &secrets.wrong.raw),
    ];
    let (code, report, output) = doctor(&dir, &wrong_valkey);
    secrets.assert_absent("doctor, wrong passwords", &output);
    assert_eq!(code, 1);
    assert!(
        finding(&report, "postgres").1.contains("password"),
        "{report}"
    );
    let (status, detail) = finding(&report, "valkey");
    assert_eq!(status, "fail");
    assert!(detail.contains("refused the credentials"), "{detail}");

    // migrate: `up` with user:password@, `status` with ?password=.
    ok(
        "migrate",
        "migrate up, DATABASE_URL with user:password@",
        &with(&[&debug, &[("DATABASE_URL", pg_userinfo.as_str())]]),
        &["up"],
    );
    assert_eq!(
        psql(
            &shop,
            "SELECT count(*) FROM goose_db_version WHERE version_id > 0"
        ),
        (KIT.len() + 1).to_string(),
        "the kit's migrations and the project's"
    );
    let status = ok(
        "migrate",
        "migrate status, DATABASE_URL with ?password=",
        &with(&[&debug, &[("DATABASE_URL", pg_query.as_str())]]),
        &["status"],
    );
    assert!(status.contains("_listener_runs.sql"), "{status}");
    assert!(!status.contains("Pending"), "{status}");

    // server: ready (its pool reached the database) with ?password=, and
    // VALKEY_ADDR with VALKEY_PASSWORD for its wake-ups, which reach Valkey.
    let http = free_port();
    let http_addr = format!("127.0.0.1:{http}");
    let server = Service::start(
        "server",
        &dir,
        &with(&[
            &debug,
            &[("DATABASE_URL", pg_query.as_str())],
            &[("HTTP_ADDR", http_addr.as_str()), ("OUTBOX_WAKE", "valkey")],
            &addr_form,
        ]),
    );
    wait_until(Duration::from_secs(20), "the server is ready", || {
        http_get(http, "/readyz").0 == 200
    });
    // Its own Valkey connection, opened for the wake-up of its first
    // commit, authenticates: that wake-up reaches a subscriber of the
    // wake-up channel. The order is removed again before the workers run.
    let wake_ups = Subscriber::start(&redis.addr(), &secrets.valkey.raw, "outbox:wake");
    let (status, body) = crate::example::request(
        &http_addr,
        "POST",
        "/orders",
        Some(r#"{"order_id": 100, "note": "a wake-up"}"#),
    )
    .expect("the server answers");
    assert_eq!(status, 202, "{body}");
    wake_ups.wait_for_a_message(Duration::from_secs(20));
    psql(
        &shop,
        "DELETE FROM outbox_events WHERE payload->>'note' = 'a wake-up'",
    );
    let log = server.stop();
    assert!(log.contains("DEBUG"), "no debug logs: {log}");
    secrets.assert_absent("server, ?password= and VALKEY_PASSWORD", &log);

    // worker: one event each through VALKEY_URL with user:password@ and
    // DATABASE_URL with user:password@ (text logs), then through the
    // Sentinel and ?password= (JSON logs).
    let worker_env = [
        ("WORKER_QUEUES", "default=1"),
        ("WORKER_METRICS_ADDR", "127.0.0.1:0"),
        ("OUTBOX_POLL_INTERVAL", "100ms"),
        ("OUTBOX_WAKE", "valkey"),
    ];
    let runs = || -> u64 {
        psql(&shop, "SELECT count(*) FROM listener_runs")
            .parse()
            .unwrap()
    };
    let mut events = Vec::new();
    for (round, (label, pg_url, valkey, format)) in [
        (
            "worker, VALKEY_URL and DATABASE_URL with user:password@",
            pg_userinfo.as_str(),
            url_form.as_slice(),
            "text",
        ),
        (
            "worker, the Sentinel's password and ?password=",
            pg_query.as_str(),
            sentinel_form.as_slice(),
            "json",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        events.push(
            psql(
                &shop,
                &format!(
                    "INSERT INTO outbox_events (event_id, event_name, payload) VALUES \
                 (gen_random_uuid(), 'orderPlaced', '{{\"order_id\": {round}, \"note\": \"n\"}}') \
                 RETURNING event_id"
                ),
            )
            .lines()
            .next()
            .unwrap()
            .to_string(),
        );
        let worker = Service::start(
            "worker",
            &dir,
            &with(&[
                &debug,
                &[("LOG_FORMAT", format), ("DATABASE_URL", pg_url)],
                &worker_env,
                valkey,
            ]),
        );
        let expected = 2 * (round as u64 + 1);
        wait_until(Duration::from_secs(60), "both listeners ran", || {
            runs() == expected
        });
        let log = worker.stop();
        let level = if format == "json" {
            "\"level\":\"DEBUG\""
        } else {
            "DEBUG"
        };
        assert!(log.contains(level), "{label}: no debug logs: {log}");
        secrets.assert_absent(label, &log);
    }

    // outbox: status (VALKEY_ADDR), show (VALKEY_URL, then the Sentinel),
    // list (Postgres only).
    let outbox_env = [("WORKER_QUEUES", "default=1")];
    let status = stdout_json(
        "outbox",
        "outbox status, VALKEY_PASSWORD and user:password@",
        &with(&[
            &debug,
            &[("DATABASE_URL", pg_userinfo.as_str())],
            &outbox_env,
            &addr_form,
        ]),
        &["status", "--format", "json"],
    );
    assert_eq!(status["outbox"]["unpublished"], 0, "{status}");
    assert_eq!(status["queues"][0]["completed"], 6, "{status}");
    let shown = stdout_json(
        "outbox",
        "outbox show, VALKEY_URL with user:password@ and ?password=",
        &with(&[
            &debug,
            &[("DATABASE_URL", pg_query.as_str())],
            &outbox_env,
            &url_form,
        ]),
        &["show", &events[0], "--format", "json"],
    );
    assert_eq!(shown["event_tasks"][0]["state"], "completed", "{shown}");
    assert_eq!(shown["listener_tasks"][1]["state"], "completed", "{shown}");
    let listed = stdout_json(
        "outbox",
        "outbox list, user:password@ (the Sentinel's settings given)",
        &with(&[
            &debug,
            &[("DATABASE_URL", pg_userinfo.as_str())],
            &outbox_env,
            &sentinel_form,
        ]),
        &["list", "--format", "json"],
    );
    assert_eq!(listed["events"].as_array().unwrap().len(), 2, "{listed}");
    let sentinel_shown = stdout_json(
        "outbox",
        "outbox show, the Sentinel's password",
        &with(&[
            &debug,
            &[("DATABASE_URL", pg_query.as_str())],
            &outbox_env,
            &sentinel_form,
        ]),
        &["show", &events[1], "--format", "json"],
    );
    assert_eq!(
        sentinel_shown["event_tasks"][0]["state"], "completed",
        "{sentinel_shown}"
    );

    // gpkit doctor: VALKEY_URL with user:password@, then the Sentinel.
    let doctored = doctor(
        &dir,
        &with(&[&[("DATABASE_URL", pg_userinfo.as_str())], &url_form]),
    );
    secrets.assert_absent("doctor, VALKEY_URL and user:password@", &doctored.2);
    assert_doctor_ok("doctor, VALKEY_URL and user:password@", &doctored);
    let doctored = doctor(
        &dir,
        &with(&[&[("DATABASE_URL", pg_query.as_str())], &sentinel_form]),
    );
    secrets.assert_absent(
        "doctor, the Sentinel's password and ?password=",
        &doctored.2,
    );
    assert_doctor_ok("doctor, the Sentinel's password and ?password=", &doctored);
    assert!(
        finding(&doctored.1, "valkey").1.contains("every sentinel"),
        "{}",
        doctored.1
    );

    // Everything once more through `.env` (nothing in the environment):
    // migrate, the server, outbox, doctor.
    let http = free_port();
    std::fs::write(
        dir.join(".env"),
        format!(
            "# local settings\nDATABASE_URL={pg_userinfo}\nVALKEY_ADDR={valkey_addr}\n\
             VALKEY_PASSWORD='{}'\nRUST_LOG=debug\nWORKER_QUEUES=default=1\n\
             HTTP_ADDR=127.0.0.1:{http}\n",
            secrets.valkey.raw
        ),
    )
    .unwrap();
    let status = ok("migrate", "migrate status, .env", &[], &["status"]);
    assert!(status.contains("_listener_runs.sql"), "{status}");
    assert!(!status.contains("Pending"), "{status}");
    let server = Service::start("server", &dir, &[]);
    wait_until(Duration::from_secs(20), "the server is ready", || {
        http_get(http, "/readyz").0 == 200
    });
    let log = server.stop();
    assert!(log.contains("DEBUG"), "no debug logs: {log}");
    secrets.assert_absent("server, .env", &log);
    let status = stdout_json(
        "outbox",
        "outbox status, .env",
        &[],
        &["status", "--format", "json"],
    );
    assert_eq!(status["queues"][0]["completed"], 6, "{status}");
    let doctored = doctor(&dir, &[]);
    secrets.assert_absent("doctor, .env", &doctored.2);
    assert_doctor_ok("doctor, .env", &doctored);
    assert_eq!(
        finding(&doctored.1, "env").1,
        "read .env; variables set in the environment win over it"
    );
    eprintln!(
        "secrets: every run authenticated and printed no password, in {:.1?} (the project's build not counted)",
        started.elapsed()
    );
}

#[test]
fn the_scan_sees_through_colours_and_url_encoding() {
    assert_eq!(
        without_colours("\u{1b}[2mtime\u{1b}[0m \u{1b}[34mDEBUG\u{1b}[0m x"),
        "time DEBUG x"
    );
    let secret = Secret::new("pg");
    assert_ne!(secret.raw, secret.encoded());
    for shown in [secret.raw.clone(), secret.encoded(), secret.token.clone()] {
        assert!(
            secret.found_in(&format!("url={shown}")).is_some(),
            "{shown}"
        );
    }
    assert!(secret.found_in("url=postgres://app:***@db/shop").is_none());
}

/// `redis-cli SUBSCRIBE` to one channel, as the default user with its
/// password, its output read line by line as it comes.
struct Subscriber {
    child: Child,
    lines: crate::support::Lines,
}

impl Subscriber {
    /// Subscribed to `channel` on the Valkey at `addr` (`host:port`): it
    /// has answered the subscription.
    fn start(addr: &str, password: &str, channel: &str) -> Self {
        let (host, port) = addr.rsplit_once(':').unwrap();
        let mut child = Command::new("redis-cli")
            .args(["-h", host, "-p", port, "--no-auth-warning", "-a", password])
            .args(["SUBSCRIBE", channel])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-cli starts");
        let mut lines = crate::support::Lines::read(child.stdout.take().unwrap());
        lines.wait_for(
            "the subscription's answer",
            Duration::from_secs(10),
            |line| line == "subscribe",
        );
        Self { child, lines }
    }

    /// Waits until a message is published on the channel.
    fn wait_for_a_message(mut self, within: Duration) {
        self.lines
            .wait_for("a message on the channel", within, |line| line == "message");
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
