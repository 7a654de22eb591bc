//! `gpkit new project`: the generated tree, dry runs, and every kind of bad
//! input (which must exit 1 and leave the disk as it was).

use std::path::Path;

use predicates::str::contains;

use crate::support::{assert_tree_snapshot, disk_state, gpkit, read_tree};

#[test]
fn generates_the_snapshotted_tree() {
    let dir = tempfile::tempdir().unwrap();

    gpkit(dir.path())
        .args(["--no-input", "new", "project", "shop"])
        .assert()
        .success()
        .stderr(contains("Created project `shop` at `shop`"))
        .stdout("");

    let root = dir.path().join("shop");
    let tree = read_tree(&root, &[".gpkit"]);
    assert_tree_snapshot("new-project/shop", &tree);

    // Every generated file has a manifest entry with its hash, and a base
    // copy with the same bytes but for the kit crate's files, whose bases
    // gpkit regenerates from the kit it released.
    let manifest = std::fs::read_to_string(root.join("gpkit.toml")).unwrap();
    for (path, contents) in tree.iter().filter(|(p, _)| p.as_str() != "gpkit.toml") {
        let copy = std::fs::read(root.join(".gpkit/base").join(path)).ok();
        if path.starts_with("kit/") {
            assert_eq!(copy, None, "{path} has a base copy");
        } else {
            assert_eq!(copy.as_ref(), Some(contents), "{path}");
        }
        assert!(
            manifest.contains(&format!("[files.\"{path}\"]")),
            "{path} missing from the manifest"
        );
    }
}

#[test]
fn output_is_deterministic() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    gpkit(a.path())
        .args(["new", "project", "shop"])
        .assert()
        .success();
    gpkit(b.path())
        .args(["new", "project", "shop"])
        .assert()
        .success();
    assert_eq!(
        read_tree(&a.path().join("shop"), &[]),
        read_tree(&b.path().join("shop"), &[])
    );
}

#[test]
fn the_crate_name_follows_the_package_name() {
    let dir = tempfile::tempdir().unwrap();
    gpkit(dir.path())
        .args(["new", "project", "order-service"])
        .assert()
        .success();
    let server =
        std::fs::read_to_string(dir.path().join("order-service/src/bin/server.rs")).unwrap();
    assert!(
        server.contains("use order_service::startup::Application;"),
        "{server}"
    );
    let cargo = std::fs::read_to_string(dir.path().join("order-service/Cargo.toml")).unwrap();
    assert!(cargo.contains("name = \"order-service\""), "{cargo}");
}

#[test]
fn dry_run_prints_the_plan_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();

    let output = gpkit(dir.path())
        .args(["--dry-run", "new", "project", "shop"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();

    let text = String::from_utf8(output).unwrap();
    assert!(
        text.starts_with("Plan for `gpkit new project shop` in `shop`:\n"),
        "{text}"
    );
    assert!(text.contains("  create  kit/src/config.rs "), "{text}");
    assert!(
        text.contains("Typed configuration, loaded from the environment"),
        "{text}"
    );
    assert!(
        text.contains("  create  migrations/20200101000100_outbox.sql "),
        "{text}"
    );
    assert!(text.contains("Nothing was written (--dry-run)."), "{text}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn dry_run_with_diff_shows_the_contents() {
    let dir = tempfile::tempdir().unwrap();
    let output = gpkit(dir.path())
        .args(["--dry-run", "--diff", "new", "project", "shop"])
        .output()
        .unwrap();
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(
        text.contains("--- /dev/null\n+++ b/kit/src/outbox/store.rs\n"),
        "{text}"
    );
    assert!(
        text.contains("+CREATE INDEX outbox_events_unpublished_idx"),
        "{text}"
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// Runs `gpkit new project <args>` in a directory holding `existing`, and
/// checks that it fails with `message` and leaves the directory unchanged.
fn assert_refused(args: &[&str], setup: impl Fn(&Path), message: &str) {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path());
    let before = disk_state(dir.path(), &[]);

    let output = gpkit(dir.path()).args(args).output().unwrap();

    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(
        stderr.contains(message),
        "{args:?}: expected {message:?} in:\n{stderr}"
    );
    assert!(
        stderr.contains("help: "),
        "{args:?} gives no help: {stderr}"
    );
    assert_eq!(
        disk_state(dir.path(), &[]),
        before,
        "{args:?} changed the disk"
    );
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.contains("gpkit-staging"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

fn nothing(_: &Path) {}

#[test]
fn invalid_names_are_refused() {
    let cases: &[(&str, &str)] = &[
        ("", "the project name is empty"),
        ("my shop", "not a valid Cargo package name"),
        ("a/b", "is a path"),
        ("..", "is a path"),
        ("9lives", "must start with a letter"),
        ("fn", "is a Rust keyword"),
        ("std", "is reserved"),
        ("test", "is reserved"),
        ("core", "is reserved"),
    ];
    for (name, message) in cases {
        assert_refused(&["--no-input", "new", "project", name], nothing, message);
    }
}

#[test]
fn a_non_empty_destination_is_refused_with_its_entries_listed() {
    assert_refused(
        &["new", "project", "shop"],
        |dir| {
            std::fs::create_dir(dir.join("shop")).unwrap();
            std::fs::write(dir.join("shop/notes.txt"), "mine").unwrap();
            std::fs::create_dir(dir.join("shop/src")).unwrap();
        },
        "`shop` already exists and is not empty; nothing was written. It contains:\n  notes.txt\n  src\n",
    );
}

#[test]
fn a_file_at_the_destination_is_refused() {
    assert_refused(
        &["new", "project", "shop"],
        |dir| std::fs::write(dir.join("shop"), "a file").unwrap(),
        "already exists and is not a directory",
    );
}

#[test]
fn an_empty_destination_directory_is_used() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("shop")).unwrap();
    gpkit(dir.path())
        .args(["new", "project", "shop"])
        .assert()
        .success();
    assert!(dir.path().join("shop/gpkit.toml").is_file());
}

#[test]
fn a_missing_name_without_input_is_an_error() {
    assert_refused(
        &["--no-input", "new", "project"],
        nothing,
        "missing the project name",
    );
    // Standard input is not a terminal in tests, so gpkit must not prompt.
    assert_refused(&["new", "project"], nothing, "missing the project name");
}

#[test]
fn dash_c_must_name_a_directory() {
    assert_refused(
        &["-C", "nowhere", "new", "project", "shop"],
        nothing,
        "`-C nowhere`: no such directory",
    );
    assert_refused(
        &["-C", "file", "new", "project", "shop"],
        |dir| std::fs::write(dir.join("file"), "").unwrap(),
        "`-C file` is not a directory",
    );
}

#[test]
fn dash_c_creates_the_project_there() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("work")).unwrap();
    gpkit(dir.path())
        .args(["-C", "work", "new", "project", "shop"])
        .assert()
        .success();
    assert!(dir.path().join("work/shop/Cargo.toml").is_file());
}

/// A parent directory gpkit may not write to. As root, permission bits do
/// not apply, so the command runs as `nobody` through `setpriv`.
#[cfg(unix)]
#[test]
fn an_unwritable_parent_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let locked = dir.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o555)).unwrap();

    let gpkit_bin = assert_cmd::cargo::cargo_bin("gpkit");
    let mut command = if is_root() {
        let mut c = std::process::Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&gpkit_bin);
        c
    } else {
        std::process::Command::new(&gpkit_bin)
    };
    let output = command
        .current_dir(dir.path())
        .args(["-C", "locked", "new", "project", "shop"])
        .output()
        .unwrap();

    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("Permission denied"), "{stderr}");
    assert!(stderr.contains("nothing was written"), "{stderr}");
    assert!(
        stderr.contains("help: check that you can write"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_dir(&locked).unwrap().count(), 0);
}

