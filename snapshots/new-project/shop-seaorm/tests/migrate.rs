//! The goose-compatible migration runner against a real Postgres server.
//!
//! Set `DATABASE_URL` to a server where the user may create databases, e.g.
//! `postgres://postgres@127.0.0.1:5432/postgres`. Each test creates its own
//! database and migration directory and removes both when it ends, also when it
//! fails.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::{Connection, Executor, PgConnection};

use kit::migrate::{Error, LockOptions, Migrator};

/// A database created for one test, dropped `WITH (FORCE)` on drop.
struct TestDatabase {
    url: String,
    admin_url: String,
    name: String,
}

impl TestDatabase {
    async fn new() -> Self {
        let db = Self::not_created("migrate_test");
        let mut admin = PgConnection::connect(&db.admin_url)
            .await
            .expect("connect to DATABASE_URL");
        admin
            .execute(format!(r#"CREATE DATABASE "{}""#, db.name).as_str())
            .await
            .expect("create the test database");
        admin.close().await.ok();
        db
    }

    /// A database name starting with `prefix` that no database has yet; it
    /// is dropped on drop if a test creates it.
    fn not_created(prefix: &str) -> Self {
        let admin_url = std::env::var("DATABASE_URL").expect(
            "these tests need a Postgres server: set DATABASE_URL, \
             e.g. postgres://postgres@127.0.0.1:5432/postgres",
        );
        let name = format!("{prefix}_{}", uuid::Uuid::now_v7().simple());
        let mut url = url::Url::parse(&admin_url).expect("DATABASE_URL is a URL");
        url.set_path(&name);
        Self {
            url: url.to_string(),
            admin_url,
            name,
        }
    }

    /// Whether the database exists on the server.
    async fn exists(&self) -> bool {
        let mut admin = PgConnection::connect(&self.admin_url)
            .await
            .expect("connect to DATABASE_URL");
        let (exists,): (bool,) =
            sqlx::query_as("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
                .bind(&self.name)
                .fetch_one(&mut admin)
                .await
                .expect("look the database up");
        exists
    }

    async fn connect(&self) -> PgConnection {
        PgConnection::connect(&self.url)
            .await
            .expect("connect to the test database")
    }

    /// `SELECT count(*)` of a query's rows.
    async fn count(&self, sql: &str) -> i64 {
        let (count,): (i64,) = sqlx::query_as(&format!("SELECT count(*) FROM ({sql}) AS q"))
            .fetch_one(&mut self.connect().await)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        count
    }

    async fn table_exists(&self, table: &str) -> bool {
        let (exists,): (bool,) = sqlx::query_as("SELECT to_regclass($1) IS NOT NULL")
            .bind(table)
            .fetch_one(&mut self.connect().await)
            .await
            .expect("check a table");
        exists
    }

    /// The version table's `version_id`s in insertion order.
    async fn versions(&self) -> Vec<i64> {
        sqlx::query_as::<_, (i64,)>("SELECT version_id FROM goose_db_version ORDER BY id")
            .fetch_all(&mut self.connect().await)
            .await
            .expect("read the version table")
            .into_iter()
            .map(|(v,)| v)
            .collect()
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let admin_url = self.admin_url.clone();
        let name = std::mem::take(&mut self.name);
        // Drop runs inside the test's runtime, which cannot block on async work;
        // a separate thread with its own runtime can.
        let dropped = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime")
                .block_on(async move {
                    let mut admin = PgConnection::connect(&admin_url).await?;
                    admin
                        .execute(
                            format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#).as_str(),
                        )
                        .await?;
                    admin.close().await
                })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("warning: failed to drop a test database");
        }
    }
}

/// A migration directory for one test, removed on drop.
struct MigrationDir(PathBuf);

impl MigrationDir {
    fn new(files: &[(&str, &str)]) -> Self {
        let path =
            std::env::temp_dir().join(format!("migrate-test-{}", uuid::Uuid::now_v7().simple()));
        std::fs::create_dir_all(&path).expect("create the migration directory");
        let dir = Self(path);
        for (name, sql) in files {
            dir.add(name, sql);
        }
        dir
    }

    fn add(&self, name: &str, sql: &str) {
        std::fs::write(self.0.join(name), sql).expect("write a migration");
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for MigrationDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A migrator whose log lines are collected.
fn migrator(dir: &MigrationDir) -> (Migrator, Arc<Mutex<Vec<String>>>) {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&lines);
    let migrator = Migrator::new(dir.path())
        .logger(move |line| sink.lock().unwrap().push(line.to_owned()))
        .lock_options(LockOptions {
            poll_interval: Duration::from_millis(50),
            max_attempts: 600,
        });
    (migrator, lines)
}

fn take(lines: &Mutex<Vec<String>>) -> Vec<String> {
    std::mem::take(&mut *lines.lock().unwrap())
}

const ONE: &str = "-- +goose Up
CREATE TABLE one (id int PRIMARY KEY);

-- +goose Down
DROP TABLE one;
";

const TWO: &str = "-- +goose Up
INSERT INTO one (id) VALUES (1), (2);
-- +goose StatementBegin
CREATE FUNCTION two() RETURNS int AS $$
BEGIN
    RETURN 2;
END;
$$ LANGUAGE plpgsql;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION two();
DELETE FROM one;
";

const THREE: &str = "-- +goose Up
CREATE TABLE three (id int);
-- +goose Down
DROP TABLE three;
";

fn three_files() -> MigrationDir {
    MigrationDir::new(&[
        ("00001_one.sql", ONE),
        ("00002_two.sql", TWO),
        ("00003_three.sql", THREE),
    ])
}

#[tokio::test]
async fn up_down_redo_reset_and_targets() {
    let db = TestDatabase::new().await;
    let dir = three_files();
    let (migrator, log) = migrator(&dir);
    let conn = &mut db.connect().await;

    assert_eq!(migrator.up(conn).await.unwrap(), 3);
    let lines = take(&log);
    assert!(lines[0].starts_with("OK   00001_one.sql ("), "{lines:?}");
    assert_eq!(
        lines.last().unwrap(),
        "goose: successfully migrated database to version: 3"
    );
    assert_eq!(db.versions().await, [0, 1, 2, 3]);
    assert_eq!(db.count("SELECT * FROM one").await, 2);
    assert!(db.table_exists("three").await);

    assert_eq!(migrator.up(conn).await.unwrap(), 3);
    assert_eq!(
        take(&log),
        ["goose: no migrations to run. current version: 3"]
    );
    assert_eq!(migrator.version(conn).await.unwrap(), 3);

    migrator.down(conn).await.unwrap();
    assert!(!db.table_exists("three").await);
    assert_eq!(migrator.version(conn).await.unwrap(), 2);

    migrator.redo(conn).await.unwrap();
    assert_eq!(db.versions().await, [0, 1, 2]);
    assert_eq!(db.count("SELECT * FROM one").await, 2);

    migrator.reset(conn).await.unwrap();
    assert_eq!(db.versions().await, [0]);
    assert!(!db.table_exists("one").await);

    assert_eq!(migrator.up_to(conn, 2).await.unwrap(), 2);
    assert_eq!(db.versions().await, [0, 1, 2]);
    migrator.down_to(conn, 1).await.unwrap();
    assert_eq!(db.versions().await, [0, 1]);

    take(&log);
    assert_eq!(migrator.up_by_one(conn).await.unwrap(), 2);
    assert_eq!(migrator.up_by_one(conn).await.unwrap(), 3);
    let nothing = migrator.up_by_one(conn).await.unwrap_err();
    assert!(matches!(nothing, Error::NoNextVersion), "{nothing}");
    assert_eq!(
        take(&log).last().unwrap(),
        "goose: no migrations to run. current version: 3"
    );

    migrator.down_to(conn, 0).await.unwrap();
    assert_eq!(db.versions().await, [0]);
    assert_eq!(
        migrator.down(conn).await.unwrap_err().to_string(),
        "migration 0: no current version found"
    );
}

#[tokio::test]
async fn status_prints_goose_table() {
    let db = TestDatabase::new().await;
    let dir = three_files();
    let (migrator, log) = migrator(&dir);
    let conn = &mut db.connect().await;
    migrator.up_to(conn, 1).await.unwrap();
    take(&log);

    let statuses = migrator.status(conn).await.unwrap();
    assert_eq!(
        statuses.iter().map(|s| s.applied).collect::<Vec<_>>(),
        [true, false, false]
    );
    let lines = take(&log);
    assert_eq!(lines[0], "    Applied At                  Migration");
    assert_eq!(lines[1], "    =======================================");
    // ANSIC, e.g. "Mon Jan  2 15:04:05 2006", padded to 24 characters.
    let applied = &lines[2];
    assert!(applied.ends_with(" -- 00001_one.sql"), "{applied}");
    let stamp = &applied[4..28];
    assert!(
        chrono::NaiveDateTime::parse_from_str(stamp, "%a %b %e %H:%M:%S %Y").is_ok(),
        "{stamp:?}"
    );
    assert_eq!(lines[3], "    Pending                  -- 00002_two.sql");
    assert_eq!(lines[4], "    Pending                  -- 00003_three.sql");
}

#[tokio::test]
async fn no_transaction_runs_create_index_concurrently() {
    let db = TestDatabase::new().await;
    let concurrently = "-- +goose NO TRANSACTION
-- +goose Up
CREATE INDEX CONCURRENTLY one_id_idx ON one (id);
-- +goose Down
DROP INDEX CONCURRENTLY one_id_idx;
";
    let dir = MigrationDir::new(&[("00001_one.sql", ONE), ("00002_index.sql", concurrently)]);
    let (migrator, _log) = migrator(&dir);
    let conn = &mut db.connect().await;

    migrator.up(conn).await.unwrap();
    assert!(db.table_exists("one_id_idx").await);
    migrator.down(conn).await.unwrap();
    assert!(!db.table_exists("one_id_idx").await);
    assert_eq!(db.versions().await, [0, 1]);

    // Without the annotation Postgres refuses, and nothing is recorded.
    dir.add(
        "00002_index.sql",
        &concurrently.replace("-- +goose NO TRANSACTION\n", ""),
    );
    let error = migrator.up(conn).await.unwrap_err().to_string();
    assert!(
        error.contains("cannot run inside a transaction block"),
        "{error}"
    );
    assert_eq!(db.versions().await, [0, 1]);
}

#[tokio::test]
async fn failing_migration_is_rolled_back() {
    let db = TestDatabase::new().await;
    let failing = "-- +goose Up
CREATE TABLE half (id int);
INSERT INTO no_such_table VALUES (1);
-- +goose Down
DROP TABLE half;
";
    let dir = MigrationDir::new(&[("00001_one.sql", ONE), ("00002_failing.sql", failing)]);
    let (migrator, _log) = migrator(&dir);
    let conn = &mut db.connect().await;

    let error = migrator.up(conn).await.unwrap_err();
    assert!(matches!(error, Error::Run { .. }), "{error}");
    let message = error.to_string();
    assert!(
        message.starts_with(
            "ERROR 00002_failing.sql: failed to run SQL migration: \
             failed to execute SQL query \"INSERT INTO no_such_table VALUES (1);\""
        ),
        "{message}"
    );
    assert_eq!(db.versions().await, [0, 1]);
    assert!(!db.table_exists("half").await);
    assert_eq!(migrator.version(conn).await.unwrap(), 1);
}

#[tokio::test]
async fn malformed_file_stops_the_run_before_anything_is_applied() {
    let db = TestDatabase::new().await;
    let broken = "-- +goose Up
CREATE TABLE broken (id int)
-- +goose Down
DROP TABLE broken;
";
    let dir = MigrationDir::new(&[("00001_one.sql", ONE), ("00002_broken.sql", broken)]);
    let (migrator, _log) = migrator(&dir);
    let conn = &mut db.connect().await;

    let message = migrator.up(conn).await.unwrap_err().to_string();
    assert_eq!(
        message,
        "ERROR 00002_broken.sql:2: failed to parse SQL migration file: failed to parse migration: \
         state 1, direction: up: unexpected unfinished SQL query: \"CREATE TABLE broken (id int)\": \
         missing semicolon?"
    );
    assert_eq!(db.versions().await, [0]);
    assert!(!db.table_exists("one").await);
}

#[tokio::test]
async fn concurrent_runs_wait_for_each_other() {
    let db = TestDatabase::new().await;
    let slow = "-- +goose Up
SELECT pg_sleep(1);
CREATE TABLE slow (id int);
-- +goose Down
DROP TABLE slow;
";
    let dir = MigrationDir::new(&[("00001_slow.sql", slow), ("00002_one.sql", ONE)]);
    let (first, first_log) = migrator(&dir);
    let (second, second_log) = migrator(&dir);
    let mut a = db.connect().await;
    let mut b = db.connect().await;

    let (x, y) = tokio::join!(
        tokio::spawn(async move { first.up(&mut a).await }),
        tokio::spawn(async move { second.up(&mut b).await }),
    );
    assert_eq!(x.unwrap().unwrap(), 2);
    assert_eq!(y.unwrap().unwrap(), 2);
    assert_eq!(db.versions().await, [0, 1, 2]);

    let logs = [take(&first_log), take(&second_log)];
    let waited = logs
        .iter()
        .filter(|l| l.iter().any(|s| s.contains("waiting")))
        .count();
    let applied = logs
        .iter()
        .filter(|l| l.iter().any(|s| s.starts_with("OK")))
        .count();
    assert_eq!((waited, applied), (1, 1), "{logs:?}");
}

#[tokio::test]
async fn older_goose_table_layout_is_accepted() {
    let db = TestDatabase::new().await;
    let conn = &mut db.connect().await;
    sqlx::raw_sql(
        "CREATE TABLE goose_db_version (
            id serial NOT NULL,
            version_id bigint NOT NULL,
            is_applied boolean NOT NULL,
            tstamp timestamp NULL default now(),
            PRIMARY KEY(id)
        );
        INSERT INTO goose_db_version (version_id, is_applied) VALUES (0, true), (1, true);
        CREATE TABLE one (id int PRIMARY KEY);",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    let dir = three_files();
    let (migrator, log) = migrator(&dir);

    assert_eq!(migrator.up(conn).await.unwrap(), 3);
    assert_eq!(db.versions().await, [0, 1, 2, 3]);
    migrator.status(conn).await.unwrap();
    assert!(take(&log).iter().all(|line| !line.contains("Pending")));
    migrator.down_to(conn, 0).await.unwrap();
    assert_eq!(db.versions().await, [0]);
}

#[tokio::test]
async fn missing_migrations_fail_unless_allowed() {
    let db = TestDatabase::new().await;
    let dir = MigrationDir::new(&[("00001_one.sql", ONE), ("00003_three.sql", THREE)]);
    let (migrator, _log) = migrator(&dir);
    let conn = &mut db.connect().await;
    migrator.up(conn).await.unwrap();

    dir.add("00002_two.sql", TWO);
    let message = migrator.up(conn).await.unwrap_err().to_string();
    assert_eq!(
        message,
        format!(
            "error: found 1 missing migrations before current version 3:\n\tversion 2: {}",
            dir.path().join("00002_two.sql").display()
        )
    );
    assert_eq!(db.versions().await, [0, 1, 3]);

    let migrator = migrator.allow_missing(true);
    assert_eq!(migrator.up(conn).await.unwrap(), 2);
    assert_eq!(db.versions().await, [0, 1, 3, 2]);
    // The current version is the most recently applied one, as in goose.
    assert_eq!(migrator.version(conn).await.unwrap(), 2);
    migrator.down(conn).await.unwrap();
    assert_eq!(db.versions().await, [0, 1, 3]);
}

#[tokio::test]
async fn duplicate_versions_name_both_files() {
    let db = TestDatabase::new().await;
    let dir = MigrationDir::new(&[("1_a.sql", ONE), ("001_b.sql", THREE)]);
    let (migrator, _log) = migrator(&dir);
    let message = migrator
        .up(&mut db.connect().await)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        message.starts_with("duplicate version 1 detected:"),
        "{message}"
    );
    assert!(
        message.contains("001_b.sql") && message.contains("1_a.sql"),
        "{message}"
    );
}

// ---- The `migrate` binary ----

/// The `migrate` binary on `dir`, run there so that no `.env` of the
/// project's is read.
fn migrate_binary(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_migrate"));
    command.arg("--dir").arg(dir).current_dir(dir);
    command
}

#[tokio::test]
async fn binary_migrates_and_prints_status() {
    let db = TestDatabase::new().await;
    let dir = three_files();

    let up = migrate_binary(dir.path())
        .arg("up")
        .env("DATABASE_URL", &db.url)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&up.stderr);
    assert!(up.status.success(), "{stderr}");
    assert!(
        stderr.contains("goose: successfully migrated database to version: 3"),
        "{stderr}"
    );

    let status = migrate_binary(dir.path())
        .arg("status")
        .env("DATABASE_URL", &db.url)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&status.stderr);
    assert!(status.status.success(), "{stderr}");
    assert!(
        stderr.contains("    Applied At                  Migration"),
        "{stderr}"
    );
    assert!(stderr.contains(" -- 00003_three.sql"), "{stderr}");

