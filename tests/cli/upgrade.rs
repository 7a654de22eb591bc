//! `gpkit upgrade templates` on fixtures made by earlier template sets (with
//! typical user edits) and on fresh projects: the report, the files, the
//! exit codes, and that nothing changes when nothing should.

use std::path::{Path, PathBuf};
use std::process::Command;

use predicates::str::contains;

use gpkit::engine::blueprint::TEMPLATE_SET_VERSION;

use crate::support::{
    assert_text_snapshot, assert_tree_snapshot, changed_since, disk_state, fixture_names, gpkit,
    materialise_fixture, read_tree,
};

/// The project of upgrade fixture `name` (`tests/fixtures/upgrade`),
/// materialised in a temp dir.
fn fixture(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("legacy-shop");
    materialise_fixture(name, &project);
    (dir, project)
}

/// Runs the upgrade in `project`; its exit code and standard output.
fn upgrade(project: &Path, args: &[&str]) -> (i32, String) {
    let output = gpkit(project)
        .args(["upgrade", "templates"])
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.is_empty() || output.status.code() == Some(1),
        "unexpected stderr: {stderr}"
    );
    (
        output.status.code().unwrap(),
        String::from_utf8(output.stdout).unwrap(),
    )
}

#[test]
fn a_clean_upgrade_merges_everything_and_reports_each_file() {
    let (_dir, project) = fixture("synthetic-0-clean");
    let before = read_tree(&project, &[".gpkit"]);

    let (code, report) = upgrade(&project, &[]);

    assert_eq!(code, 0, "{report}");
    assert_text_snapshot("upgrade/synthetic-0-clean/report.txt", &report);
    assert_tree_snapshot(
        "upgrade/synthetic-0-clean/changed",
        &changed_since(&before, &project),
    );
    let deleted: Vec<&String> = before
        .keys()
        .filter(|p| !project.join(p).exists())
        .collect();
    // The kit's files moved into the kit crate (its tests, since set 15,
    // into `kit/src/tests/` but for the binaries' test program and goose's
    // support module); the one the kit dropped went.
    let in_kit = |path: &str| {
        let in_crate = match path.strip_prefix("tests/") {
            Some("support/mod.rs") => "src/tests/support.rs".to_string(),
            Some(test) if !test.contains('/') => format!("src/tests/{test}"),
            _ => path.to_string(),
        };
        project.join("kit").join(path).exists() || project.join("kit").join(in_crate).exists()
    };
    for path in &deleted {
        assert!(
            path.as_str() == "src/version.rs" || in_kit(path),
            "{path} is gone"
        );
    }
    assert!(
        deleted.contains(&&"src/version.rs".to_string()),
        "{deleted:?}"
    );
    // The manifest now records the current template set, and a second run finds nothing to do.
    let manifest = std::fs::read_to_string(project.join("gpkit.toml")).unwrap();
    assert!(
        manifest.contains(&format!("template_set = {TEMPLATE_SET_VERSION}")),
        "{manifest}"
    );
    let after = read_tree(&project, &[]);
    let (code, report) = upgrade(&project, &[]);
    assert_eq!(code, 0);
    assert!(
        report.starts_with(&format!(
            "Up to date with template set {TEMPLATE_SET_VERSION}.\n"
        )),
        "{report}"
    );
    assert_eq!(
        read_tree(&project, &[]),
        after,
        "a second upgrade changed files"
    );
}

#[test]
fn overlapping_edits_leave_conflict_markers_and_exit_3() {
    let (_dir, project) = fixture("synthetic-0-conflict");

    let (code, report) = upgrade(&project, &[]);

    assert_eq!(code, 3, "{report}");
    assert_text_snapshot("upgrade/synthetic-0-conflict/report.txt", &report);
    let dispatcher = std::fs::read_to_string(project.join("kit/src/outbox/dispatcher.rs")).unwrap();
    assert!(
        dispatcher.contains(
            "<<<<<<< ours\n        tracing::info!(event = E::NAME, id = %envelope.id, \"stored (audited)\");\n=======\n"
        ),
        "{dispatcher}"
    );
    assert!(
        dispatcher.contains("\"event stored in the outbox\");\n>>>>>>> theirs\n"),
        "{dispatcher}"
    );

    // Run again before resolving: the markers are reported, not merged over.
    let before = disk_state(&project, &[]);
    let (code, report) = upgrade(&project, &[]);
    assert_eq!(code, 3, "{report}");
    assert!(
        report.starts_with("Nothing new to upgrade, but conflicts remain to resolve:\n"),
        "{report}"
    );
    assert!(
        report.contains("kit/src/outbox/dispatcher.rs") && report.contains("markers remain"),
        "{report}"
    );
    assert_eq!(disk_state(&project, &[]), before);
    // An add refuses too, naming the file.
    gpkit(&project)
        .args(["add", "event", "orderPlaced"])
        .assert()
        .code(1)
        .stderr(contains(
            "`kit/src/outbox/dispatcher.rs` still has the conflict markers of an earlier upgrade",
        ));

    // Once resolved (here: taking the kit's side), the project is up to date.
    let resolved = dispatcher
        .split("<<<<<<< ours\n")
        .next()
        .unwrap()
        .to_string()
        + dispatcher
            .split("=======\n")
            .nth(1)
            .unwrap()
            .replace(">>>>>>> theirs\n", "")
            .as_str();
    std::fs::write(project.join("kit/src/outbox/dispatcher.rs"), resolved).unwrap();
    let (code, report) = upgrade(&project, &[]);
    assert_eq!(code, 0, "{report}");
}

