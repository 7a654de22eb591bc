//! goose v3.30 and the generated `migrate` on one `goose_db_version` table.
//!
//! A Go service migrates with the goose library; a gpkit service with its
//! generated `migrate` binary. When both share a database they must read and
//! write the version table the same way. These tests run the real goose
//! (the Go peer `goosepeer`, a `goose.Provider` with the Postgres session
//! locker; see `tests/interop/go/cmd/goosepeer`) and the `migrate` binary of
//! the shared built project against one database each, and check that each
//! tool sees what the other did: applied versions, status and its times,
//! the current version, the version table and its version-0 row, missing
//! (out-of-order) migrations and rollback order, runs started at the same
//! moment, and the session settings a migration runs under.
//!
//! Where Go is missing the tests skip, a failure under CI (see
//! `crate::support::require_tool`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

use serde::Deserialize;

use crate::e2e::{Database, binary, psql};
use crate::go_peers::go_peer;
use crate::kit_migrations::{
    KIT, assert_migration_files, file_name, kit_files, kit_versions, newest_kit_version,
};
use crate::support::{gpkit, new_project};

/// The version `gpkit new migration` gives at `SOURCE_DATE_EPOCH=1800000000`.
const ORDERS: i64 = 20270115080000;

/// The file of the project's own migration, [`ORDERS`].
fn orders_file() -> String {
    file_name(ORDERS, "add_orders_table")
}

/// The migration files of [`project_migrations`], in version order: the
/// kit's and `orders`.
fn project_files() -> Vec<String> {
    [kit_files(), vec![orders_file()]].concat()
}

/// The versions of [`project_files`], in version order.
fn project_versions() -> Vec<i64> {
    [kit_versions(), vec![ORDERS]].concat()
}

/// The `version_id`s of a version table after `applied` were applied in
/// that order: the version-0 row, then each.
fn rows(applied: &[i64]) -> Vec<i64> {
    std::iter::once(0).chain(applied.iter().copied()).collect()
}

/// One migration run by goose (`goosepeer up`, `down`, ...).
#[derive(Debug, Deserialize)]
struct GooseResult {
    version: i64,
    file: String,
    direction: String,
}

/// One line of `goosepeer status`.
#[derive(Debug, Deserialize)]
struct GooseStatus {
    file: String,
    state: String,
    applied_at: Option<String>,
}

/// `goosepeer version`: `version` as the goose CLI reports it (the most
/// recently applied), `max_version` as `Provider.GetDBVersion` (the highest).
#[derive(Debug, Deserialize, PartialEq)]
struct GooseVersion {
    version: i64,
    max_version: i64,
}

/// The two tools under test, on one migrations directory and one database.
struct Tools<'a> {
    goose: PathBuf,
    migrate: PathBuf,
    dir: &'a Path,
    db: &'a Database,
    /// The version table both are told to use; `None` for the default.
    table: Option<&'a str>,
}

impl<'a> Tools<'a> {
    /// The Go peer and the built project's `migrate`, or `None` (and the
    /// test should return) where Go is missing.
    fn new(dir: &'a Path, db: &'a Database) -> Option<Self> {
        let goose = go_peer("goosepeer")?;
        Some(Self {
            goose,
            migrate: binary("migrate"),
            dir,
            db,
            table: None,
        })
    }

    /// Both tools use the version table `table` instead of the default.
    fn with_table(self, table: &'a str) -> Self {
        Self {
            table: Some(table),
            ..self
        }
    }

    /// `goosepeer -dir <dir> [-table T] <flags> <url> <args>`, not yet run.
    fn goose_command(&self, flags: &[&str], args: &[&str]) -> Command {
        let mut command = Command::new(&self.goose);
        command.arg("-dir").arg(self.dir);
        if let Some(table) = self.table {
            command.args(["-table", table]);
        }
        command.args(flags).arg(self.db.url()).args(args);
        command
    }