    let by_one = migrate_binary(dir.path())
        .arg("up-by-one")
        .env("DATABASE_URL", &db.url)
        .output()
        .unwrap();
    assert_eq!(by_one.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&by_one.stderr).contains("no next version found"));
}

#[tokio::test]
async fn binary_creates_a_missing_database_only_when_asked() {
    // Upper case, a space and a quote: the name must be quoted in SQL.
    let db = TestDatabase::not_created("Migrate \"new\" db");
    let dir = three_files();
    let migrate = |args: &[&str]| {
        migrate_binary(dir.path())
            .args(args)
            .env("DATABASE_URL", &db.url)
            .output()
            .unwrap()
    };

    let refused = migrate(&["up"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("the database \"{}\" does not exist", db.name)),
        "{stderr}"
    );
    assert!(stderr.contains("--create-database"), "{stderr}");
    assert!(!db.exists().await);

    let created = migrate(&["up", "--create-database"]);
    let stderr = String::from_utf8_lossy(&created.stderr);
    assert!(created.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("goose: created database \"{}\"", db.name)),
        "{stderr}"
    );
    assert!(db.exists().await);
    assert_eq!(db.versions().await, [0, 1, 2, 3]);

    // Once it exists, the flag changes nothing.
    let again = migrate(&["up", "--create-database"]);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{stderr}");
    assert!(!stderr.contains("created database"), "{stderr}");
    assert!(stderr.contains("goose: no migrations to run"), "{stderr}");
}

