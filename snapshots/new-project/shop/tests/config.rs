//! Configuration errors, as an operator sees them: the server refuses to
//! start and says which variable is wrong and what it expects, without
//! revealing secrets.

use std::process::{Command, Output};

mod support;

const SECRET: &str = "hunter2";

/// Runs the server binary with exactly `vars` as its configuration.
fn start_server(vars: &[(&str, &str)]) -> Output {
    run(env!("CARGO_BIN_EXE_server"), &[], vars)
}

/// Runs `binary` with `args` and exactly `vars` as its environment.
fn run(binary: &str, args: &[&str], vars: &[(&str, &str)]) -> Output {
    let mut command = Command::new(binary);
    command.args(args).env_clear();
    for (key, value) in vars {
        command.env(key, value);
    }
    command.output().expect("run the binary")
}

fn stderr_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
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
fn the_worker_names_a_missing_database_url() {
    let output = run(env!("CARGO_BIN_EXE_worker"), &[], &[]);

    let stderr = stderr_of(&output);
    assert!(!output.status.success());
    assert!(stderr.contains("DATABASE_URL is not set"), "{stderr}");
}
