//! `gpkit new project --db sea-orm`: the SeaORM variant's tree, its bad
//! input, and end to end a SeaORM project with the worker and two events
//! that builds cleanly, passes its own tests, has the kit and the
//! migrations that gpkit's workspace runs the kit's tests on (the SeaORM
//! outbox contract among them, `scripts/test`), and upgrades as a no-op.

use std::path::Path;

use predicates::str::contains;

use crate::e2e::build_and_test;
use crate::support::{assert_tree_snapshot, disk_state, gpkit, read_tree, readme_examples};

#[test]
fn new_project_with_sea_orm_generates_the_snapshotted_tree() {
    let dir = tempfile::tempdir().unwrap();

    gpkit(dir.path())
        .args(["--no-input", "new", "project", "shop", "--db", "sea-orm"])
        .assert()
        .success()
        .stderr(contains("Created project `shop` at `shop`"));

    let root = dir.path().join("shop");
    let tree = read_tree(&root, &[".gpkit"]);
    assert_tree_snapshot("new-project/shop-seaorm", &tree);
    let manifest = String::from_utf8(tree["gpkit.toml"].clone()).unwrap();
    assert!(manifest.contains("\ndb = \"sea-orm\"\n"), "{manifest}");
}

#[test]
fn new_project_refuses_an_unknown_layer() {
    let dir = tempfile::tempdir().unwrap();
    let before = disk_state(dir.path(), &[]);
    gpkit(dir.path())
        .args(["--no-input", "new", "project", "shop", "--db", "diesel"])
        .assert()
        .code(2)
        .stderr(contains("invalid value 'diesel' for '--db <LAYER>'"));
    assert_eq!(disk_state(dir.path(), &[]), before);
}

/// The handler `gpkit add event` prints in a SeaORM project, as a file of
/// `project` (built by the caller); the README's SeaORM examples are the
/// SeaORM `--example` project's code.
fn add_the_dispatch_examples(project: &Path, printed: &str) {
    let hint: String = printed
        .lines()
        .skip_while(|line| !line.starts_with("Dispatch it"))
        .skip_while(|line| !line.is_empty())
        .skip(1)
        .take_while(|line| line.is_empty() || line.starts_with("    "))
        .map(|line| format!("{}\n", line.strip_prefix("    ").unwrap_or(line)))
        .collect();
    assert!(
        hint.contains("kit::dispatch(tx, &event).await?;"),
        "{printed}"
    );
    let readme = std::fs::read_to_string(project.join("README.md")).unwrap();
    let examples = readme_examples(&readme, "templates/example-seaorm");
    assert!(examples[0].contains(".insert(tx)"), "{examples:?}");
    assert!(
        examples[0].contains("kit::dispatch(tx, &event)"),
        "{examples:?}"
    );

    std::fs::write(
        project.join("src/dispatch_hint.rs"),
        format!("//! What `gpkit add event` printed.\n\n{}\n", hint.trim()),
    )
    .unwrap();
    let lib = project.join("src/lib.rs");
    let mut text = std::fs::read_to_string(&lib).unwrap();
    text.push_str("pub mod dispatch_hint;\n");
    std::fs::write(&lib, text).unwrap();
}

