//! The interactive prompts, through a pseudo-terminal: an invalid answer is
//! explained and asked again, and every choice a flag can make is offered
//! with its default preselected.
#![cfg(unix)]

use std::process::Command;

use rexpect::session::{PtySession, spawn_command};

/// `gpkit <args>` in `dir` on a pseudo-terminal.
fn spawn(dir: &std::path::Path, args: &[&str]) -> PtySession {
    let mut command = Command::new(assert_cmd::cargo::cargo_bin("gpkit"));
    command
        .args(args)
        .current_dir(dir)
        .env("TERM", "dumb")
        .env("COLUMNS", "100");
    spawn_command(command, Some(20_000)).unwrap()
}

#[test]
fn an_invalid_project_name_is_explained_and_asked_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut session = spawn(dir.path(), &["new", "project"]);

    session.exp_string("Project name").unwrap();
    session.send_line("my shop!").unwrap();
    session.exp_string("not allowed").unwrap();
    session.exp_string("Project name").unwrap();
    session.send_line("shop").unwrap();
    session.exp_string("Include the worker").unwrap();
    session.send_line("").unwrap();
    session.exp_string("Data layer").unwrap();
    session.send_line("").unwrap();
    session.exp_string("Add the example").unwrap();
    session.send_line("").unwrap();
    session.exp_string("Add container files").unwrap();
    session.send_line("").unwrap();
    session.exp_string("Created project `shop`").unwrap();
    session.exp_eof().unwrap();

    assert!(dir.path().join("shop/src/bin/worker.rs").exists());
    let manifest = std::fs::read_to_string(dir.path().join("shop/gpkit.toml")).unwrap();
    assert!(
        !manifest.contains("db = "),
        "sqlx is the default data layer: {manifest}"
    );
    assert!(!dir.path().join("shop/src/routes/orders.rs").exists());
    assert!(
        !dir.path().join("shop/Dockerfile").exists(),
        "the container files are not the default"
    );
}

#[test]
fn the_example_can_be_chosen_at_the_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let mut session = spawn(dir.path(), &["new", "project", "shop", "--worker"]);

    session.exp_string("Data layer").unwrap();
    session.send_line("").unwrap();
    session.exp_string("Add the example").unwrap();
    session.send_line("y").unwrap();
    session.exp_string("Add container files").unwrap();
    session.send_line("").unwrap();
    session.exp_string("Created project `shop`").unwrap();
    session.exp_eof().unwrap();

    assert!(dir.path().join("shop/src/routes/orders.rs").exists());
}

#[test]
fn the_worker_choice_can_be_declined_at_the_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let mut session = spawn(dir.path(), &["new", "project", "lean"]);

    session.exp_string("Include the worker").unwrap();
    session.send_line("n").unwrap();
    session.exp_string("Data layer").unwrap();
    session.send_line("").unwrap();
    session.exp_string("Add container files").unwrap();
    session.send_line("").unwrap();
    session.exp_string("Created project `lean`").unwrap();
    session.exp_eof().unwrap();

    assert!(dir.path().join("lean/src/bin/server.rs").exists());
    assert!(!dir.path().join("lean/src/bin/worker.rs").exists());
}

#[test]
fn the_container_files_can_be_chosen_at_the_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let mut session = spawn(dir.path(), &["new", "project", "shop", "--no-example"]);

    session.exp_string("Include the worker").unwrap();
    session.send_line("").unwrap();
    session.exp_string("Data layer").unwrap();
    session.send_line("").unwrap();
    session.exp_string("Add container files").unwrap();
    session.send_line("y").unwrap();
    session.exp_string("Created project `shop`").unwrap();
    session.exp_eof().unwrap();

    for file in ["Dockerfile", ".dockerignore", "compose.yaml"] {
        assert!(dir.path().join("shop").join(file).exists(), "{file}");
    }
}

#[test]
fn sea_orm_can_be_chosen_at_the_prompt_and_then_the_example_is_offered_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut session = spawn(dir.path(), &["new", "project", "shop", "--worker"]);

    session.exp_string("Data layer").unwrap();
    // `j` moves down the list (as the down arrow does), Enter picks.
    session.send_line("j").unwrap();
    session.exp_string("Add the example").unwrap();
    session.send_line("").unwrap();
    session.exp_string("Add container files").unwrap();
    session.send_line("").unwrap();
    session.exp_string("Created project `shop`").unwrap();
    session.exp_eof().unwrap();

    let cargo = std::fs::read_to_string(dir.path().join("shop/Cargo.toml")).unwrap();
    assert!(cargo.contains("\"seaorm\""), "{cargo}");
    let manifest = std::fs::read_to_string(dir.path().join("shop/gpkit.toml")).unwrap();
    assert!(manifest.contains("db = \"sea-orm\""), "{manifest}");
}

#[test]
fn flags_and_no_input_never_prompt() {
    let dir = tempfile::tempdir().unwrap();
    for (args, worker, example, deploy) in [
        (
            &[
                "new",
                "project",
                "a",
                "--no-worker",
                "--db",
                "sqlx",
                "--no-deploy",
            ][..],
            false,
            false,
            false,
        ),
        (
            &[
                "new",
                "project",
                "b",
                "--worker",
                "--db",
                "sea-orm",
                "--no-example",
                "--deploy",
            ][..],
            true,
            false,
            true,
        ),
        (
            &["--no-input", "new", "project", "c"][..],
            true,
            false,
            false,
        ),
        (
            &["new", "project", "d", "--example", "--no-deploy"][..],
            true,
            true,
            false,
        ),
    ] {
        let mut session = spawn(dir.path(), args);
        session.exp_string("Created project").unwrap();
        session.exp_eof().unwrap();
        let name = args.iter().find(|a| a.len() == 1).unwrap();
        assert_eq!(
            dir.path().join(name).join("src/bin/worker.rs").exists(),
            worker,
            "{args:?}"
        );
        assert_eq!(
            dir.path().join(name).join("src/routes/orders.rs").exists(),
            example,
            "{args:?}"
        );
        assert_eq!(
            dir.path().join(name).join("compose.yaml").exists(),
            deploy,
            "{args:?}"
        );
    }
}