    /// `migrate --dir <dir> [--table T] <args>` on the database, not yet run.
    fn migrate_command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.migrate);
        command.arg("--dir").arg(self.dir);
        if let Some(table) = self.table {
            command.args(["--table", table]);
        }
        command
            .args(args)
            .env("DATABASE_URL", self.db.url())
            .env_remove("GOOSE_MIGRATION_DIR")
            .env_remove("GOOSE_TABLE");
        command
    }

    /// Runs goose and parses its JSON output; panics if it fails.
    fn goose<T: for<'de> Deserialize<'de>>(&self, args: &[&str]) -> T {
        self.goose_with(&[], args)
    }

    /// [`Self::goose`] with goosepeer flags (e.g. `-allow-missing`).
    fn goose_with<T: for<'de> Deserialize<'de>>(&self, flags: &[&str], args: &[&str]) -> T {
        let output = succeeded(
            self.goose_command(flags, args).output().unwrap(),
            "goose",
            args,
        );
        serde_json::from_slice(&output.stdout).unwrap()
    }

    /// Runs `migrate`, panics if it fails, and returns its log (stderr).
    fn migrate(&self, args: &[&str]) -> String {
        let output = succeeded(
            self.migrate_command(args).output().unwrap(),
            "migrate",
            args,
        );
        String::from_utf8(output.stderr).unwrap()
    }

    /// `(file, applied)` per migration, as goose reports it.
    fn goose_status(&self) -> Vec<(String, bool)> {
        let status: Vec<GooseStatus> = self.goose(&["status"]);
        status
            .into_iter()
            .map(|line| (line.file, line.state == "applied"))
            .collect()
    }

    /// `(file, applied)` per migration, as `migrate status` reports it.
    fn migrate_status(&self) -> Vec<(String, bool)> {
        migrate_status_lines(&self.migrate(&["status"]))
            .into_iter()
            .map(|(applied_at, file)| (file, applied_at != "Pending"))
            .collect()
    }

    /// The current version as `migrate version` logs it.
    fn migrate_version(&self) -> i64 {
        let log = self.migrate(&["version"]);
        let number = log
            .lines()
            .find_map(|line| line.strip_prefix("goose: version "))
            .unwrap_or_else(|| panic!("no `goose: version N` in:\n{log}"));
        number.trim().parse().unwrap()
    }

    /// The current version as goose reports it (CLI and Provider).
    fn goose_version(&self) -> GooseVersion {
        self.goose(&["version"])
    }

    /// Checks that goose and `migrate` both report `applied` as the applied
    /// files (all others pending), and the same current version `current`.
    fn assert_both_report<S: AsRef<str>>(&self, applied: &[S], current: i64) {
        let expected: Vec<(String, bool)> = self
            .files()
            .into_iter()
            .map(|file| {
                let is_applied = applied.iter().any(|a| a.as_ref() == file);
                (file, is_applied)
            })
            .collect();
        assert_eq!(self.goose_status(), expected, "goose status");
        assert_eq!(self.migrate_status(), expected, "migrate status");
        assert_eq!(self.migrate_version(), current, "migrate version");
        assert_eq!(self.goose_version().version, current, "goose version");
    }

    /// The migration files of the directory, in version order.
    fn files(&self) -> Vec<String> {
        migration_files(self.dir)
    }
}

/// The migration files of `dir`, in version order.
fn migration_files(dir: &Path) -> Vec<String> {
    let mut files: Vec<(i64, String)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".sql"))
        .map(|name| (version_of(&name), name))
        .collect();
    files.sort();
    files.into_iter().map(|(_, name)| name).collect()
}