#[test]
fn dry_run_and_check_change_nothing_byte_for_byte() {
    let (_dir, project) = fixture("synthetic-0-conflict");
    let before_dry = read_tree(&project, &[]);
    let output = gpkit(&project)
        .args(["--dry-run", "--diff", "upgrade", "templates"])
        .output()
        .unwrap();
    let text = String::from_utf8(output.stdout).unwrap();
    assert_eq!(output.status.code(), Some(0), "{text}");
    assert!(
        text.contains("Plan for `gpkit upgrade templates`:"),
        "{text}"
    );
    assert!(
        text.contains("-//! Logs are plain text by default"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "An upgrade from template set 0 to {TEMPLATE_SET_VERSION} is available; nothing was written."
        )),
        "{text}"
    );
    assert_eq!(
        read_tree(&project, &[]),
        before_dry,
        "--dry-run changed the disk"
    );

    let (code, _) = upgrade(&project, &["--check"]);
    assert_eq!(code, 2, "--check exits 2 when an upgrade is available");
    assert_eq!(
        read_tree(&project, &[]),
        before_dry,
        "--check changed the disk"
    );
}

#[test]
fn the_json_report_lists_every_file() {
    let (_dir, project) = fixture("synthetic-0-clean");

    let (code, json) = upgrade(&project, &["--check", "--format", "json"]);

    assert_eq!(code, 2);
    let report: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(report["status"], "available");
    assert_eq!(report["from_template_set"], 0);
    assert_eq!(report["to_template_set"], TEMPLATE_SET_VERSION);
    let outcome = |path: &str| {
        report["files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["path"] == path)
            .map(|f| f["outcome"].clone())
    };
    // Template set 5 moved the kit's files into the kit crate, `kit/`.
    assert_eq!(outcome("src/telemetry.rs"), Some("moved away".into()));
    assert_eq!(outcome("kit/src/telemetry.rs"), Some("merged".into()));
    assert_eq!(outcome("kit/src/signals.rs"), Some("created".into()));
    assert_eq!(outcome("src/version.rs"), Some("deleted".into()));
    assert_eq!(outcome(".env.example"), Some("deleted by you".into()));
    assert_eq!(outcome("kit/src/migrate/naming.rs"), Some("moved".into()));
    assert_eq!(
        outcome("src/routes/health_check.rs"),
        Some("kept (now yours)".into())
    );
}

#[test]
fn a_fresh_project_is_already_up_to_date() {
    let dir = tempfile::tempdir().unwrap();
    gpkit(dir.path())
        .args(["new", "project", "shop"])
        .assert()
        .success();
    let project = dir.path().join("shop");
    let before = disk_state(&project, &[]);

    let (code, report) = upgrade(&project, &[]);
    assert_eq!(
        (code, report.as_str()),
        (
            0,
            format!("Up to date with template set {TEMPLATE_SET_VERSION}.\n").as_str()
        )
    );
    let (code, _) = upgrade(&project, &["--check"]);
    assert_eq!(code, 0);
    assert_eq!(disk_state(&project, &[]), before);
}

#[test]
fn deleted_kit_files_come_back_only_when_asked() {
    let (_dir, project) = fixture("synthetic-0-clean");
    upgrade(&project, &[]);
    assert!(!project.join(".env.example").exists());

    let (code, report) = upgrade(&project, &["--restore-deleted"]);

    assert_eq!(code, 0, "{report}");
    assert!(
        report.contains("created         .env.example") || report.contains("created  .env.example"),
        "{report}"
    );
    assert!(project.join(".env.example").is_file());
}

#[test]
fn a_project_from_a_newer_template_set_is_refused() {
    let (_dir, project) = fixture("synthetic-0-clean");
    let manifest = project.join("gpkit.toml");
    let text = std::fs::read_to_string(&manifest)
        .unwrap()
        .replace("template_set = 0", "template_set = 99");
    std::fs::write(&manifest, text).unwrap();
    let before = disk_state(&project, &[]);

    gpkit(&project)
        .args(["upgrade", "templates"])
        .assert()
        .code(1)
        .stderr(contains(format!(
            "template set 99, newer than this gpkit's template set {TEMPLATE_SET_VERSION}"
        )))
        .stderr(contains("help: install gpkit 0.0.9 or later"));
    assert_eq!(disk_state(&project, &[]), before);
}

#[test]
fn uncommitted_changes_to_files_it_would_touch_stop_it_in_a_git_repository() {
    let (_dir, project) = fixture("synthetic-0-clean");
    let git = |args: &[&str]| {
        let status = Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
            .args(args)
            .current_dir(&project)
            .output()
            .unwrap();
        assert!(
            status.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&status.stderr)
        );
    };
    git(&["init", "-q"]);
    git(&["add", "-A"]);
    git(&["commit", "-qm", "generated"]);
    let telemetry = project.join("src/telemetry.rs");
    let edited = std::fs::read_to_string(&telemetry).unwrap() + "\n// work in progress\n";
    std::fs::write(&telemetry, &edited).unwrap();
    let before = disk_state(&project, &[".git"]);

    gpkit(&project)
        .args(["upgrade", "templates"])
        .assert()
        .code(1)
        .stderr(contains("uncommitted changes"))
        .stderr(contains("src/telemetry.rs"))
        .stderr(contains("--allow-dirty"));
    assert_eq!(disk_state(&project, &[".git"]), before);

    let (code, _) = upgrade(&project, &["--allow-dirty"]);
    assert_eq!(code, 0);
    assert!(
        std::fs::read_to_string(project.join("kit/src/telemetry.rs"))
            .unwrap()
            .ends_with("// work in progress\n")
    );
}

