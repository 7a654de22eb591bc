//! What the kit's integration tests share: a throwaway database per test,
//! the migrations to apply to it, and a queue of a test's own. (A
//! configuration that needs no environment is `kit::testing::config`.)

// Each test binary uses a different part of this module.
#![allow(dead_code)]

// goose's own view of a migrated database, shared with the binaries' test
// program (`tests/binaries.rs`), which cannot reach this module.
#[path = "../../tests/support/goose.rs"]
pub mod goose;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
#[cfg(feature = "worker")]
use std::process::{Child, Stdio};
use std::str::FromStr;
#[cfg(feature = "worker")]
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Connection, Executor, PgConnection};

use crate::migrate;
#[cfg(feature = "worker")]
use crate::queue;

/// Whether what a test needs (`what`: a server binary, a tool) is here, as
/// `available` says; when it is not, the test should return. The one skip
/// rule of the kit's tests: a test that returns early proves nothing, so
/// under CI (`CI=true`) a missing need fails the test, naming it and `how`
/// to get it; elsewhere the test prints `skipped: <test>: ...` on stderr.
pub fn require(what: &str, available: bool, how: &str) -> bool {
    if available {
        return true;
    }
    // libtest names each test's thread after the test.
    let test = std::thread::current()
        .name()
        .unwrap_or("a test")
        .to_string();
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{test}: {what} is missing, and CI=true: {how}"
    );
    eprintln!("skipped: {test}: {what} is missing ({how})");
    false
}

/// The Valkey (or Redis) the tests use: `VALKEY_ADDR`, by default
/// 127.0.0.1:6379.
pub fn valkey_addr() -> String {
    std::env::var("VALKEY_ADDR").unwrap_or_else(|_| "127.0.0.1:6379".into())
}