#[test]
#[ignore = "builds a generated project"]
fn a_seaorm_project_with_the_worker_and_two_events_builds_passes_its_tests_and_upgrades_as_a_no_op()
{
    // Arrange: the project, with an event that has a listener and one that
    // has none (`order_id:uuid` is what the printed handler needs).
    let dir = tempfile::tempdir().unwrap();
    gpkit(dir.path())
        .args(["--no-input", "new", "project", "shop", "--db", "sea-orm"])
        .arg("--worker")
        .assert()
        .success();
    let project = dir.path().join("shop");
    let added = gpkit(&project)
        .args(["add", "event", "orderPlaced", "--field", "order_id:uuid"])
        .args(["--listener", "audit"])
        .output()
        .unwrap();
    assert!(added.status.success());
    gpkit(&project)
        .args(["add", "event", "orderShipped", "--field", "order_id:uuid"])
        .assert()
        .success();
    add_the_dispatch_examples(&project, &String::from_utf8(added.stderr).unwrap());

    // Act and assert: zero warnings, clippy, fmt, and the project's own
    // tests.
    let (_, tests) = build_and_test(&project);
    let report = String::from_utf8_lossy(&tests.stdout);
    assert!(
        report.contains("test both_probes_answer_200_when_the_database_is_up ... ok"),
        "{report}"
    );
    // The project's `cargo test` is the service's: the kit's tests are not
    // among them.
    assert!(!report.contains("an_entity_and_its_event_commit_together"));

    // The kit's SeaORM contract and relay tests (`tests::outbox_seaorm`,
    // `tests::relay_seaorm`) run in gpkit's workspace (`cargo test -p
    // gpkit-kit --all-features` in scripts/test), on templates/kit and the
    // migrations of templates/project. They are this project's kit and
    // migrations byte for byte (the kit's manifest apart, which names the
    // package `shop-kit`), so running them here again would only compile
    // the kit's tests a second time.
    let repo = crate::support::repo();
    for (path, bytes) in read_tree(&repo.join("templates/kit"), &[]) {
        if path != "Cargo.toml" {
            assert_eq!(
                std::fs::read(project.join("kit").join(&path)).ok(),
                Some(bytes),
                "kit/{path} is not templates/kit/{path}"
            );
        }
    }
    for (path, bytes) in read_tree(&repo.join("templates/project/migrations"), &[]) {
        assert_eq!(
            std::fs::read(project.join("migrations").join(&path)).ok(),
            Some(bytes),
            "migrations/{path} is not the template's"
        );
    }

    // Nothing changed since gpkit wrote it: upgrading changes nothing.
    let before = disk_state(&project, &[]);
    gpkit(&project)
        .args(["upgrade", "templates"])
        .assert()
        .success()
        .stdout(contains("Up to date with template set"));
    assert_eq!(disk_state(&project, &[]), before);
}

/// The data layer is an answer of the manifest: `gpkit add worker` later
/// renders the SeaORM variant of the worker's files (the transactor that
/// wakes the relay), exactly as `new project --worker` would have.
#[test]
fn add_worker_in_a_seaorm_project_gives_what_new_project_with_the_worker_gives() {
    let later = tempfile::tempdir().unwrap();
    let at_once = tempfile::tempdir().unwrap();
    for (dir, worker) in [(&later, "--no-worker"), (&at_once, "--worker")] {
        gpkit(dir.path())
            .args(["--no-input", "new", "project", "shop", "--db", "sea-orm"])
            .arg(worker)
            .assert()
            .success();
        gpkit(&dir.path().join("shop"))
            .args(["add", "event", "orderPlaced", "--field", "order_id:i64"])
            .assert()
            .success();
    }
    gpkit(&later.path().join("shop"))
        .args(["add", "worker"])
        .assert()
        .success();

    let tree = read_tree(&later.path().join("shop"), &[]);
    assert!(tree.contains_key("src/bin/worker.rs"));
    let startup = String::from_utf8_lossy(&tree["src/startup.rs"]).into_owned();
    assert!(
        startup.contains("pub transactor: kit::orm::Transactor,"),
        "{startup}"
    );
    assert!(startup.contains(".orm(),"), "{startup}");
    assert_eq!(tree, read_tree(&at_once.path().join("shop"), &[]));
}

#[test]
#[ignore = "builds a generated project"]
fn a_seaorm_project_without_the_worker_builds_cleanly_and_passes_its_tests() {
    let dir = tempfile::tempdir().unwrap();
    gpkit(dir.path())
        .args(["--no-input", "new", "project", "lean", "--db", "sea-orm"])
        .arg("--no-worker")
        .assert()
        .success();
    let project = dir.path().join("lean");
    gpkit(&project)
        .args(["add", "event", "orderPlaced", "--field", "order_id:i64"])
        .assert()
        .success();

    let (_, tests) = build_and_test(&project);
    let report = String::from_utf8_lossy(&tests.stdout);
    assert!(
        report.contains("test both_probes_answer_200_when_the_database_is_up ... ok"),
        "{report}"
    );
}