#[test]
fn the_hyphenated_spelling_works_too() {
    let (_dir, project) = fixture("synthetic-0-clean");
    let output = gpkit(&project)
        .args(["upgrade-templates", "--check"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
}

/// Every released template set has a fixture with typical user edits; its
/// upgrade to the current set keeps them, conflicts exactly as declared,
/// and is pinned by a report snapshot.
#[test]
fn release_fixtures_upgrade_to_the_current_templates() {
    let releases = crate::release_fixtures::release_fixtures();
    assert!(releases.contains(&"v1-edited".to_string()), "{releases:?}");
    // What tests/fixtures/upgrade/expectations.toml declares: the user's
    // edits kept, and exit 3 (conflicts) only where it declares conflicts.
    // The oldest and the newest fixtures are also compiled (e2e.rs).
    let expectations = crate::release_fixtures::Expectations::load();
    let fresh = tempfile::tempdir().unwrap();
    expectations.assert_edits_are_not_in(&crate::support::new_project(fresh.path(), &[]));
    for release in releases {
        let (_dir, project) = fixture(&release);
        expectations.assert_edits_before_the_upgrade(&release, &project);
        let (code, report) = upgrade(&project, &[]);
        expectations.assert_upgraded(&release, &project, code, &report);
        assert_text_snapshot(&format!("upgrade/{release}/report.txt"), &report);
        let (code, _) = upgrade(&project, &["--check"]);
        assert_eq!(code, 0, "{release}: not up to date after the upgrade");
    }
}

/// The kit's tests moved from the service's `tests/` to the kit (`kit/src/tests/` since set 15): an
/// old copy the user never changed goes, one the user changed stays (and
/// is said so); the health test and its support module are now the user's.
#[test]
fn the_kit_tests_in_tests_go_unless_the_user_changed_them() {
    let (_dir, project) = fixture("v5-edited");
    crate::support::edit(
        &project.join("tests/queue.rs"),
        "use kit::dispatch::Event;",
        "use kit::dispatch::Event; // ours",
    );

    let (code, report) = upgrade(&project, &[]);

    assert_eq!(code, 0, "{report}");
    assert!(
        line(&report, "tests/queue.rs").contains("kept (no longer in the kit)"),
        "{report}"
    );
    assert!(project.join("tests/queue.rs").is_file());
    for gone in ["tests/relay.rs", "tests/outbox.rs", "tests/config.rs"] {
        assert!(line(&report, gone).contains("deleted"), "{report}");
        assert!(!project.join(gone).exists(), "{gone}");
    }
    assert!(project.join("kit/src/tests/queue.rs").is_file());
    let manifest = std::fs::read_to_string(project.join("gpkit.toml")).unwrap();
    assert!(
        !manifest.contains("[files.\"tests/queue.rs\"]"),
        "{manifest}"
    );
    assert!(
        manifest.contains("[files.\"tests/health.rs\"]\nowner = \"user\""),
        "{manifest}"
    );
}

/// The container files are kit files like the others: a kit change reaches
/// them (merged with the user's edits), and one the user deleted comes
/// back only with `--restore-deleted`.
#[test]
fn the_container_files_are_upgraded_like_the_other_kit_files() {
    let dir = tempfile::tempdir().unwrap();
    gpkit(dir.path())
        .args(["new", "project", "shop", "--deploy"])
        .assert()
        .success();
    let project = dir.path().join("shop");
    // As if an earlier gpkit had written an older Postgres image ...
    for copy in ["compose.yaml", ".gpkit/base/compose.yaml"] {
        crate::support::edit(
            &project.join(copy),
            "image: postgres:17",
            "image: postgres:15",
        );
    }
    // ... and the user then changed the port and the Dockerfile.
    crate::support::edit(
        &project.join("compose.yaml"),
        "\"8080:8080\"",
        "\"8000:8080\"",
    );
    crate::support::edit(
        &project.join("Dockerfile"),
        "ENV HTTP_ADDR=0.0.0.0:8080 LOG_FORMAT=json",
        "ENV HTTP_ADDR=0.0.0.0:8080 LOG_FORMAT=json TZ=UTC",
    );
    std::fs::remove_file(project.join(".dockerignore")).unwrap();

    let (code, report) = upgrade(&project, &["--allow-dirty"]);

    assert_eq!(code, 0, "{report}");
    assert!(line(&report, "compose.yaml").contains("merged"), "{report}");
    assert!(
        line(&report, ".dockerignore").contains("deleted by you"),
        "{report}"
    );
    let compose = std::fs::read_to_string(project.join("compose.yaml")).unwrap();
    assert!(
        compose.contains("image: postgres:17"),
        "the kit's change is missing"
    );
    assert!(compose.contains("\"8000:8080\""), "the user's edit is lost");
    let dockerfile = std::fs::read_to_string(project.join("Dockerfile")).unwrap();
    assert!(
        dockerfile.contains("LOG_FORMAT=json TZ=UTC"),
        "the user's edit is lost"
    );
    assert!(!project.join(".dockerignore").exists());

    let (code, report) = upgrade(&project, &["--restore-deleted", "--allow-dirty"]);
    assert_eq!(code, 0, "{report}");
    assert!(
        line(&report, ".dockerignore").contains("created"),
        "{report}"
    );
    assert!(project.join(".dockerignore").is_file());
}

/// The line of `report` about `path`.
fn line(report: &str, path: &str) -> String {
    report
        .lines()
        .find(|line| line.split_whitespace().any(|word| word == path))
        .unwrap_or_else(|| panic!("{path} is not in the report:\n{report}"))
        .to_string()
}

/// A new project keeps no copy of the kit under `.gpkit/base/`: gpkit
/// regenerates those bases from the kit it released. It still upgrades
/// as before, a kit file the user edited included, and twice is once.
#[test]
fn a_new_project_keeps_no_copy_of_the_kit_and_upgrades_fine() {
    let dir = tempfile::tempdir().unwrap();
    let project = crate::support::new_project(dir.path(), &["--worker"]);
    let copies: Vec<String> = read_tree(&project.join(".gpkit/base"), &[])
        .into_keys()
        .collect();
    assert_text_snapshot("new-project/base-copies.txt", &(copies.join("\n") + "\n"));
    assert!(!project.join(".gpkit/base/kit").exists(), "{copies:?}");
    assert!(project.join(".gpkit/base/Cargo.toml").is_file());

    crate::support::edit(
        &project.join("kit/src/telemetry.rs"),
        "use tracing::Subscriber;\n",
        "use tracing::Subscriber;\n// Ours: a note in the kit.\n",
    );
    let before = disk_state(&project, &[]);
    let (code, dry) = upgrade(&project, &["--dry-run"]);
    assert_eq!(code, 0, "{dry}");
    let (code, report) = upgrade(&project, &[]);
    assert_eq!(code, 0, "{report}");
    assert!(
        line(&report, "kit/src/telemetry.rs").contains("kept"),
        "{report}"
    );
    assert!(
        dry.ends_with(&report),
        "--dry-run printed another plan:\n{dry}"
    );
    assert_eq!(
        disk_state(&project, &[]),
        before,
        "the upgrade changed files"
    );
    assert_eq!(upgrade(&project, &["--check"]).0, 0);
}

/// The store of released kits has the kit of every release fixture made
/// since the kit became a crate (set 5): gpkit regenerates each kit file's
/// base from the hash the fixture's manifest records, and where the fixture
/// has a copy of it, the copy's bytes.
#[test]
fn the_released_kits_regenerate_the_kit_bases_of_every_release_fixture() {
    use gpkit::engine::manifest::{Manifest, sha256_hex};
    use gpkit::engine::released::Store;
    let mut checked = 0;
    for name in fixture_names() {
        if !name.starts_with('v') || !name.ends_with("-edited") {
            continue;
        }
        let (_dir, root) = fixture(&name);
        let manifest = Manifest::load(&root).unwrap();
        for (path, record) in manifest.files.iter().filter(|(p, _)| p.starts_with("kit/")) {
            let found = Store::embedded().find(path, &record.sha256, &manifest.answers.name);
            assert!(found.is_some(), "{name}: {path} is not in the store");
            // Fixtures of set 5 have copies (gpkit wrote them then).
            if let Ok(copy) = std::fs::read(root.join(".gpkit/base").join(path)) {
                assert_eq!(sha256_hex(&copy), record.sha256, "{name}: {path}");
                assert_eq!(found, Some(copy), "{name}: {path}");
            }
            checked += 1;
        }
    }
    assert!(checked >= 68, "only {checked} kit files checked");
}

/// Every upgrade fixture materialises from its stores: each file its
/// listing names, and each kit file of sets 1-4 the tests' store lists, has
/// a blob (in `templates/released` or `tests/fixtures/store`) that hashes to
/// its name; every fixture directory has its listing; and no blob of the
/// tests' store is named by nothing (as `scripts/fixture check`).
#[test]
fn every_fixture_materialises_from_the_stores() {
    use crate::support::{blob, read_listing, repo};
    use gpkit::engine::manifest::sha256_hex;
    let fixtures = repo().join("tests/fixtures/upgrade");
    let names = fixture_names();
    assert!(names.contains(&"v1-edited".to_string()), "{names:?}");
    for entry in std::fs::read_dir(&fixtures).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        if entry.file_type().unwrap().is_dir() {
            assert!(
                names.contains(&name),
                "tests/fixtures/upgrade/{name}/ has no listing"
            );
        }
    }
    let mut named = std::collections::BTreeSet::new();
    for name in &names {
        let dir = tempfile::tempdir().unwrap();
        materialise_fixture(name, &dir.path().join("project"));
        assert!(dir.path().join("project/gpkit.toml").is_file(), "{name}");
        named.extend(
            read_listing(&fixtures.join(format!("{name}.sha256")))
                .into_iter()
                .map(|(sha256, _)| sha256),
        );
    }
    let store = repo().join("tests/fixtures/store");
    let mut sets = 0;
    for entry in std::fs::read_dir(&store).unwrap() {
        let list = entry.unwrap().path();
        if list.extension().is_none_or(|e| e != "sha256") {
            continue;
        }
        for (sha256, path) in read_listing(&list) {
            assert!(
                blob(&sha256).is_some(),
                "{}: no blob for {path}",
                list.display()
            );
            named.insert(sha256);
        }
        sets += 1;
    }
    assert!(sets >= 4, "the kits of sets 1-4 are not listed");
    for entry in std::fs::read_dir(store.join("blobs")).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let name = file
            .strip_suffix(".gz")
            .unwrap_or_else(|| panic!("{file}: not <sha256>.gz"));
        let bytes = gpkit::engine::released::unpack(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(
            sha256_hex(&bytes),
            name,
            "the blob does not hold the bytes of its name"
        );
        assert!(
            named.contains(name),
            "tests/fixtures/store/blobs/{name} is named by no listing (scripts/fixture check)"
        );
    }
}

/// A project of template set 5 whose copies of the kit are gone upgrades
/// as it does with them: the bases come from the released kit of set 5.
#[test]
fn a_set_5_project_upgrades_without_its_copies_of_the_kit() {
    let (_with_dir, with) = fixture("v5-edited");
    let (_without_dir, without) = fixture("v5-edited");
    std::fs::remove_dir_all(without.join(".gpkit/base/kit")).unwrap();

    let (code, report) = upgrade(&without, &[]);
    assert!(code == 0 || code == 3, "exit {code}\n{report}");
    assert_eq!((code, report), upgrade(&with, &[]));
    assert_eq!(
        read_tree(&without, &[".gpkit"]),
        read_tree(&with, &[".gpkit"]),
        "the files differ from an upgrade with the copies"
    );
    assert_eq!(upgrade(&without, &["--check"]).0, 0);
}

/// A directory laid out as gpkit's store of released kits
/// (`templates/released`), with one release: `set` shipping `files` (path
/// inside the kit crate, bytes). Debug builds of gpkit read it from
/// `GPKIT_RELEASED_DIR`.
fn released_kit(dir: &Path, set: u32, files: &[(&str, &[u8])]) {
    use gpkit::engine::manifest::sha256_hex;
    std::fs::create_dir_all(dir.join("blobs")).unwrap();
    let mut list = String::new();
    for (path, bytes) in files {
        let sha256 = sha256_hex(bytes);
        let packed = gpkit::engine::released::pack(bytes);
        std::fs::write(dir.join("blobs").join(format!("{sha256}.gz")), packed).unwrap();
        list.push_str(&format!("{sha256}  {path}\n"));
    }
    std::fs::write(dir.join(format!("set-{set}.sha256")), list).unwrap();
}

/// A kit file the user edited is merged 3-way with a base from the
/// released kits: as if the project came from a release (set 0, which only
/// this test's store has) whose telemetry.rs had another doc comment, and the user then added code at its end. With
/// the base unknown, the same file is a conflict, and the edit is kept.
#[test]
fn an_edited_kit_file_merges_with_a_base_from_the_released_kits() {
    use gpkit::engine::manifest::sha256_hex;
    let dir = tempfile::tempdir().unwrap();
    let project = crate::support::new_project(dir.path(), &["--worker"]);
    let path = project.join("kit/src/telemetry.rs");
    let current = std::fs::read_to_string(&path).unwrap();
    let old = current.replace(
        "Logs are human-readable by default",
        "Logs are plain text by default",
    );
    assert_ne!(old, current);
    let store = dir.path().join("released");
    released_kit(&store, 0, &[("src/telemetry.rs", old.as_bytes())]);
    let manifest = project.join("gpkit.toml");
    crate::support::edit(
        &manifest,
        &sha256_hex(current.as_bytes()),
        &sha256_hex(old.as_bytes()),
    );
    crate::support::edit(
        &manifest,
        &format!("template_set = {TEMPLATE_SET_VERSION}"),
        "template_set = 0",
    );
    let ours = format!("{old}\n/// Ours.\npub const OURS: u8 = 1;\n");
    std::fs::write(&path, &ours).unwrap();
    let run = |args: &[&str], released: bool| {
        let mut cmd = gpkit(&project);
        if released {
            cmd.env("GPKIT_RELEASED_DIR", &store);
        }
        let output = cmd
            .args(["upgrade", "templates"])
            .args(args)
            .output()
            .unwrap();
        let stdout = String::from_utf8(output.stdout).unwrap();
        (output.status.code().unwrap(), stdout)
    };

    // No base: a conflict to report, never an overwrite.
    let (code, dry) = run(&["--dry-run"], false);
    assert_eq!(code, 0, "{dry}");
    let (_, report) = dry.split_once("nothing was written.\n").unwrap();
    assert!(
        line(report, "kit/src/telemetry.rs").contains("conflicted"),
        "{dry}"
    );

    let before = disk_state(&project, &[]);
    let (code, dry) = run(&["--dry-run"], true);
    assert_eq!(code, 0, "{dry}");
    assert_eq!(disk_state(&project, &[]), before, "--dry-run changed files");
    let (code, report) = run(&[], true);
    assert_eq!(code, 0, "{report}");
    assert!(
        report.starts_with(&format!(
            "Upgraded from template set 0 to {TEMPLATE_SET_VERSION}.\n"
        )),
        "{report}"
    );
    let files = report.split_once('\n').unwrap().1;
    assert!(
        dry.ends_with(files),
        "--dry-run printed another plan:\n{dry}"
    );
    assert!(
        line(&report, "kit/src/telemetry.rs").contains("merged"),
        "{report}"
    );
    let merged = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        merged,
        format!("{current}\n/// Ours.\npub const OURS: u8 = 1;\n")
    );
    // The new base is the current kit's: no copy of it, nothing left to do.
    assert!(!project.join(".gpkit/base/kit").exists());
    let after = disk_state(&project, &[]);
    let (code, report) = run(&[], false);
    assert_eq!(code, 0, "{report}");
    assert!(report.starts_with("Up to date"), "{report}");
    assert!(
        line(&report, "kit/src/telemetry.rs").contains("kept"),
        "{report}"
    );
    assert_eq!(
        disk_state(&project, &[]),
        after,
        "a second upgrade changed files"
    );
}

