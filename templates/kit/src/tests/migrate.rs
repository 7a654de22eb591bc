//! The goose-compatible migration runner against a real Postgres server.
//!
//! Set `DATABASE_URL` to a server where the user may create databases, e.g.
//! `postgres://postgres@127.0.0.1:5432/postgres`. Each test creates its own
//! database and migration directory and removes both when it ends, also when it
//! fails.

use super::support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::goose::{Database as TestDatabase, MigrationDir, ONE, THREE, TWO, three_files};

use crate::migrate::Error;
use crate::migrate::lock::LockOptions;
use crate::migrate::runner::Migrator;

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
async fn a_kit_migration_older_than_the_database_is_applied_first_and_a_services_is_not() {
    let db = TestDatabase::new().await;
    let dir = MigrationDir::new(&[("00001_one.sql", ONE), ("00005_three.sql", THREE)]);
    let (migrator, log) = migrator(&dir);
    // Version 2 is the kit's, as an upgrade adds it.
    let migrator = migrator.kit_versions([2]);
    let conn = &mut db.connect().await;
    migrator.up(conn).await.unwrap();
    take(&log);

    // Beside a missing migration of the service's, it waits with it: the
    // run is refused, naming the service's, and nothing is applied.
    dir.add("00002_two.sql", TWO);
    dir.add("00004_four.sql", "-- +goose Up\nSELECT 4;\n");
    let refused = migrator.up(conn).await.unwrap_err().to_string();
    assert!(
        refused.contains("found 1 missing migrations before current version 5")
            && refused.contains("00004_four.sql")
            && !refused.contains("00002_two.sql"),
        "{refused}"
    );
    assert_eq!(db.versions().await, [0, 1, 5]);
    std::fs::remove_file(dir.path().join("00004_four.sql")).unwrap();

    // Alone, it is applied first, and said so.
    assert_eq!(migrator.up(conn).await.unwrap(), 2);
    assert_eq!(db.versions().await, [0, 1, 5, 2]);
    let lines = take(&log);
    assert!(
        lines
            .iter()
            .any(|line| line
                .contains("00002_two.sql is the kit's, older than the database's version 5")),
        "{lines:?}"
    );
    migrator.up(conn).await.unwrap();
    assert_eq!(
        db.versions().await,
        [0, 1, 5, 2],
        "a second run applies nothing"
    );
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