/// Panics with the tool's stderr unless it exited successfully.
fn succeeded(output: Output, tool: &str, args: &[&str]) -> Output {
    assert!(
        output.status.success(),
        "`{tool} {}` failed:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// The version of a goose file name (`00001_add_users.sql` -> 1).
fn version_of(file: &str) -> i64 {
    file.split_once('_').unwrap().0.parse().unwrap()
}

/// `(applied at or "Pending", file)` per line of `migrate status`'s table.
fn migrate_status_lines(log: &str) -> Vec<(String, String)> {
    log.lines()
        .skip_while(|line| !line.trim_start().starts_with("===="))
        .skip(1)
        .filter_map(|line| line.split_once(" -- "))
        .map(|(at, file)| (at.trim().to_string(), file.trim().to_string()))
        .collect()
}

/// The files `migrate` logged as applied or rolled back (`OK   <file> (..)`
/// or `EMPTY <file> (..)`).
fn migrate_ran(log: &str) -> Vec<String> {
    log.lines()
        .filter_map(|line| {
            let rest = line
                .strip_prefix("OK ")
                .or_else(|| line.strip_prefix("EMPTY "))?;
            Some(rest.split_whitespace().next()?.to_string())
        })
        .collect()
}

/// The `version_id`s of the default version table, in row order.
fn version_rows(db: &Database) -> Vec<i64> {
    version_rows_of(db, "goose_db_version")
}

/// The `version_id`s of the version table `table`, in row order.
fn version_rows_of(db: &Database, table: &str) -> Vec<i64> {
    psql(
        &db.url(),
        &format!("SELECT version_id FROM {table} ORDER BY id"),
    )
    .lines()
    .map(|line| line.parse().unwrap())
    .collect()
}

/// Whether the relation (table or index) `name` exists in the database.
fn exists(db: &Database, name: &str) -> bool {
    psql(
        &db.url(),
        &format!("SELECT to_regclass('{name}') IS NOT NULL"),
    ) == "t"
}

/// A project of the test's own (generated, not built) with a second
/// migration made by `gpkit new migration` that creates an `orders` table;
/// returns its migrations directory.
fn project_migrations(parent: &Path) -> PathBuf {
    let project = new_project(parent, &["--no-worker"]);
    gpkit(&project)
        .env("SOURCE_DATE_EPOCH", "1800000000")
        .args(["new", "migration", "add orders table"])
        .assert()
        .success();
    let dir = project.join("migrations");
    // What a developer would write into the new file.
    std::fs::write(
        dir.join(orders_file()),
        "-- +goose Up\n\
         CREATE TABLE orders (id bigint PRIMARY KEY, total_cents bigint NOT NULL);\n\n\
         -- +goose Down\n\
         DROP TABLE orders;\n",
    )
    .unwrap();
    assert_migration_files(
        &migration_files(&dir),
        &project_files(),
        "the generated project's migrations",
    );
    dir
}

/// goose applies a generated project's migrations; `migrate` then reports
/// them applied, and the same current version.
#[test]
#[ignore = "builds a generated project"]
fn migrate_agrees_with_what_goose_applied() {
    let parent = tempfile::tempdir().unwrap();
    let dir = project_migrations(parent.path());
    let db = Database::create("gpkit_goose_applies");
    let Some(tools) = Tools::new(&dir, &db) else {
        return;
    };
    let files = project_files();
    assert_migration_files(&tools.files(), &files, "the directory");

    let applied: Vec<GooseResult> = tools.goose(&["up"]);

    let applied: Vec<(i64, &str)> = applied
        .iter()
        .map(|r| (r.version, r.direction.as_str()))
        .collect();
    let every_one_up: Vec<(i64, &str)> = project_versions()
        .into_iter()
        .map(|version| (version, "up"))
        .collect();
    assert_eq!(applied, every_one_up);
    assert!(
        exists(&db, "outbox_events") && exists(&db, "inbox_processed") && exists(&db, "orders")
    );
    assert_eq!(version_rows(&db), rows(&project_versions()));
    tools.assert_both_report(&files, ORDERS);
    // Nothing left for migrate to do.
    let log = tools.migrate(&["up"]);
    assert!(
        log.contains(&format!(
            "goose: no migrations to run. current version: {ORDERS}"
        )),
        "{log}"
    );
    assert_eq!(version_rows(&db), rows(&project_versions()));
}

/// `migrate down` and `migrate up` on a database goose migrated: goose sees
/// each change; and a `goose down` is seen by `migrate`.
#[test]
#[ignore = "builds a generated project"]
fn goose_agrees_with_migrate_down_and_up() {
    let parent = tempfile::tempdir().unwrap();
    let dir = project_migrations(parent.path());
    let db = Database::create("gpkit_goose_down_up");
    let Some(tools) = Tools::new(&dir, &db) else {
        return;
    };
    let kit = kit_files();
    let orders = orders_file();
    let _: Vec<GooseResult> = tools.goose(&["up"]);

    let log = tools.migrate(&["down"]);
    assert_eq!(migrate_ran(&log), [orders.as_str()]);
    assert!(!exists(&db, "orders") && exists(&db, "outbox_events"));
    assert_eq!(version_rows(&db), rows(&kit_versions()));
    tools.assert_both_report(&kit, newest_kit_version());

    let log = tools.migrate(&["up"]);
    assert_eq!(migrate_ran(&log), [orders.as_str()]);
    assert!(exists(&db, "orders"));
    assert_eq!(version_rows(&db), rows(&project_versions()));
    tools.assert_both_report(&project_files(), ORDERS);

    // The other way round: goose rolls back what migrate applied.
    let rolled_back: Vec<GooseResult> = tools.goose(&["down"]);
    assert_eq!(rolled_back[0].file, orders);
    assert_eq!(rolled_back[0].direction, "down");
    tools.assert_both_report(&kit, newest_kit_version());
    // Then migrate rolls back the kit's migrations one at a time, the newest
    // first.
    let versions = kit_versions();
    for (i, file) in kit.iter().enumerate().rev() {
        let log = tools.migrate(&["down"]);
        assert_eq!(migrate_ran(&log), [file.as_str()]);
        assert_eq!(version_rows(&db), rows(&versions[..i]), "after {file}");
        match KIT[i].1 {
            "listener_failures" => {
                assert!(!exists(&db, "listener_failures") && exists(&db, "inbox_processed"))
            }
            "inbox" => assert!(!exists(&db, "inbox_processed") && exists(&db, "outbox_events")),
            "outbox" => assert!(!exists(&db, "outbox_events")),
            _ => {}
        }
    }
    assert_eq!(version_rows(&db), [0]);
    tools.assert_both_report::<&str>(&[], 0);
}

/// Both tools show the same applied-at time: the row's `tstamp`, which
/// `migrate` writes and goose reads (and the other way round).
#[test]
#[ignore = "builds a generated project"]
fn both_report_the_applied_at_time_of_the_row() {
    let parent = tempfile::tempdir().unwrap();
    let dir = project_migrations(parent.path());
    let db = Database::create("gpkit_goose_tstamp");
    let Some(tools) = Tools::new(&dir, &db) else {
        return;
    };
    tools.migrate(&["up-by-one"]);
    let _: Vec<GooseResult> = tools.goose(&["up-by-one"]);

    let goose: Vec<GooseStatus> = tools.goose(&["status"]);
    let migrate = migrate_status_lines(&tools.migrate(&["status"]));
    let files = project_files();
    let goose_files: Vec<String> = goose.iter().map(|line| line.file.clone()).collect();
    let migrate_files: Vec<String> = migrate.iter().map(|(_, file)| file.clone()).collect();
    assert_migration_files(&goose_files, &files, "goose status");
    assert_migration_files(&migrate_files, &files, "migrate status");
    // The first, applied by migrate, and the second, by goose.
    for (i, version) in kit_versions()[..2].iter().copied().enumerate() {
        // goose: RFC 3339 of the row read as UTC; migrate: Go's ANSIC layout.
        let (rfc3339, ansic) = row_time(&db, version);
        let goose_at = goose[i].applied_at.as_deref().unwrap();
        assert!(
            goose_at.starts_with(&rfc3339),
            "goose says {goose_at}, the row {rfc3339}"
        );
        assert_eq!(migrate[i].0, ansic, "migrate's applied-at vs the row");
    }
}

/// The `tstamp` of `version`'s row, to the second, as `YYYY-MM-DDTHH:MM:SS`
/// and in Go's ANSIC layout (`Mon Jan  2 15:04:05 2006`).
fn row_time(db: &Database, version: i64) -> (String, String) {
    let row = psql(
        &db.url(),
        &format!(
            "SELECT to_char(tstamp, 'YYYY-MM-DD\"T\"HH24:MI:SS'), \
             to_char(tstamp, 'Dy Mon ') || lpad(to_char(tstamp, 'FMDD'), 2) || to_char(tstamp, ' HH24:MI:SS YYYY') \
             FROM goose_db_version WHERE version_id = {version}"
        ),
    );
    let (rfc3339, ansic) = row.split_once('|').unwrap();
    (rfc3339.to_string(), ansic.to_string())
}

/// Files written by `migrate create`, timestamped and sequential (`-s`), are
/// accepted by goose, which applies them and rolls them back.
#[test]
#[ignore = "builds a generated project"]
fn goose_applies_files_written_by_migrate_create() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::create("gpkit_goose_create");
    let Some(tools) = Tools::new(dir.path(), &db) else {
        return;
    };
    let sequential = created_file(&tools.migrate(&["create", "-s", "Add users table"]));
    let timestamped = created_file(&tools.migrate(&["create", "add user emails"]));
    assert_eq!(sequential, "00001_add_users_table.sql");
    assert!(
        timestamped.ends_with("_add_user_emails.sql") && version_of(&timestamped) > 1,
        "{timestamped}"
    );

    let applied: Vec<GooseResult> = tools.goose(&["up"]);
    let files: Vec<&str> = applied.iter().map(|r| r.file.as_str()).collect();
    assert_eq!(files, [sequential.as_str(), timestamped.as_str()]);
    assert_eq!(version_rows(&db), [0, 1, version_of(&timestamped)]);
    tools.assert_both_report(&[&sequential, &timestamped], version_of(&timestamped));

    let rolled_back: Vec<GooseResult> = tools.goose(&["down-to", "0"]);
    let files: Vec<&str> = rolled_back.iter().map(|r| r.file.as_str()).collect();
    assert_eq!(files, [timestamped.as_str(), sequential.as_str()]);
    assert_eq!(version_rows(&db), [0]);
}

/// The file name from `migrate create`'s `Created new file: <path>` line.
fn created_file(log: &str) -> String {
    let path = log
        .lines()
        .find_map(|line| line.strip_prefix("Created new file: "))
        .unwrap_or_else(|| panic!("no `Created new file:` in:\n{log}"));
    Path::new(path.trim())
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// A migration that holds the lock for a while ([`HOLD`]), so that the tool
/// started second finds it taken.
const SLOW: i64 = 20270115080100;
/// A `NO TRANSACTION` migration (`CREATE INDEX CONCURRENTLY`), slow
/// ([`HOLD`]) to roll back.
const CONCURRENT: i64 = 20270115080200;
/// How long the slow steps sleep (`pg_sleep`): far longer than the two
/// tools' start-up times differ, so that the one started second meets the
/// lock of the first.
const HOLD: &str = "1.5";
/// What the goose peer prints on stderr when goose's lock is held by another
/// session as it starts to take it (`tests/interop/go/cmd/goosepeer`).
const GOOSE_MET_THE_LOCK: &str = "goose's lock is held by another session; waiting for it";

/// [`project_migrations`] plus a slow migration and a `NO TRANSACTION` one.
fn race_migrations(parent: &Path) -> PathBuf {
    let dir = project_migrations(parent);
    std::fs::write(
        dir.join(format!("{SLOW}_order_audit.sql")),
        format!(
            "-- +goose Up\n\
             SELECT pg_sleep({HOLD});\n\
             CREATE TABLE order_audit (order_id bigint NOT NULL);\n\n\
             -- +goose Down\n\
             DROP TABLE order_audit;\n"
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join(format!("{CONCURRENT}_index_order_totals.sql")),
        format!(
            "-- +goose NO TRANSACTION\n\
             -- +goose Up\n\
             CREATE INDEX CONCURRENTLY orders_total_idx ON orders (total_cents);\n\n\
             -- +goose Down\n\
             SELECT pg_sleep({HOLD});\n\
             DROP INDEX CONCURRENTLY orders_total_idx;\n"
        ),
    )
    .unwrap();
    dir
}

/// Which tool took the lock first in a race.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum First {
    Goose,
    Migrate,
}

/// Asserts that in `round` the tool that did not take the lock first found
/// it held by the other, so the two runs overlapped, as the tool itself
/// reports it: `migrate` logs that it waits for its lock; the goose peer
/// says so when its first try finds the lock held ([`GOOSE_MET_THE_LOCK`]).
fn assert_second_waited(round: u32, first: First, goose_log: &str, migrate_log: &str) {
    match first {
        First::Goose => assert!(
            migrate_log.contains("waiting for its lock"),
            "round {round}: goose took the lock first, but migrate never found it taken \
             (the runs did not overlap):\n{migrate_log}"
        ),
        First::Migrate => assert!(
            goose_log.contains(GOOSE_MET_THE_LOCK),
            "round {round}: migrate took the lock first, but goose never found it taken \
             (the runs did not overlap):\n{goose_log}"
        ),
    }
    eprintln!("round {round}: {first:?} took the lock first; the other found it taken and waited");
}

/// A goose `up` and a `migrate up` started at the same moment on a fresh
/// database serialise on goose's advisory lock: whichever takes it first
/// applies every migration, exactly once, and the other applies none, after
/// waiting for the lock (the runs overlap). Five rounds, each on a fresh
/// database.
#[test]
#[ignore = "builds a generated project"]
fn goose_and_migrate_started_together_apply_each_migration_once() {
    let parent = tempfile::tempdir().unwrap();
    let dir = race_migrations(parent.path());
    for round in 1..=5 {
        let db = Database::create("gpkit_goose_race");
        let Some(tools) = Tools::new(&dir, &db) else {
            return;
        };
        let all = tools.files();

        let started = Instant::now();
        let goose = spawn(tools.goose_command(&[], &["up"]));
        let migrate = spawn(tools.migrate_command(&["up"]));
        let goose = succeeded(goose.wait_with_output().unwrap(), "goose", &["up"]);
        let goose_took = started.elapsed();
        let migrate = succeeded(migrate.wait_with_output().unwrap(), "migrate", &["up"]);

        let results: Vec<GooseResult> = serde_json::from_slice(&goose.stdout).unwrap();
        let by_goose: Vec<String> = results.into_iter().map(|r| r.file).collect();
        let migrate_log = String::from_utf8(migrate.stderr).unwrap();
        let goose_log = String::from_utf8_lossy(&goose.stderr);
        let by_migrate = migrate_ran(&migrate_log);
        eprintln!(
            "round {round}: goose applied {} in {goose_took:.1?}, migrate applied {}",
            by_goose.len(),
            by_migrate.len(),
        );
        assert!(
            (by_goose == all && by_migrate.is_empty())
                || (by_migrate == all && by_goose.is_empty()),
            "round {round}: the runs interleaved: goose applied {by_goose:?}, migrate {by_migrate:?}"
        );
        let first = if by_goose == all {
            First::Goose
        } else {
            First::Migrate
        };
        assert_second_waited(round, first, &goose_log, &migrate_log);
        assert_eq!(
            version_rows(&db),
            rows(&[project_versions(), vec![SLOW, CONCURRENT]].concat()),
            "round {round}"
        );
        for relation in ["outbox_events", "orders", "order_audit", "orders_total_idx"] {
            assert!(exists(&db, relation), "round {round}: no {relation}");
        }
        assert_eq!(
            psql(
                &db.url(),
                "SELECT indisvalid FROM pg_index WHERE indexrelid = 'orders_total_idx'::regclass"
            ),
            "t",
            "round {round}: the concurrent index is not valid"
        );
    }
}

/// A goose `down` and a `migrate down` started at the same moment each roll
/// back one migration, the two most recently applied: each reads the current
/// version under the lock, so neither rolls back what the other just did,
/// also when one waits for the other's lock (as it must: the runs overlap).
/// Three rounds, each on a fresh database.
#[test]
#[ignore = "builds a generated project"]
fn goose_down_and_migrate_down_started_together_roll_back_one_each() {
    let parent = tempfile::tempdir().unwrap();
    let dir = race_migrations(parent.path());
    for round in 1..=3 {
        let db = Database::create("gpkit_goose_race_down");
        let Some(tools) = Tools::new(&dir, &db) else {
            return;
        };
        tools.migrate(&["up"]);
        let last_two = tools.files().split_off(project_files().len());

        let started = Instant::now();
        let goose = spawn(tools.goose_command(&[], &["down"]));
        let migrate = spawn(tools.migrate_command(&["down"]));
        let goose = succeeded(goose.wait_with_output().unwrap(), "goose", &["down"]);
        let goose_took = started.elapsed();
        let migrate = succeeded(migrate.wait_with_output().unwrap(), "migrate", &["down"]);

        let results: Vec<GooseResult> = serde_json::from_slice(&goose.stdout).unwrap();
        let by_goose: Vec<String> = results.into_iter().map(|r| r.file).collect();
        let migrate_log = String::from_utf8(migrate.stderr).unwrap();
        let goose_log = String::from_utf8_lossy(&goose.stderr);
        let by_migrate = migrate_ran(&migrate_log);
        eprintln!(
            "round {round}: goose rolled back {by_goose:?} in {goose_took:.1?}, migrate {by_migrate:?}"
        );
        // The first to take the lock rolls back the most recent migration.
        let first = if by_goose == last_two[1..] {
            First::Goose
        } else {
            First::Migrate
        };
        let mut rolled_back = [by_goose, by_migrate].concat();
        rolled_back.sort();
        assert_eq!(rolled_back, last_two, "round {round}");
        assert_second_waited(round, first, &goose_log, &migrate_log);
        assert_eq!(
            version_rows(&db),
            rows(&project_versions()),
            "round {round}"
        );
        assert!(!exists(&db, "order_audit") && !exists(&db, "orders_total_idx"));
    }
}

/// Starts `command` with its output captured.
fn spawn(mut command: Command) -> std::process::Child {
    command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The version table and its version-0 row are the same whichever tool
/// creates them, and each tool migrates on the table the other created.
#[test]
#[ignore = "builds a generated project"]
fn either_tool_creates_the_same_version_table_for_the_other() {
    let parent = tempfile::tempdir().unwrap();
    let dir = project_migrations(parent.path());
    let by_migrate = Database::create("gpkit_goose_table_by_migrate");
    let by_goose = Database::create("gpkit_goose_table_by_goose");
    let Some(on_migrate_table) = Tools::new(&dir, &by_migrate) else {
        return;
    };
    let on_goose_table = Tools::new(&dir, &by_goose).unwrap();

    // `version` on an empty database creates the table in both tools.
    assert_eq!(on_migrate_table.migrate_version(), 0);
    assert_eq!(
        on_goose_table.goose_version(),
        GooseVersion {
            version: 0,
            max_version: 0
        }
    );
    let definition = table_definition(&by_goose);
    assert!(definition.contains("version_id bigint NO"), "{definition}");
    assert_eq!(table_definition(&by_migrate), definition);
    for db in [&by_migrate, &by_goose] {
        assert_eq!(
            psql(
                &db.url(),
                "SELECT id, version_id, is_applied FROM goose_db_version"
            ),
            "1|0|t"
        );
    }

    // Each tool migrates on the table the other made.
    // The project's: the kit's and `orders`.
    let files = project_files();
    let applied: Vec<GooseResult> = on_migrate_table.goose(&["up"]);
    let applied: Vec<String> = applied.into_iter().map(|r| r.file).collect();
    assert_migration_files(&applied, &files, "goose up");
    let log = on_goose_table.migrate(&["up"]);
    assert_migration_files(&migrate_ran(&log), &files, "migrate up");
    let all: Vec<String> = on_migrate_table.files();
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    on_migrate_table.assert_both_report(&all, ORDERS);
    on_goose_table.assert_both_report(&all, ORDERS);
    assert_eq!(version_rows(&by_migrate), version_rows(&by_goose));
}

/// The version table's columns and constraints, one per line.
fn table_definition(db: &Database) -> String {
    let columns = psql(
        &db.url(),
        "SELECT column_name || ' ' || data_type || ' ' || is_nullable || ' ' || \
         coalesce(column_default, '-') || ' ' || is_identity || ' ' || coalesce(identity_generation, '-') \
         FROM information_schema.columns WHERE table_name = 'goose_db_version' ORDER BY ordinal_position",
    );
    let constraints = psql(
        &db.url(),
        "SELECT contype::text || ' ' || pg_get_constraintdef(oid) FROM pg_constraint \
         WHERE conrelid = 'goose_db_version'::regclass ORDER BY 1",
    );
    format!("{columns}\n{constraints}")
}

/// Writes the goose migration `file` into `dir`, creating table `table`.
fn write_table_migration(dir: &Path, file: &str, table: &str) {
    std::fs::write(
        dir.join(file),
        format!(
            "-- +goose Up\nCREATE TABLE {table} (id int);\n\n-- +goose Down\nDROP TABLE {table};\n"
        ),
    )
    .unwrap();
}

/// Out-of-order ("missing") migrations: both tools refuse one by default,
/// apply it when allowed, and roll back the most recently applied migration
/// first, not the highest version.
#[test]
#[ignore = "builds a generated project"]
fn both_refuse_missing_migrations_and_roll_back_in_applied_order() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::create("gpkit_goose_missing");
    let Some(tools) = Tools::new(dir.path(), &db) else {
        return;
    };
    write_table_migration(dir.path(), "00001_a.sql", "a");
    write_table_migration(dir.path(), "00003_c.sql", "c");
    tools.migrate(&["up"]);
    // Merged late: older than the database version, never applied.
    write_table_migration(dir.path(), "00002_b.sql", "b");

    let goose = tools.goose_command(&[], &["up"]).output().unwrap();
    let migrate = tools.migrate_command(&["up"]).output().unwrap();
    for (tool, output) in [("goose", goose), ("migrate", migrate)] {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success() && stderr.contains("missing"),
            "{tool} up did not refuse the missing migration:\n{stderr}"
        );
    }
    assert_eq!(version_rows(&db), [0, 1, 3]);
    assert!(!exists(&db, "b"));

    let applied: Vec<GooseResult> = tools.goose_with(&["-allow-missing"], &["up"]);
    assert_eq!(applied[0].file, "00002_b.sql");
    assert_eq!(applied.len(), 1);
    assert_eq!(version_rows(&db), [0, 1, 3, 2]);
    // The current version is the most recently applied one for the goose CLI
    // and migrate; the Provider's GetDBVersion is the highest.
    assert_eq!(
        tools.goose_version(),
        GooseVersion {
            version: 2,
            max_version: 3
        }
    );
    assert_eq!(tools.migrate_version(), 2);

    assert_eq!(migrate_ran(&tools.migrate(&["down"])), ["00002_b.sql"]);
    assert_eq!(version_rows(&db), [0, 1, 3]);
    assert!(!exists(&db, "b") && exists(&db, "c"));

    let log = tools.migrate(&["--allow-missing", "up"]);
    assert_eq!(migrate_ran(&log), ["00002_b.sql"]);
    assert_eq!(version_rows(&db), [0, 1, 3, 2]);
    let rolled_back: Vec<GooseResult> = tools.goose(&["down"]);
    assert_eq!(rolled_back[0].file, "00002_b.sql");
    assert_eq!(version_rows(&db), [0, 1, 3]);
    assert!(!exists(&db, "b") && exists(&db, "c"));
}

/// The same migration gives the same data whichever tool runs it, also where
/// the database's `TimeZone` and `DateStyle` (set with `ALTER DATABASE`) are
/// not the `UTC` and `ISO, MDY` that sqlx gives every session: goose's
/// session takes the database's, and `migrate` must too. `now()::timestamp`,
/// a `01/02/2024` date literal and the version table's `tstamp` come out alike.
#[test]
#[ignore = "builds a generated project"]
fn both_tools_use_the_databases_time_zone_and_date_style() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::create("gpkit_goose_timezone");
    let Some(tools) = Tools::new(dir.path(), &db) else {
        return;
    };
    for setting in ["timezone = 'Pacific/Auckland'", "datestyle = 'ISO, DMY'"] {
        psql(
            &crate::e2e::server_url(),
            &format!("ALTER DATABASE \"{}\" SET {setting}", db.name),
        );
    }
    let insert = "INSERT INTO clock SELECT now()::timestamp, '01/02/2024'::date;";
    std::fs::write(
        dir.path().join("00001_clock.sql"),
        format!("-- +goose Up\nCREATE TABLE clock (at timestamp, day date);\n{insert}\n"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("00002_tick.sql"),
        format!("-- +goose Up\n{insert}\n"),
    )
    .unwrap();

    let _: Vec<GooseResult> = tools.goose(&["up-by-one"]);
    tools.migrate(&["up-by-one"]);

    // DMY: 1 February, for both.
    assert_eq!(
        psql(&db.url(), "SELECT DISTINCT day::text FROM clock"),
        "2024-02-01"
    );
    // Both wall clocks in Auckland time, moments apart.
    let auckland_now = "now() AT TIME ZONE 'Pacific/Auckland'";
    for (what, query) in [
        ("clock.at", "SELECT at FROM clock"),
        (
            "goose_db_version.tstamp",
            "SELECT tstamp FROM goose_db_version WHERE version_id > 0",
        ),
    ] {
        assert_eq!(
            psql(
                &db.url(),
                &format!(
                    "SELECT count(*) FILTER (WHERE abs(extract(epoch FROM t - ({auckland_now}))) < 60) \
                     || '/' || count(*) FROM ({query}) AS q(t)"
                ),
            ),
            "2/2",
            "{what}: not both within a minute of Auckland's time"
        );
    }
}

/// A schema-qualified version table (`migrate --table`, goose's
/// `WithTableName`) is created, found and shared the same way by both, and
/// neither touches the default table.
#[test]
#[ignore = "builds a generated project"]
fn a_schema_qualified_version_table_is_shared() {
    let parent = tempfile::tempdir().unwrap();
    let dir = project_migrations(parent.path());
    let db = Database::create("gpkit_goose_schema_table");
    let table = "ops.schema_versions";
    let Some(tools) = Tools::new(&dir, &db) else {
        return;
    };
    let tools = tools.with_table(table);
    psql(&db.url(), "CREATE SCHEMA ops");

    let applied: Vec<GooseResult> = tools.goose(&["up-by-one"]);
    assert_eq!(applied[0].version, KIT[0].0);
    let log = tools.migrate(&["up"]);
    let files = project_files();
    assert_eq!(migrate_ran(&log), files[1..]);

    assert_eq!(version_rows_of(&db, table), rows(&project_versions()));
    assert!(!exists(&db, "goose_db_version"));
    tools.assert_both_report(&files, ORDERS);
}