/// A kit the user patched is reported file by file (the patched files
/// `kept` or `merged`), not as one `replaced` line.
#[test]
fn a_patched_kit_is_reported_file_by_file() {
    let (_dir, project) = fixture("v5-edited");

    let (code, report) = upgrade(&project, &[]);

    assert_eq!(code, 0, "{report}");
    assert!(!report.contains("replaced"), "{report}");
    assert!(report.contains("kit/src/telemetry.rs"), "{report}");
    assert!(report.contains("kit/src/database.rs"), "{report}");
}

/// Template set 15 made most of the kit private (src/domain/kit_api_changes.toml):
/// an upgrade from set 14 names each line of the user's own code that uses
/// such an item, directly or through the compatibility re-exports of
/// `src/lib.rs`, and touches neither that file nor a line that names only
/// the kit's public API.
#[test]
fn lines_naming_an_item_the_kit_made_private_are_reported_and_left_alone() {
    let (_dir, project) = fixture("v14-edited");
    let admin = "\
//! The user's own module.
use kit::queue::Client;
use crate::migrate::{self, Migrator};

pub async fn f(config: &kit::config::Config) {
    let client = Client::from_config(&config.valkey).await.unwrap();
    let _ = crate::outbox::relay::Relay::new;
    let _ = migrate::files::create;
    let _ = kit::dispatch;
}
";
    std::fs::write(project.join("src/admin.rs"), admin).unwrap();
    let (code, out) = upgrade(&project, &[]);
    assert!(code == 0 || code == 3, "{out}");
    let report: Vec<&str> = out
        .lines()
        .skip_while(|line| !line.contains("src/admin.rs"))
        .skip(1)
        .take_while(|line| line.trim_start().starts_with("note:"))
        .collect();
    let noted: Vec<(&str, &str)> = report
        .iter()
        .map(|line| {
            let line = line.trim_start().trim_start_matches("note: ");
            let number = line.split(' ').nth(1).unwrap();
            let item = line.split('`').nth(1).unwrap();
            (number, item)
        })
        .collect();
    assert_eq!(
        noted,
        [
            ("2", "kit::queue"),
            ("3", "kit::migrate::Migrator"),
            ("6", "kit::queue"),
            ("7", "kit::outbox::relay"),
            ("8", "kit::migrate::files"),
        ],
        "{out}"
    );
    assert!(
        report[0].contains("to change (API of template set 15)")
            && report[0].contains("a service publishes with `kit::dispatch`"),
        "{out}"
    );
    assert_eq!(
        std::fs::read_to_string(project.join("src/admin.rs")).unwrap(),
        admin
    );
}

