//! `gpkit new migration`: goose file names, versions that never clash, and
//! refusals that leave the project unchanged.

use predicates::str::contains;

use crate::kit_migrations::{kit_files, newest_kit_version};
use crate::support::{disk_state, gpkit, read_tree};

/// A project without the worker, generated into a temp dir.
fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    gpkit(dir.path())
        .args(["new", "project", "shop", "--no-worker"])
        .assert()
        .success();
    dir
}

fn migrations(dir: &tempfile::TempDir) -> Vec<String> {
    read_tree(&dir.path().join("shop/migrations"), &[])
        .into_keys()
        .collect()
}

#[test]
fn writes_a_timestamped_goose_file() {
    let dir = project();

    gpkit(&dir.path().join("shop"))
        .env("SOURCE_DATE_EPOCH", "1800000000")
        .args(["new", "migration", "Add orders table"])
        .assert()
        .success()
        .stderr(contains(
            "Created migrations/20270115080000_add_orders_table.sql",
        ));

    let text = std::fs::read_to_string(
        dir.path()
            .join("shop/migrations/20270115080000_add_orders_table.sql"),
    )
    .unwrap();
    assert_eq!(
        text,
        "-- +goose Up\nSELECT 'up SQL query';\n\n-- +goose Down\nSELECT 'down SQL query';\n"
    );
}

#[test]
fn a_second_migration_in_the_same_second_gets_a_later_version() {
    let dir = project();
    for name in ["first", "second"] {
        gpkit(&dir.path().join("shop"))
            .env("SOURCE_DATE_EPOCH", "1800000000")
            .args(["new", "migration", name])
            .assert()
            .success();
    }
    let expected = [
        kit_files(),
        vec![
            "20270115080000_first.sql".to_string(),
            "20270115080001_second.sql".to_string(),
        ],
    ]
    .concat();
    assert_eq!(migrations(&dir), expected);
}

#[test]
fn a_clock_behind_the_newest_migration_still_gets_a_later_version() {
    let dir = project();
    // 2023-11-14, before the kit's newest migration: one second after it.
    let newest = newest_kit_version();
    assert!(newest > 20231114221320 && newest % 100 < 59, "{newest}");
    gpkit(&dir.path().join("shop"))
        .env("SOURCE_DATE_EPOCH", "1700000000")
        .args(["new", "migration", "late"])
        .assert()
        .success()
        .stderr(contains(format!(
            "Created migrations/{}_late.sql",
            newest + 1
        )));
}

#[test]
fn sequential_numbering_counts_up() {
    let dir = project();
    for name in ["a", "b"] {
        gpkit(dir.path())
            .args(["-C", "shop", "new", "migration", name, "--sequential"])
            .assert()
            .success();
    }
    let expected = [
        vec!["00001_a.sql".to_string(), "00002_b.sql".to_string()],
        kit_files(),
    ]
    .concat();
    assert_eq!(migrations(&dir), expected);
}

#[test]
fn bad_input_is_refused_and_nothing_changes() {
    let dir = project();
    let before = disk_state(dir.path(), &[]);

    gpkit(&dir.path().join("shop"))
        .args(["new", "migration", "!!!"])
        .assert()
        .code(1)
        .stderr(contains("has no letters or digits"))
        .stderr(contains("help:"));
    gpkit(dir.path())
        .args(["new", "migration", "add_orders"])
        .assert()
        .code(1)
        .stderr(contains("is not a gpkit project"))
        .stderr(contains("help:"));
    assert_eq!(disk_state(dir.path(), &[]), before);

    std::fs::write(dir.path().join("shop/migrations/oops.sql"), "").unwrap();
    let with_oops = disk_state(dir.path(), &[]);
    gpkit(&dir.path().join("shop"))
        .args(["new", "migration", "add_orders"])
        .assert()
        .code(1)
        .stderr(contains("oops.sql` is not a valid goose migration name"));
    assert_eq!(disk_state(dir.path(), &[]), with_oops);
}

#[test]
fn dry_run_writes_nothing() {
    let dir = project();
    let before = disk_state(dir.path(), &[]);
    gpkit(&dir.path().join("shop"))
        .env("SOURCE_DATE_EPOCH", "1800000000")
        .args(["--dry-run", "new", "migration", "add_orders"])
        .assert()
        .success()
        .stdout(contains("create  migrations/20270115080000_add_orders.sql"));
    assert_eq!(disk_state(dir.path(), &[]), before);
}
