//! `gpkit add worker`: the same result as a new project with the worker,
//! without losing what the user changed, and idempotent.

use predicates::str::contains;

use crate::support::{
    assert_tree_snapshot, changed_since, disk_state, edit, gpkit, new_project, read_tree,
};

#[test]
fn adding_the_worker_gives_exactly_what_new_project_gives() {
    let with = tempfile::tempdir().unwrap();
    let without = tempfile::tempdir().unwrap();
    let expected = new_project(with.path(), &[]);
    let project = new_project(without.path(), &["--no-worker"]);

    gpkit(&project)
        .args(["add", "worker"])
        .assert()
        .success()
        .stderr(contains("The worker is added"));

    assert_eq!(read_tree(&project, &[]), read_tree(&expected, &[]));
}

#[test]
fn a_second_run_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let project = new_project(dir.path(), &[]);
    let before = disk_state(&project, &[]);

    gpkit(&project)
        .args(["add", "worker"])
        .assert()
        .success()
        .stderr(contains("The worker is already there; nothing to do."));

    assert_eq!(disk_state(&project, &[]), before);
}

#[test]
fn outside_a_project_it_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    gpkit(dir.path())
        .args(["add", "worker"])
        .assert()
        .code(1)
        .stderr(contains("is not a gpkit project: it has no `gpkit.toml`"))
        .stderr(contains("help:"));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn dry_run_shows_the_plan_and_diffs_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let project = new_project(dir.path(), &["--no-worker"]);
    let before = disk_state(&project, &[]);

    let output = gpkit(&project)
        .args(["--dry-run", "--diff", "add", "worker"])
        .output()
        .unwrap();

    let text = String::from_utf8(output.stdout).unwrap();
    assert!(output.status.success());
    assert!(text.contains("  create  src/bin/worker.rs "), "{text}");
    assert!(text.contains("  update  Cargo.toml "), "{text}");
    assert!(text.contains("+name = \"worker\""), "{text}");
    // The kit crate has the worker's code already: the feature turns it on.
    assert!(text.contains("features = [\"worker\"]"), "{text}");
    assert_eq!(disk_state(&project, &[]), before);
}

#[test]
fn the_users_edits_survive_and_the_changed_files_match_the_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let project = new_project(dir.path(), &["--no-worker"]);
    // A dependency of their own with a comment, a module of their own, and
    // code added to a kit file.
    edit(
        &project.join("Cargo.toml"),
        "[dependencies]\n",
        "[dependencies]\n# money maths, ours\nrust_decimal = \"1\"\n",
    );
    edit(
        &project.join("src/lib.rs"),
        "// gpkit:end modules\n",
        "// gpkit:end modules\n\npub mod orders;\n",
    );
    std::fs::write(project.join("src/orders.rs"), "//! Orders.\n").unwrap();
    let config = project.join("kit/src/config.rs");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("\n/// The shop's own constant.\npub const SHOP_CURRENCY: &str = \"EUR\";\n");
    std::fs::write(&config, text).unwrap();
    let before = read_tree(&project, &[".gpkit"]);

    gpkit(&project).args(["add", "worker"]).assert().success();

    let after = read_tree(&project, &[".gpkit"]);
    let changed = changed_since(&before, &project);
    assert_tree_snapshot("add-worker/edited", &changed);
    let cargo = String::from_utf8(after["Cargo.toml"].clone()).unwrap();
    assert!(
        cargo.contains("# money maths, ours\nrust_decimal = \"1\"\n"),
        "{cargo}"
    );
    let lib = String::from_utf8(after["src/lib.rs"].clone()).unwrap();
    assert!(
        lib.contains("pub mod listeners;") && lib.ends_with("pub mod orders;\n"),
        "{lib}"
    );
    let config = String::from_utf8(after["kit/src/config.rs"].clone()).unwrap();
    assert!(
        config.contains("pub const SHOP_CURRENCY") && config.contains("pub struct WorkerConfig"),
        "{config}"
    );
}

#[test]
fn a_missing_outbox_migration_is_written_again() {
    let dir = tempfile::tempdir().unwrap();
    let project = new_project(dir.path(), &["--no-worker"]);
    let migration = project.join("migrations/20200101000100_outbox.sql");
    let original = std::fs::read(&migration).unwrap();
    std::fs::remove_file(&migration).unwrap();

    gpkit(&project).args(["add", "worker"]).assert().success();

    assert_eq!(std::fs::read(&migration).unwrap(), original);
}

#[test]
fn a_removed_region_stops_it_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let project = new_project(dir.path(), &["--no-worker"]);
    edit(&project.join("src/lib.rs"), "// gpkit:begin modules\n", "");
    edit(&project.join("src/lib.rs"), "// gpkit:end modules\n", "");
    let before = disk_state(&project, &[]);

    gpkit(&project)
        .args(["add", "worker"])
        .assert()
        .code(1)
        .stderr(contains("`src/lib.rs`: the gpkit region `modules` is gone"))
        .stderr(contains("pub mod listeners;"))
        .stderr(contains("nothing was written"));

    assert_eq!(disk_state(&project, &[]), before);
}