/// An older project's `src/lib.rs` re-exported thirteen kit modules
/// (`pub use kit::{config, outbox, ...}`) and its `Cargo.toml` listed the
/// kit's dependencies. The upgrade keeps the re-exports and dependencies
/// the user's code names, says which file uses each dependency kept, and
/// drops the rest, each dependency on a line of the report; the user's own
/// dependency stays.
#[test]
fn an_upgrade_keeps_the_reexports_and_dependencies_the_users_code_uses() {
    let (_dir, project) = fixture("v14-edited");
    let lib = std::fs::read_to_string(project.join("src/lib.rs")).unwrap();
    assert!(
        lib.contains("pub use kit::{operations, queue, scheduler, worker};"),
        "{lib}"
    );
    std::fs::write(
        project.join("src/relay_report.rs"),
        "//! Ours: what the relay did.\n\n\
         use crate::outbox;\n\n\
         // Once: use crate::config; a comment names nothing.\n\
         pub fn poll() -> std::time::Duration {\n    \
             let _ = outbox::dispatch;\n    \
             std::time::Duration::from_secs(1)\n}\n",
    )
    .unwrap();
    crate::support::edit(
        &project.join("src/lib.rs"),
        "// gpkit:end modules\n",
        "// gpkit:end modules\n\npub mod relay_report;\n",
    );
    std::fs::write(
        project.join("tests/cache.rs"),
        "use legacy_shop::{\n    startup::Application,\n    worker::listeners::Listeners,\n};\n\
         use redis::AsyncCommands;\n",
    )
    .unwrap();

    let (code, report) = upgrade(&project, &[]);
    assert_eq!(code, 0, "{report}");

    let lib = std::fs::read_to_string(project.join("src/lib.rs")).unwrap();
    let region = lib
        .split("// gpkit:begin modules\n")
        .nth(1)
        .and_then(|rest| rest.split("// gpkit:end modules").next())
        .unwrap();
    let uses: Vec<&str> = region
        .lines()
        .filter(|l| l.starts_with("pub use"))
        .collect();
    assert_eq!(
        uses,
        ["pub use kit::outbox;", "pub use kit::worker;"],
        "{lib}"
    );
    assert!(lib.contains("\npub mod relay_report;\n"), "{lib}");

    let cargo = std::fs::read_to_string(project.join("Cargo.toml")).unwrap();
    for kept in ["rust_decimal = ", "redis = ", "sqlx = ", "kit = "] {
        assert!(cargo.contains(&format!("\n{kept}")), "{kept}: {cargo}");
    }
    for removed in ["prost", "croner", "serde", "tracing-subscriber", "dotenvy"] {
        assert!(
            !cargo.contains(&format!("\n{removed} = ")),
            "{removed}: {cargo}"
        );
        let note = format!(
            "note: [dependencies] `{removed}`: removed: no code of yours uses it (the kit's \
             dependencies are in kit/Cargo.toml)"
        );
        assert!(report.contains(&note), "{removed}: {report}");
    }
    assert!(
        report.contains(
            "note: [dependencies] `redis`: kept, now yours: tests/cache.rs line 5 uses it \
             (gpkit no longer lists it)"
        ),
        "{report}"
    );
    assert!(!report.contains("rust_decimal"), "{report}");
    assert_eq!(upgrade(&project, &["--check"]).0, 0);
}