#[cfg(unix)]
fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout == b"0\n")
        .unwrap_or(false)
}

/// `gpkit ... | head` closes the pipe early: gpkit stops quietly, exit 0.
#[test]
fn a_closed_output_pipe_ends_quietly() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("gpkit"))
        .args(["--dry-run", "--diff", "new", "project", "shop"])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 16];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    // The read end is dropped here, as `head` would close it.
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{output:?}");
    assert_eq!(String::from_utf8_lossy(&output.stderr), "");
}

/// The `[dependencies]` of the service's `Cargo.toml` at `project`, by name.
fn dependencies(project: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(project.join("Cargo.toml")).unwrap();
    let doc: toml_edit::DocumentMut = text.parse().unwrap();
    doc["dependencies"]
        .as_table()
        .unwrap()
        .iter()
        .map(|(name, _)| name.to_string())
        .collect()
}

/// A new project is as small as its code: its `src/lib.rs` re-exports none
/// of the kit's modules (an older project's paths such as `crate::outbox`),
/// and its `Cargo.toml` lists the kit and the crates its own code names;
/// the kit's dependencies are in `kit/Cargo.toml`.
#[test]
fn a_new_project_has_no_reexports_and_only_the_dependencies_its_code_names() {
    let base = [
        "anyhow", "axum", "confique", "kit", "sqlx", "tokio", "tracing",
    ];
    for (args, extra) in [
        (&["--no-worker"][..], &[][..]),
        (&["--worker"][..], &[][..]),
        (&["--example"][..], &["serde", "serde_json", "uuid"][..]),
        (
            &["--example", "--db", "sea-orm"][..],
            &["sea-orm", "serde", "serde_json", "uuid"][..],
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let project = crate::support::new_project(dir.path(), args);
        let lib = std::fs::read_to_string(project.join("src/lib.rs")).unwrap();
        assert!(!lib.contains("pub use"), "{args:?}: {lib}");
        let mut wanted: Vec<&str> = base.iter().chain(extra).copied().collect();
        wanted.sort_unstable();
        assert_eq!(dependencies(&project), wanted, "{args:?}");
        let kit = std::fs::read_to_string(project.join("kit/Cargo.toml")).unwrap();
        assert!(kit.contains("\nredis = "), "{kit}");
    }
}

/// An event's fields may name crates (`datetime` is `chrono::DateTime`,
/// `json` is `serde_json::Value`): `gpkit add event` adds them to the
/// service's `Cargo.toml`, at the kit's versions.
#[test]
fn an_events_field_types_bring_their_crates() {
    let dir = tempfile::tempdir().unwrap();
    let project = crate::support::new_project(dir.path(), &["--worker"]);
    let names = dependencies(&project);
    assert!(
        !names
            .iter()
            .any(|n| ["chrono", "serde", "serde_json"].contains(&n.as_str()))
    );
    gpkit(&project)
        .args(["add", "event", "orderPlaced", "--field", "at:datetime"])
        .args(["--field", "extra:Option<json>"])
        .assert()
        .success();
    let names = dependencies(&project);
    for name in ["chrono", "serde", "serde_json"] {
        assert!(names.iter().any(|n| n == name), "{name}: {names:?}");
    }
    let lib = std::fs::read_to_string(project.join("src/lib.rs")).unwrap();
    assert!(!lib.contains("pub use"), "{lib}");
}
