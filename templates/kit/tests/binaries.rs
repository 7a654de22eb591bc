//! The binaries as an operator runs them, each in a process of its own:
//! how `server`, `worker` and `migrate` report a configuration error (the
//! variable, the value and the expected form, never a secret), how they
//! read `.env` from their working directory without overriding the
//! environment, and the `migrate` command line against a real Postgres
//! (`DATABASE_URL`).
//!
//! The binaries are the service's (`src/bin/`), but what they check is the
//! kit's: a `main` loads `.env` (`kit::env_file`), then the configuration
//! (`kit::config::Config`) or runs `kit::migrate::cli`. This program does
//! the same when `KIT_TEST_ACT_AS` names a binary, so it runs itself as
//! each of them; without it, it runs the tests below (a name given as an
//! argument picks the tests whose names contain it). Its `main` is its own
//! (`harness = false` in the kit's `Cargo.toml`).

// goose's own view of a migrated database (shared with the kit's tests in
// `src/tests/`), of which this program uses a part.
#[allow(dead_code)]
#[path = "support/goose.rs"]
mod goose;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Output};

use sqlx::{Connection, Executor, PgConnection};

use kit::config::Config;
use kit::migrate::cli;

use goose::{Database, MigrationDir, ONE, three_files};

/// Names the binary this program acts as: `server`, `worker` or `migrate`.
const ACT_AS: &str = "KIT_TEST_ACT_AS";

fn main() -> ExitCode {
    if let Ok(binary) = std::env::var(ACT_AS) {
        return act_as(&binary);
    }
    let tests: &[(&str, fn())] = &[
        test!(migrate_reads_dotenv_from_its_working_directory),
        test!(a_variable_set_in_the_environment_wins_over_dotenv),
        test!(a_malformed_dotenv_line_is_named_by_file_and_number_without_its_text),
        test!(a_missing_database_url_is_named),
        test!(a_malformed_duration_names_the_variable_the_value_and_the_form),
        test!(a_malformed_number_names_the_variable_and_the_value),
        test!(a_malformed_database_url_is_explained_without_being_repeated),
        test!(migrate_never_prints_the_password),
        #[cfg(feature = "worker")]
        test!(worker_configuration_errors_name_the_variable_and_hide_secrets),
        #[cfg(feature = "worker")]
        test!(the_scheduler_settings_are_checked),
        #[cfg(feature = "worker")]
        test!(the_worker_reads_dotenv_and_names_a_malformed_line),
        #[cfg(feature = "worker")]
        test!(the_worker_names_a_missing_database_url),
        test!(binary_migrates_and_prints_status),
        test!(binary_creates_a_missing_database_only_when_asked),
        test!(binary_names_the_database_and_the_reason_when_it_cannot_create_it),
        test!(binary_needs_a_database_url_for_database_commands),
        test!(binary_validates_without_a_database),
        test!(binary_creates_and_fixes_files),
    ];
    run_tests(tests)
}

/// Does what the binary `name`'s `main` does before it serves: the server
/// and the worker start through `kit::binary::run` (`.env`, then the
/// configuration), `migrate` through `kit::binary::run_command` (`.env`,
/// then its command line).
fn act_as(name: &str) -> ExitCode {
    match name {
        "migrate" => kit::binary::run_command(async || Ok(cli::main().await)),
        "server" | "worker" => kit::binary::run(name, async |_: Config| Ok(())),
        other => panic!("no binary is named `{other}`"),
    }
}

/// A test, for the list in [`main`].
macro_rules! test {
    ($name:ident) => {
        (stringify!($name), $name as fn())
    };
}
use test;