/// The code is read as the upgrade leaves it: in a project of set 1, the
/// binaries and `tests/support/mod.rs` were the kit's and name
/// `legacy_shop::migrate`, `queue` and `redis`; the upgrade gives them the
/// kit's changes one last time, after which they name none of these, so
/// neither the re-exports nor `redis` stay. The modules the user's own
/// files still name (`src/startup.rs`: `crate::config`) do.
#[test]
fn the_code_is_read_as_the_upgrade_leaves_it() {
    let (_dir, project) = fixture("v1-edited");
    let before = std::fs::read_to_string(project.join("tests/support/mod.rs")).unwrap();
    assert!(before.contains("redis::"), "{before}");

    let (code, report) = upgrade(&project, &[]);
    assert_eq!(code, 0, "{report}");

    let lib = std::fs::read_to_string(project.join("src/lib.rs")).unwrap();
    let uses: Vec<&str> = lib.lines().filter(|l| l.starts_with("pub use")).collect();
    assert_eq!(
        uses,
        [
            "pub use kit::{config, database, signals, telemetry, trace_context};",
            "pub use kit::worker;"
        ],
        "{lib}"
    );
    let cargo = std::fs::read_to_string(project.join("Cargo.toml")).unwrap();
    assert!(!cargo.contains("\nredis = "), "{cargo}");
    assert!(
        report.contains("[dependencies] `redis`: removed"),
        "{report}"
    );
}