#[tokio::test]
async fn binary_names_the_database_and_the_reason_when_it_cannot_create_it() {
    // A role that may log in but not create databases.
    let db = TestDatabase::not_created("migrate_test");
    let role = format!("migrate_test_role_{}", uuid::Uuid::now_v7().simple());
    let mut admin = PgConnection::connect(&db.admin_url)
        .await
        .expect("connect to DATABASE_URL");
    admin
        .execute(format!(r#"CREATE ROLE "{role}" LOGIN NOCREATEDB PASSWORD 'hunter2'"#).as_str())
        .await
        .expect("create a role");
    let mut url = url::Url::parse(&db.url).unwrap();
    url.set_username(&role).unwrap();
    url.set_password(Some("hunter2")).unwrap();

    let dir = three_files();
    let output = migrate_binary(dir.path())
        .args(["up", "--create-database"])
        .env("DATABASE_URL", url.as_str())
        .output()
        .unwrap();
    admin
        .execute(format!(r#"DROP ROLE "{role}""#).as_str())
        .await
        .expect("drop the role");

    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("failed to create the database \"{}\"", db.name)),
        "{stderr}"
    );
    assert!(stderr.contains("permission denied"), "{stderr}");
    assert!(stderr.contains("CREATEDB"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "the password leaked: {stderr}");
    assert!(!db.exists().await);
}

#[test]
fn binary_needs_a_database_url_for_database_commands() {
    let dir = three_files();
    let output = migrate_binary(dir.path())
        .arg("status")
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("DATABASE_URL"));

    let usage = migrate_binary(dir.path())
        .arg("up-to")
        .arg("x")
        .output()
        .unwrap();
    assert_eq!(usage.status.code(), Some(2));
}

#[test]
fn binary_validates_without_a_database() {
    let dir = three_files();
    dir.add("00004_broken.sql", "-- +goose Up\nSELECT 1\n");
    let output = migrate_binary(dir.path())
        .args(["validate", "--format", "json"])
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let reports: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(reports.as_array().unwrap().len(), 4);
    assert_eq!(reports[0]["file"], "00001_one.sql");
    assert_eq!(reports[0]["version"], 1);
    assert_eq!(
        reports[0]["up"]["statements"][0],
        "CREATE TABLE one (id int PRIMARY KEY);"
    );
    assert_eq!(reports[0]["up"]["use_tx"], true);
    assert_eq!(reports[3]["up"]["line"], 2);
    assert!(
        reports[3]["up"]["error"]
            .as_str()
            .unwrap()
            .contains("missing semicolon?")
    );
    assert_eq!(reports[3]["down"]["statements"], serde_json::json!([]));

    std::fs::remove_file(dir.path().join("00004_broken.sql")).unwrap();
    let ok = migrate_binary(dir.path()).arg("validate").output().unwrap();
    assert!(ok.status.success());
    assert!(String::from_utf8_lossy(&ok.stdout).contains("3 files, 0 with errors"));
}

#[test]
fn binary_creates_and_fixes_files() {
    let dir = MigrationDir::new(&[("00001_one.sql", ONE)]);
    let created = migrate_binary(dir.path())
        .args(["create", "Add orders!!", "-s"])
        .output()
        .unwrap();
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let sequential = dir.path().join("00002_add_orders.sql");
    assert!(
        std::fs::read_to_string(&sequential)
            .unwrap()
            .starts_with("-- +goose Up\n")
    );

    let stamped = migrate_binary(dir.path())
        .args(["create", "later"])
        .output()
        .unwrap();
    assert!(stamped.status.success());
    let fixed = migrate_binary(dir.path()).arg("fix").output().unwrap();
    assert!(fixed.status.success());
    assert!(String::from_utf8_lossy(&fixed.stderr).contains("=> 00003_later.sql"));
    assert!(dir.path().join("00003_later.sql").exists());
}
