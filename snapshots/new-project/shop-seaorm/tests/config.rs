//! Configuration errors, as an operator sees them: the server refuses to
//! start and says which variable is wrong and what it expects, without
//! revealing secrets; and `.env` files, which the binaries read from their
//! working directory without overriding the environment.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod support;

const SECRET: &str = "hunter2";

/// Runs the server binary with exactly `vars` as its configuration.
fn start_server(vars: &[(&str, &str)]) -> Output {
    run(env!("CARGO_BIN_EXE_server"), &[], vars)
}

/// Runs `binary` with `args` and exactly `vars` as its environment, in an
/// empty working directory (so no `.env` of the project's is read).
fn run(binary: &str, args: &[&str], vars: &[(&str, &str)]) -> Output {
    run_in(&WorkDir::new(), binary, args, vars)
}

/// [`run`] in `dir`.
fn run_in(dir: &WorkDir, binary: &str, args: &[&str], vars: &[(&str, &str)]) -> Output {
    let mut command = Command::new(binary);
    command.args(args).env_clear().current_dir(dir.path());
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

#[test]
fn migrate_reads_dotenv_from_its_working_directory() {
    let url = missing_database_url("from_dotenv");
    let dir = WorkDir::with_env_file(&format!("# settings\nDATABASE_URL={url}\n"));

    let output = run_in(&dir, env!("CARGO_BIN_EXE_migrate"), &["status"], &[]);

    let stderr = stderr_of(&output);
    assert!(!output.status.success());
    let name = url.rsplit('/').next().unwrap();
    assert!(
        stderr.contains(&format!("the database \"{name}\" does not exist")),
        "{stderr}"
    );
}

#[test]
fn a_variable_set_in_the_environment_wins_over_dotenv() {
    let from_file = missing_database_url("from_dotenv");
    let from_env = missing_database_url("from_env");
    let dir = WorkDir::with_env_file(&format!("DATABASE_URL={from_file}\n"));

    let output = run_in(
        &dir,
        env!("CARGO_BIN_EXE_migrate"),
        &["status"],
        &[("DATABASE_URL", &from_env)],
    );

    let stderr = stderr_of(&output);
    assert!(!output.status.success());
    assert!(
        stderr.contains(from_env.rsplit('/').next().unwrap()),
        "{stderr}"
    );
    assert!(!stderr.contains("from_dotenv"), "{stderr}");
}

#[test]
fn a_malformed_dotenv_line_is_named_by_file_and_number_without_its_text() {
    let dir = WorkDir::with_env_file(&format!(
        "# settings\nRUST_LOG=info\nDATABASE_PASSWORD {SECRET}\n"
    ));

    let output = run_in(&dir, env!("CARGO_BIN_EXE_migrate"), &["status"], &[]);

    let stderr = stderr_of(&output);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("`.env` line 3"), "{stderr}");
    assert!(stderr.contains("NAME=value"), "{stderr}");
    assert!(!stderr.contains(SECRET), "the line was shown: {stderr}");

    let unclosed = WorkDir::with_env_file("A=1\nB=\"open\nC=3\n");
    let output = run_in(&unclosed, env!("CARGO_BIN_EXE_migrate"), &["status"], &[]);
    let stderr = stderr_of(&output);
    assert!(
        stderr.contains("`.env` line 2: a quote opened on this line is never closed"),
        "{stderr}"
    );
}

#[test]
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

#[test]
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

#[test]
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

#[test]
fn a_malformed_database_url_is_explained_without_being_repeated() {
    let url = format!("mysql://app:{SECRET}@localhost/app");
    let output = start_server(&[("DATABASE_URL", &url)]);

    let stderr = stderr_of(&output);
    assert!(!output.status.success());
    assert!(stderr.contains("DATABASE_URL"), "{stderr}");
    assert!(stderr.contains("scheme is `mysql`"), "{stderr}");
    assert!(!stderr.contains(SECRET), "the password leaked: {stderr}");
}