/// The kit's documents, which the README's managed region links to.
const KIT_DOCS: &[&str] = &[
    "kit/README.md",
    "kit/docs/worker.md",
    "kit/docs/outbox.md",
    "kit/docs/ordering.md",
    "kit/docs/limits.md",
    "kit/docs/retries.md",
    "kit/docs/schedules.md",
    "kit/docs/valkey.md",
    "kit/docs/metrics.md",
    "kit/docs/operations.md",
];

/// `text` without the body of its `worker` region: the part that is the
/// user's.
fn outside_the_region(text: &str) -> String {
    let begin = text.find("<!-- gpkit:begin worker -->\n").unwrap();
    let end = text.find("<!-- gpkit:end worker -->\n").unwrap();
    format!("{}{}", &text[..begin], &text[end..])
}

/// An older project's README, which held the kit's reference in its
/// managed region, with text the user wrote around it: the upgrade keeps
/// the user's text byte for byte, the region now links the kit's
/// documents, and those are written with the kit. A region edited by hand
/// is reported and left as it is.
#[test]
fn the_kits_reference_moves_out_of_the_readme_and_the_users_text_stays() {
    let (_dir, project) = fixture("v22-edited");
    let readme = project.join("README.md");
    let generated = std::fs::read_to_string(&readme).unwrap();
    assert!(
        generated.contains("## The worker\n") && generated.contains("### Metrics\n"),
        "the set-22 README holds the kit's reference in its region"
    );
    let edited = generated.replacen(
        "# legacy-shop\n",
        "# legacy-shop\n\nOrders of the Lyon shop, and their invoices.\n",
        1,
    ) + "\n## On call\n\nPage the orders team first.\n";
    std::fs::write(&readme, &edited).unwrap();

    let (code, report) = upgrade(&project, &[]);

    assert_eq!(code, 0, "{report}");
    assert!(line(&report, "README.md").contains("merged"), "{report}");
    let upgraded = std::fs::read_to_string(&readme).unwrap();
    assert_eq!(outside_the_region(&upgraded), outside_the_region(&edited));
    let region = upgraded
        .split("<!-- gpkit:begin worker -->\n")
        .nth(1)
        .and_then(|rest| rest.split("<!-- gpkit:end worker -->").next())
        .unwrap();
    assert!(!region.contains("### Metrics"), "{region}");
    for doc in KIT_DOCS {
        assert!(region.contains(&format!("]({doc})")), "{doc}: {region}");
        assert!(line(&report, doc).contains("created"), "{report}");
        assert_eq!(
            std::fs::read(project.join(doc)).unwrap(),
            std::fs::read(crate::support::repo().join("templates").join(doc)).unwrap(),
            "{doc}"
        );
    }
    let (code, _) = upgrade(&project, &["--check"]);
    assert_eq!(code, 0, "not up to date after the upgrade");

    // The same README with a line of the user's inside the region: the
    // upgrade says so, and changes nothing in it.
    let (_dir, project) = fixture("v22-edited");
    let readme = project.join("README.md");
    let inside = generated.replacen("## The worker\n", "## The worker\n\nOurs.\n", 1);
    std::fs::write(&readme, &inside).unwrap();

    let (code, report) = upgrade(&project, &[]);

    assert_eq!(code, 3, "{report}");
    assert!(
        line(&report, "README.md").contains("conflicted (region)"),
        "{report}"
    );
    assert_eq!(std::fs::read_to_string(&readme).unwrap(), inside);
    assert!(project.join("kit/docs/worker.md").is_file());
}

/// A kit module that became a folder (`kit/src/queue/consumer.rs` to
/// `kit/src/queue/consumer/`) takes the user's edits of its old file into
/// the folder's `mod.rs`: merged where that code stayed there, conflict
/// markers where it went to another file of the folder. The old file never
/// stays beside the folder, where the crate would not build.
#[test]
fn an_edited_module_that_became_a_folder_moves_into_its_mod_rs() {
    const OLD: &str = "kit/src/queue/consumer.rs";
    const NEW: &str = "kit/src/queue/consumer/mod.rs";
    let edit = |from: &str, to: &str| {
        let (dir, project) = fixture("v24-edited");
        let path = project.join(OLD);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(from), "{OLD} no longer has {from:?}");
        std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
        (dir, project)
    };

    // An edit of lines that stayed in the folder's mod.rs: merged there.
    let (_dir, project) = edit(
        "//! - Success: the task is deleted,",
        "//! - Success (ours): the task is deleted,",
    );
    let (_, report) = upgrade(&project, &[]);
    assert!(!project.join(OLD).exists(), "{OLD} stayed:\n{report}");
    assert!(line(&report, NEW).contains("merged"), "{report}");
    assert!(report.contains(&format!("moved from {OLD}")), "{report}");
    let merged = std::fs::read_to_string(project.join(NEW)).unwrap();
    assert!(merged.contains("Success (ours)"), "{merged}");
    assert!(!merged.contains("<<<<<<<"), "{merged}");

    // An edit of lines that went to another file: kept in mod.rs with
    // conflict markers, and the upgrade says it conflicted.
    let (_dir, project) = edit(
        "let (id, task_type) = (&message.id, &message.r#type);",
        "let (id, task_type) = (&message.id, &message.r#type); // ours",
    );
    let (code, report) = upgrade(&project, &[]);
    assert_eq!(code, 3, "{report}");
    assert!(!project.join(OLD).exists(), "{OLD} stayed:\n{report}");
    assert!(line(&report, NEW).contains("conflicted"), "{report}");
    let conflicted = std::fs::read_to_string(project.join(NEW)).unwrap();
    assert!(conflicted.contains("<<<<<<<") && conflicted.contains("// ours"));
}

/// The files of fixture `v22-listeners` that hold its listeners and their
/// registration.
const SET_22_LISTENER_FILES: &[&str] = &[
    "src/listeners/mod.rs",
    "src/listeners/order_placed/mod.rs",
    "src/listeners/order_placed/send_receipt.rs",
    "src/listeners/order_placed/reserve_stock.rs",
];