/// Polls `check` every 50 ms until it holds, failing after `limit`: the
/// tests wait on conditions, not on clocks.
pub async fn eventually<F, Fut>(limit: std::time::Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = std::time::Instant::now();
    while !check().await {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// The project's migrations, which hold the kit's (goose reads one
/// folder): `migrations/` next to `kit/` in a generated project, and in
/// gpkit's repository, where the kit is `templates/kit`, the project
/// template's `templates/project/migrations/`.
pub fn migrations_dir() -> PathBuf {
    let kit = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let project = kit.join("../migrations");
    if project.is_dir() {
        project
    } else {
        kit.join("../project/migrations")
    }
}

/// A database created for one test and dropped (with `FORCE`) when the value
/// is dropped, also when the test fails.
pub struct TestDatabase {
    pub pool: PgPool,
    pub options: PgConnectOptions,
    name: String,
    admin: PgConnectOptions,
}

impl TestDatabase {
    /// The URL of the database, for a process of its own.
    pub fn url(&self) -> String {
        let mut url = url::Url::parse(&std::env::var("DATABASE_URL").unwrap()).unwrap();
        url.set_path(&self.name);
        url.to_string()
    }

    /// Creates an empty database on the server `DATABASE_URL` points at.
    pub async fn empty() -> Self {
        let url = std::env::var("DATABASE_URL").expect(
            "these tests need a Postgres server: set DATABASE_URL, \
             e.g. postgres://postgres@127.0.0.1:5432/postgres",
        );
        let admin = PgConnectOptions::from_str(&url).expect("DATABASE_URL is a Postgres URL");
        let name = format!("test_{}", uuid::Uuid::now_v7().simple());
        let mut conn = PgConnection::connect_with(&admin)
            .await
            .expect("connect to DATABASE_URL");
        conn.execute(format!(r#"CREATE DATABASE "{name}""#).as_str())
            .await
            .expect("create the test database");
        conn.close().await.ok();
        let options = admin.clone().database(&name);
        let pool = PgPoolOptions::new()
            .max_connections(5)
            .connect_with(options.clone())
            .await
            .expect("connect to the test database");
        Self {
            pool,
            options,
            name,
            admin,
        }
    }

    /// Creates a database with every migration of [`migrations_dir`]
    /// applied by the kit's goose runner.
    pub async fn migrated() -> Self {
        let db = Self::empty().await;
        migrate::testing::up(&db.pool, migrations_dir())
            .await
            .expect("apply the migrations");
        db
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let admin = self.admin.clone();
        let name = std::mem::take(&mut self.name);
        // Drop runs inside the test's runtime, which cannot block on async
        // work; a separate thread with its own runtime can.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime to drop the test database");
            runtime.block_on(async move {
                let mut conn = PgConnection::connect_with(&admin).await?;
                conn.execute(format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#).as_str())
                    .await?;
                conn.close().await
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("warning: failed to drop a test database");
        }
    }
}

/// A queue name of its own for one test on the shared Valkey/Redis
/// (`VALKEY_ADDR`, default 127.0.0.1:6379); its keys are deleted on drop.
#[cfg(feature = "worker")]
pub struct TestQueue {
    pub name: String,
    pub client: queue::Client,
    redis: redis::Client,
}

#[cfg(feature = "worker")]
impl TestQueue {
    pub async fn new() -> Self {
        Self::on(&valkey_addr()).await
    }

    /// A queue of its own on the server at `addr`.
    pub async fn on(addr: &str) -> Self {
        let name = format!("test_{}", uuid::Uuid::now_v7().simple());
        let client = queue::Client::connect(addr, None, 0)
            .await
            .expect("these tests need Valkey or Redis at VALKEY_ADDR (default 127.0.0.1:6379)");
        let redis = redis::Client::open(format!("redis://{addr}/0")).unwrap();
        Self {
            name,
            client,
            redis,
        }
    }

    /// A plain connection for inspecting the queue's keys.
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        self.redis.get_multiplexed_async_connection().await.unwrap()
    }

    /// The ids waiting in the queue, oldest first.
    pub async fn pending_ids(&self) -> Vec<String> {
        let mut conn = self.connection().await;
        let mut ids: Vec<String> = redis::cmd("LRANGE")
            .arg(queue::keys::pending(&self.name))
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .unwrap();
        // asynq pushes on the left and takes from the right.
        ids.reverse();
        ids
    }
}

#[cfg(feature = "worker")]
impl TestQueue {
    /// Deletes every task key of the queue, and its name from
    /// `asynq:queues`: what a Valkey restart without its append-only file
    /// loses of it (the chains of ordered listeners beside it:
    /// [`TestQueue::delete_chains`]).
    pub fn delete_keys(&self) {
        self.delete_matching(&format!("{}*", queue::keys::queue_prefix(&self.name)));
        let Ok(mut conn) = self.redis.get_connection() else {
            return;
        };
        let _: Result<(), _> = redis::cmd("SREM")
            .arg("asynq:queues")
            .arg(&self.name)
            .query(&mut conn);
    }

    /// Deletes every key matching `pattern` in one call, as a server that
    /// loses them does: no command of a worker runs in between.
    fn delete_matching(&self, pattern: &str) {
        let Ok(mut conn) = self.redis.get_connection() else {
            return;
        };
        let _: Result<i64, _> = redis::cmd("EVAL")
            .arg(
                "local keys = redis.call('KEYS', ARGV[1]) \
                 for _, key in ipairs(keys) do redis.call('DEL', key) end return #keys",
            )
            .arg(0)
            .arg(pattern)
            .query(&mut conn);
    }
}

#[cfg(feature = "worker")]
impl TestQueue {
    /// Deletes the chains of ordered listeners kept beside the queue, in
    /// one call.
    pub fn delete_chains(&self) {
        self.delete_matching(&format!("ordered:{{{}}}:*", self.name));
    }
}

#[cfg(feature = "worker")]
impl Drop for TestQueue {
    fn drop(&mut self) {
        self.delete_keys();
        self.delete_chains();
    }
}

#[cfg(feature = "worker")]
/// A Valkey (or Redis) server of the test's own, which it may pause with
/// SIGSTOP. Dropping it kills the server.
pub struct OwnServer {
    child: Child,
    pub port: u16,
}

#[cfg(feature = "worker")]
impl OwnServer {
    /// Starts `VALKEY_SERVER`, or `valkey-server` or `redis-server` from
    /// PATH, on a free port; `None` when there is none.
    pub async fn start() -> Option<Self> {
        let candidates: Vec<String> = std::env::var("VALKEY_SERVER")
            .into_iter()
            .chain(["valkey-server".to_string(), "redis-server".to_string()])
            .collect();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = candidates.iter().find_map(|binary| {
            Command::new(binary)
                .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
                .args(["--save", "", "--appendonly", "no"])
                .stdout(Stdio::null())
                .spawn()
                .ok()
        })?;
        let server = Self { child, port };
        eventually(Duration::from_secs(10), "the server to answer", || async {
            queue::Client::connect(&server.addr(), None, 0)
                .await
                .is_ok()
        })
        .await;
        Some(server)
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub async fn redis(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(format!("redis://{}/", self.addr()))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} failed");
    }

    /// SIGSTOP: the server keeps its connections but answers nothing.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    pub fn resume(&self) {
        self.signal("-CONT");
    }
}

#[cfg(feature = "worker")]
impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Postgres server of the test's own (`initdb` into a directory of its
/// own, started on a free loopback port, trust authentication), for tests
/// of two services whose databases share a name; stopped and removed on
/// drop. As root (CI), the cluster belongs to Debian's `postgres` user,
/// since `initdb` refuses to run as root.
pub struct OwnPostgres {
    dir: PathBuf,
    pub port: u16,
}

impl OwnPostgres {
    /// The newest PostgreSQL's program `name` (Debian keeps them off
    /// `PATH`), if there is one.
    fn program(name: &str) -> Option<PathBuf> {
        let newest = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .max()?;
        let path = PathBuf::from(format!("/usr/lib/postgresql/{newest}/bin/{name}"));
        path.exists().then_some(path)
    }

    fn as_owner(program: &std::path::Path, args: &[&str]) {
        let root = std::fs::metadata("/proc/self")
            .map(|meta| std::os::unix::fs::MetadataExt::uid(&meta) == 0)
            .unwrap_or(false);
        let mut command = if root {
            let mut command = Command::new("setpriv");
            command
                .args(["--reuid=postgres", "--regid=postgres", "--init-groups"])
                .arg(program);
            command
        } else {
            Command::new(program)
        };
        let output = command.args(args).output().unwrap();
        assert!(
            output.status.success(),
            "{} {args:?}: {}{}",
            program.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// Starts one; `None` where PostgreSQL's programs are missing.
    pub fn start() -> Option<Self> {
        let (initdb, pg_ctl) = (Self::program("initdb")?, Self::program("pg_ctl")?);
        let dir = std::env::temp_dir().join(format!("kit-pg-{}", uuid::Uuid::now_v7().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let root = std::fs::metadata("/proc/self")
            .map(|meta| std::os::unix::fs::MetadataExt::uid(&meta) == 0)
            .unwrap_or(false);
        if root {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir)
                .status()
                .unwrap();
            assert!(status.success());
        }
        let data = dir.join("data").display().to_string();
        Self::as_owner(
            &initdb,
            &["-D", &data, "-U", "postgres", "--auth=trust", "-E", "UTF8"],
        );
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            dir.display()
        );
        let log = dir.join("log").display().to_string();
        Self::as_owner(
            &pg_ctl,
            &["-D", &data, "-l", &log, "-w", "-o", &options, "start"],
        );
        Some(Self { dir, port })
    }

    /// A database named `name` on it, created and migrated.
    pub async fn migrated(&self, name: &str) -> PgPool {
        let admin = PgConnectOptions::from_str(&format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            self.port
        ))
        .unwrap();
        let mut conn = PgConnection::connect_with(&admin).await.unwrap();
        conn.execute(format!(r#"CREATE DATABASE "{name}""#).as_str())
            .await
            .unwrap();
        conn.close().await.ok();
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .connect_with(admin.database(name))
            .await
            .unwrap();
        migrate::testing::up(&pool, migrations_dir()).await.unwrap();
        pool
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        if let Some(pg_ctl) = Self::program("pg_ctl") {
            let data = self.dir.join("data").display().to_string();
            let _ = std::panic::catch_unwind(|| {
                Self::as_owner(&pg_ctl, &["-D", &data, "-m", "immediate", "-w", "stop"]);
            });
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