/// Runs the tests whose names contain one of the arguments (all without
/// one), each on a thread of its own, and reports them as libtest does.
fn run_tests(tests: &[(&str, fn())]) -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let chosen: Vec<&(&str, fn())> = tests
        .iter()
        .filter(|(name, _)| filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str())))
        .collect();
    if args.iter().any(|a| a == "--list") {
        for (name, _) in &chosen {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    println!("\nrunning {} tests", chosen.len());
    let results: Vec<(&str, bool)> = std::thread::scope(|scope| {
        let running: Vec<_> = chosen
            .iter()
            .map(|(name, test)| {
                let thread = std::thread::Builder::new()
                    .name(name.to_string())
                    .spawn_scoped(scope, *test)
                    .expect("start a test thread");
                (*name, thread)
            })
            .collect();
        running
            .into_iter()
            .map(|(name, thread)| (name, thread.join().is_ok()))
            .collect()
    });
    let failed: Vec<&str> = results
        .iter()
        .filter(|(_, ok)| !ok)
        .map(|(n, _)| *n)
        .collect();
    for (name, ok) in &results {
        println!("test {name} ... {}", if *ok { "ok" } else { "FAILED" });
    }
    println!(
        "\ntest result: {}. {} passed; {} failed\n",
        if failed.is_empty() { "ok" } else { "FAILED" },
        results.len() - failed.len(),
        failed.len()
    );
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Runs an async test on a runtime of its own, as `#[tokio::test]` does.
fn block_on(test: impl Future<Output = ()>) {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(test)
}

/// This program, acting as the binary `name`.
fn binary(name: &str) -> Command {
    let mut command = Command::new(std::env::current_exe().expect("the test program's path"));
    command.env(ACT_AS, name);
    command
}

const SECRET: &str = "hunter2";

/// Runs the server binary with exactly `vars` as its configuration.
fn start_server(vars: &[(&str, &str)]) -> Output {
    run("server", &[], vars)
}

/// Runs the binary `name` with `args` and exactly `vars` as its
/// environment, in an empty working directory (so no `.env` of the
/// project's is read).
fn run(name: &str, args: &[&str], vars: &[(&str, &str)]) -> Output {
    run_in(&WorkDir::new(), name, args, vars)
}

/// [`run`] in `dir`.
fn run_in(dir: &WorkDir, name: &str, args: &[&str], vars: &[(&str, &str)]) -> Output {
    let mut command = binary(name);
    command
        .args(args)
        .env_clear()
        .env(ACT_AS, name)
        .current_dir(dir.path());
    for (key, value) in vars {
        command.env(key, value);
    }
    command.output().expect("run the binary")
}

/// A working directory of a test's own, removed when dropped.
struct WorkDir(PathBuf);

impl WorkDir {
    fn new() -> Self {
        let path =
            std::env::temp_dir().join(format!("config-test-{}", uuid::Uuid::now_v7().simple()));
        std::fs::create_dir_all(&path).expect("create the working directory");
        Self(path)
    }

    /// A working directory whose `.env` is `text`.
    fn with_env_file(text: &str) -> Self {
        let dir = Self::new();
        std::fs::write(dir.0.join(".env"), text).expect("write .env");
        dir
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The URL of a database that does not exist on the server the tests use
/// (`DATABASE_URL`): `migrate` names it in its error, which shows where the
/// URL came from.
fn missing_database_url(name: &str) -> String {
    let server = std::env::var("DATABASE_URL").expect(
        "these tests need a Postgres server: set DATABASE_URL, \
         e.g. postgres://postgres@127.0.0.1:5432/postgres",
    );
    let mut url = url::Url::parse(&server).expect("DATABASE_URL is a URL");
    url.set_path(&format!("{name}_{}", uuid::Uuid::now_v7().simple()));
    url.to_string()
}

fn stderr_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn migrate_reads_dotenv_from_its_working_directory() {
    let url = missing_database_url("from_dotenv");
    let dir = WorkDir::with_env_file(&format!("# settings\nDATABASE_URL={url}\n"));

    let output = run_in(&dir, "migrate", &["status"], &[]);

    let stderr = stderr_of(&output);
    assert!(!output.status.success());
    let name = url.rsplit('/').next().unwrap();
    assert!(
        stderr.contains(&format!("the database \"{name}\" does not exist")),
        "{stderr}"
    );
}

fn a_variable_set_in_the_environment_wins_over_dotenv() {
    let from_file = missing_database_url("from_dotenv");
    let from_env = missing_database_url("from_env");
    let dir = WorkDir::with_env_file(&format!("DATABASE_URL={from_file}\n"));

    let output = run_in(&dir, "migrate", &["status"], &[("DATABASE_URL", &from_env)]);

    let stderr = stderr_of(&output);
    assert!(!output.status.success());
    assert!(
        stderr.contains(from_env.rsplit('/').next().unwrap()),
        "{stderr}"
    );
    assert!(!stderr.contains("from_dotenv"), "{stderr}");
}

fn a_malformed_dotenv_line_is_named_by_file_and_number_without_its_text() {
    let dir = WorkDir::with_env_file(&format!(
        "# settings\nRUST_LOG=info\nDATABASE_PASSWORD {SECRET}\n"
    ));

    let output = run_in(&dir, "migrate", &["status"], &[]);

    let stderr = stderr_of(&output);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("`.env` line 3"), "{stderr}");
    assert!(stderr.contains("NAME=value"), "{stderr}");
    assert!(!stderr.contains(SECRET), "the line was shown: {stderr}");

    let unclosed = WorkDir::with_env_file("A=1\nB=\"open\nC=3\n");
    let output = run_in(&unclosed, "migrate", &["status"], &[]);
    let stderr = stderr_of(&output);
    assert!(
        stderr.contains("`.env` line 2: a quote opened on this line is never closed"),
        "{stderr}"
    );
}

fn a_missing_database_url_is_named() {
    let output = start_server(&[]);

    assert!(!output.status.success());
    let stderr = stderr_of(&output);
    assert!(stderr.contains("DATABASE_URL is not set"), "{stderr}");
    assert!(
        stderr.contains("postgres://"),
        "the expected form is shown: {stderr}"
    );
}

fn a_malformed_duration_names_the_variable_the_value_and_the_form() {
    let url = format!("postgres://app:{SECRET}@localhost/app");
    let output = start_server(&[("DATABASE_URL", &url), ("OUTBOX_POLL_INTERVAL", "5")]);

    assert!(!output.status.success());
    let stderr = stderr_of(&output);
    assert!(stderr.contains("OUTBOX_POLL_INTERVAL"), "{stderr}");
    assert!(stderr.contains("`5`"), "{stderr}");
    assert!(stderr.contains("such as 500ms, 1s"), "{stderr}");
    assert!(!stderr.contains(SECRET), "the password leaked: {stderr}");
}

fn a_malformed_number_names_the_variable_and_the_value() {
    let output = start_server(&[
        ("DATABASE_URL", "postgres://localhost/app"),
        ("DATABASE_MAX_CONNECTIONS", "ten"),
    ]);

    let stderr = stderr_of(&output);
    assert!(!output.status.success());
    assert!(stderr.contains("DATABASE_MAX_CONNECTIONS"), "{stderr}");
    assert!(stderr.contains("'ten'"), "{stderr}");
}

fn a_malformed_database_url_is_explained_without_being_repeated() {
    let url = format!("mysql://app:{SECRET}@localhost/app");
    let output = start_server(&[("DATABASE_URL", &url)]);

    let stderr = stderr_of(&output);
    assert!(!output.status.success());
    assert!(stderr.contains("DATABASE_URL"), "{stderr}");
    assert!(stderr.contains("scheme is `mysql`"), "{stderr}");
    assert!(!stderr.contains(SECRET), "the password leaked: {stderr}");
}

fn migrate_never_prints_the_password() {
    for url in [
        // Nothing listens on port 1: the connection fails.
        format!("postgres://app:{SECRET}@127.0.0.1:1/app"),
        format!("postgres://app@127.0.0.1:1/app?password={SECRET}"),
        format!("mysql://app:{SECRET}@127.0.0.1:1/app"),
    ] {
        let output = run("migrate", &["status"], &[("DATABASE_URL", &url)]);
        let stderr = stderr_of(&output);
        assert!(!output.status.success(), "{url}: {stderr}");
        assert!(!stderr.is_empty(), "{url}: no error shown");
        assert!(!stderr.contains(SECRET), "the password leaked: {stderr}");
    }
}

#[cfg(feature = "worker")]
fn worker_configuration_errors_name_the_variable_and_hide_secrets() {
    let url = format!("postgres://app@localhost/app?password={SECRET}");
    let output = run(
        "worker",
        &[],
        &[
            ("DATABASE_URL", &url),
            ("VALKEY_PASSWORD", SECRET),
            ("WORKER_CONCURRENCY", "ten"),
        ],
    );

    let stderr = stderr_of(&output);
    assert!(!output.status.success());
    assert!(stderr.contains("WORKER_CONCURRENCY"), "{stderr}");
    assert!(stderr.contains("'ten'"), "{stderr}");
    assert!(!stderr.contains(SECRET), "the password leaked: {stderr}");
}

#[cfg(feature = "worker")]
fn the_scheduler_settings_are_checked() {
    let url = "postgres://app@localhost/app";
    for (name, value, expected) in [
        ("SCHEDULER_LEASE_TTL", "200ms", "it must be at least 1s"),
        ("SCHEDULER_LEASE_TTL", "soon", "SCHEDULER_LEASE_TTL"),
        ("SCHEDULER_ENABLED", "maybe", "SCHEDULER_ENABLED"),
    ] {
        let output = run("worker", &[], &[("DATABASE_URL", url), (name, value)]);
        let stderr = stderr_of(&output);
        assert!(!output.status.success(), "{name}={value}: {stderr}");
        assert!(stderr.contains(expected), "{name}={value}: {stderr}");
    }
}

#[cfg(feature = "worker")]
fn the_worker_reads_dotenv_and_names_a_malformed_line() {
    let dir =
        WorkDir::with_env_file("DATABASE_URL=postgres://localhost/app\nWORKER_CONCURRENCY=ten\n");
    let output = run_in(&dir, "worker", &[], &[]);
    let stderr = stderr_of(&output);
    assert!(!output.status.success());
    assert!(stderr.contains("WORKER_CONCURRENCY"), "{stderr}");
    assert!(stderr.contains("'ten'"), "{stderr}");

    // A set variable wins over the file.
    let output = run_in(&dir, "worker", &[], &[("WORKER_CONCURRENCY", "eleven")]);
    let stderr = stderr_of(&output);
    assert!(stderr.contains("'eleven'"), "{stderr}");
    assert!(!stderr.contains("'ten'"), "{stderr}");

    let malformed =
        WorkDir::with_env_file("DATABASE_URL=postgres://localhost/app\n\nWORKER QUEUES\n");
    let output = run_in(&malformed, "worker", &[], &[]);
    let stderr = stderr_of(&output);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("`.env` line 3"), "{stderr}");
}

#[cfg(feature = "worker")]
fn the_worker_names_a_missing_database_url() {
    let output = run("worker", &[], &[]);

    let stderr = stderr_of(&output);
    assert!(!output.status.success());
    assert!(stderr.contains("DATABASE_URL is not set"), "{stderr}");
}

// ---- The `migrate` binary on a migration directory of its own ----

/// The `migrate` binary on `dir`, run there so that no `.env` of the
/// project's is read.
fn migrate_binary(dir: &Path) -> Command {
    let mut command = binary("migrate");
    command.arg("--dir").arg(dir).current_dir(dir);
    command
}

fn binary_migrates_and_prints_status() {
    block_on(async {
        let db = Database::new().await;
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
    });
}

fn binary_creates_a_missing_database_only_when_asked() {
    block_on(async {
        // Upper case, a space and a quote: the name must be quoted in SQL.
        let db = Database::not_created("Migrate \"new\" db");
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
    });
}

fn binary_names_the_database_and_the_reason_when_it_cannot_create_it() {
    block_on(async {
        // A role that may log in but not create databases.
        let db = Database::not_created("migrate_test");
        let role = format!("migrate_test_role_{}", uuid::Uuid::now_v7().simple());
        let mut admin = PgConnection::connect(&db.admin_url)
            .await
            .expect("connect to DATABASE_URL");
        admin
            .execute(
                format!(r#"CREATE ROLE "{role}" LOGIN NOCREATEDB PASSWORD 'hunter2'"#).as_str(),
            )
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
    });
}

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