/// The kit files that decide the policy of a listener registered without
/// one: `listen` and `ListenerOptions::new()`, `RetryPolicy::default()`,
/// and the constants it takes.
const POLICY_KIT_FILES: &[&str] = &[
    "kit/src/worker/listeners.rs",
    "kit/src/worker/listener_options.rs",
    "kit/src/worker/retry_policy.rs",
    "kit/src/outbox/relay.rs",
];

/// The line of `text` that declares `name`, from the name on:
/// `MAX_RETRY: u32 = 25;` whatever its visibility.
fn declaration(text: &str, name: &str) -> String {
    let pattern = format!("const {name}:");
    let line = text
        .lines()
        .find(|line| line.contains(&pattern))
        .unwrap_or_else(|| panic!("no `{pattern}` in:\n{text}"));
    line[line.find(name).unwrap()..].to_string()
}

/// The `[components]` part of a `gpkit.toml`: the events and listeners it
/// records, with any listener options their flags gave.
fn components(manifest: &str) -> &str {
    let start = manifest.find("\n[components]\n").unwrap();
    let end = manifest[start..].find("\n[files.").unwrap();
    &manifest[start..start + end]
}

/// A project of template set 22 with two listeners, as set 22's
/// `gpkit add event` wrote them (fixture `v22-listeners`: fixture
/// `v22-edited` after `add event orderPlaced --field order_id:i64
/// --listener send_receipt`, then `add event orderPlaced --listener
/// reserve_stock --concurrency 4`, both run by the gpkit of commit 9ca2d1b,
/// where set 22 was last recorded). The upgrade to the current set leaves
/// each listener and its registration byte for byte, gives neither
/// retries, a timeout nor a backoff, and does not name them in its report.
/// So they keep the old policy: `listen` and `ListenerOptions::new()` take
/// `RetryPolicy::default()`, whose retries and timeout are the constants
/// set 22 gave every listener task (checked here in both kits) and whose
/// backoff is asynq's. The upgraded kit is byte for byte the kit whose
/// tests run that default on real servers (`tests::retries::
/// each_listener_task_carries_its_listeners_retries_and_timeout`: 25
/// retries and 1800 s in a task of a listener without a policy) and unit
/// by unit (`the_default_policy_is_the_one_every_listener_had`).
#[test]
fn a_set_22_projects_listeners_keep_their_registration_and_old_policy() {
    let (_dir, project) = fixture("v22-listeners");
    let read = |path: &str| std::fs::read_to_string(project.join(path)).unwrap();
    let before: Vec<String> = SET_22_LISTENER_FILES.iter().map(|p| read(p)).collect();
    let registrations = &before[0];
    assert!(
        registrations.contains(
            "    listeners.listen(\"send_receipt\", order_placed::send_receipt::handle);\n"
        ) && registrations.contains(
            "    listeners.listen_with(\n        \"reserve_stock\",\n        \
                 order_placed::reserve_stock::options(),\n"
        ),
        "the fixture registers its two listeners as set 22 did:\n{registrations}"
    );
    assert!(
        before[3].contains("    ListenerOptions::new().concurrency(4)\n"),
        "{}",
        before[3]
    );
    let manifest_before = read("gpkit.toml");
    assert!(manifest_before.contains("template_set = 22\n"));
    let relay_before = read("kit/src/outbox/relay.rs");

    let (code, report) = upgrade(&project, &[]);

    assert_eq!(code, 0, "{report}");
    for (path, was) in SET_22_LISTENER_FILES.iter().zip(&before) {
        assert_eq!(&read(path), was, "{path} changed:\n{report}");
        assert!(!report.contains(path), "{path} is in the report:\n{report}");
    }
    for (path, entry) in disk_state(&project.join("src"), &[]) {
        let crate::support::Entry::File { contents, .. } = entry else {
            continue;
        };
        let text = String::from_utf8(contents).unwrap();
        for call in [".retries(", ".timeout(", ".backoff("] {
            assert!(!text.contains(call), "src/{path} has `{call}`:\n{text}");
        }
    }
    let manifest = read("gpkit.toml");
    assert!(manifest.contains(&format!("template_set = {TEMPLATE_SET_VERSION}\n")));
    assert_eq!(
        components(&manifest),
        components(&manifest_before),
        "the listeners' record changed"
    );
    let (code, _) = upgrade(&project, &["--check"]);
    assert_eq!(code, 0, "not up to date after the upgrade");

    // The policy the upgraded project states for them: its kit is the one
    // the kit's tests test, `listen` registers `ListenerOptions::new()`,
    // whose policy is the default, made of set 22's numbers.
    for path in POLICY_KIT_FILES {
        assert_eq!(
            read(path).as_bytes(),
            std::fs::read(crate::support::repo().join("templates").join(path)).unwrap(),
            "{path}"
        );
    }
    assert!(
        read("kit/src/worker/listeners.rs")
            .contains("self.listen_with(name, ListenerOptions::new(), handler)")
    );
    let policy = read("kit/src/worker/retry_policy.rs");
    let default = policy
        .split("impl Default for RetryPolicy {")
        .nth(1)
        .and_then(|rest| rest.split("\n}\n").next())
        .expect("RetryPolicy's Default");
    for field in [
        "retries: MAX_RETRY,",
        "timeout: TASK_TIMEOUT,",
        "backoff: Backoff::asynq(),",
    ] {
        assert!(default.contains(field), "{field}:\n{default}");
    }
    assert!(read("kit/src/worker/listener_options.rs").contains("policy: RetryPolicy::default(),"));
    let relay = read("kit/src/outbox/relay.rs");
    for constant in ["MAX_RETRY", "TASK_TIMEOUT"] {
        assert_eq!(
            declaration(&relay, constant),
            declaration(&relay_before, constant),
            "set 22's {constant} is not the default's"
        );
    }
}