#[test]
fn debug_output_hides_every_secret() {
    let mut config = support::test_config(&format!("postgres://app:{SECRET}@db:5432/app"));
    config.valkey.password = Some(SECRET.to_string().into());

    let shown = format!("{config:?}");

    assert!(!shown.contains(SECRET), "{shown}");
    assert!(shown.contains("postgres://app:***@db:5432/app"), "{shown}");

    // The `?password=` form that sqlx accepts too.
    let config = support::test_config(&format!("postgres://app@db:5432/app?password={SECRET}"));
    let shown = format!("{config:?}");
    assert!(!shown.contains(SECRET), "{shown}");
    assert!(shown.contains("password=***"), "{shown}");
}

#[test]
fn migrate_never_prints_the_password() {
    for url in [
        // Nothing listens on port 1: the connection fails.
        format!("postgres://app:{SECRET}@127.0.0.1:1/app"),
        format!("postgres://app@127.0.0.1:1/app?password={SECRET}"),
        format!("mysql://app:{SECRET}@127.0.0.1:1/app"),
    ] {
        let output = run(
            env!("CARGO_BIN_EXE_migrate"),
            &["status"],
            &[("DATABASE_URL", &url)],
        );
        let stderr = stderr_of(&output);
        assert!(!output.status.success(), "{url}: {stderr}");
        assert!(!stderr.is_empty(), "{url}: no error shown");
        assert!(!stderr.contains(SECRET), "the password leaked: {stderr}");
    }
}

#[test]
fn worker_configuration_errors_name_the_variable_and_hide_secrets() {
    let url = format!("postgres://app@localhost/app?password={SECRET}");
    let output = run(
        env!("CARGO_BIN_EXE_worker"),
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

#[test]
fn the_scheduler_settings_are_checked() {
    let url = "postgres://app@localhost/app";
    for (name, value, expected) in [
        ("SCHEDULER_LEASE_TTL", "200ms", "it must be at least 1s"),
        ("SCHEDULER_LEASE_TTL", "soon", "SCHEDULER_LEASE_TTL"),
        ("SCHEDULER_ENABLED", "maybe", "SCHEDULER_ENABLED"),
    ] {
        let output = run(
            env!("CARGO_BIN_EXE_worker"),
            &[],
            &[("DATABASE_URL", url), (name, value)],
        );
        let stderr = stderr_of(&output);
        assert!(!output.status.success(), "{name}={value}: {stderr}");
        assert!(stderr.contains(expected), "{name}={value}: {stderr}");
    }
}

#[test]
fn the_worker_reads_dotenv_and_names_a_malformed_line() {
    let dir =
        WorkDir::with_env_file("DATABASE_URL=postgres://localhost/app\nWORKER_CONCURRENCY=ten\n");
    let output = run_in(&dir, env!("CARGO_BIN_EXE_worker"), &[], &[]);
    let stderr = stderr_of(&output);
    assert!(!output.status.success());
    assert!(stderr.contains("WORKER_CONCURRENCY"), "{stderr}");
    assert!(stderr.contains("'ten'"), "{stderr}");

    // A set variable wins over the file.
    let output = run_in(
        &dir,
        env!("CARGO_BIN_EXE_worker"),
        &[],
        &[("WORKER_CONCURRENCY", "eleven")],
    );
    let stderr = stderr_of(&output);
    assert!(stderr.contains("'eleven'"), "{stderr}");
    assert!(!stderr.contains("'ten'"), "{stderr}");

    let malformed =
        WorkDir::with_env_file("DATABASE_URL=postgres://localhost/app\n\nWORKER QUEUES\n");
    let output = run_in(&malformed, env!("CARGO_BIN_EXE_worker"), &[], &[]);
    let stderr = stderr_of(&output);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("`.env` line 3"), "{stderr}");
}

#[test]
fn the_worker_names_a_missing_database_url() {
    let output = run(env!("CARGO_BIN_EXE_worker"), &[], &[]);

    let stderr = stderr_of(&output);
    assert!(!output.status.success());
    assert!(stderr.contains("DATABASE_URL is not set"), "{stderr}");
}
