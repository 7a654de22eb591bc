//! A project checked out with CRLF line endings (git's `core.autocrlf=true`
//! converts every text file, `.gpkit/base/` included): gpkit does not take
//! the conversion for the user's edits, and the files it changes keep CRLF.

use std::path::Path;

use gpkit::engine::line_endings::{is_crlf, to_crlf};

use crate::support::{gpkit, new_project, read_tree};

/// Rewrites every file under `project` with CRLF line endings, as a
/// checkout with `core.autocrlf=true` would.
fn convert_to_crlf(project: &Path) {
    for (path, contents) in read_tree(project, &[]) {
        std::fs::write(project.join(path), to_crlf(&contents)).unwrap();
    }
}

#[test]
fn a_crlf_checkout_is_up_to_date_and_keeps_crlf_through_an_add() {
    let dir = tempfile::tempdir().unwrap();
    let project = new_project(dir.path(), &["--no-worker"]);
    convert_to_crlf(&project);
    let before = read_tree(&project, &[]);

    // Nothing looks edited: the upgrade finds the project up to date.
    let output = gpkit(&project)
        .args(["upgrade", "templates"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("Up to date"), "{stdout}");
    assert_eq!(
        read_tree(&project, &[]),
        before,
        "the upgrade changed files"
    );

    // `add worker` changes some of the existing files: they stay CRLF.
    gpkit(&project).args(["add", "worker"]).assert().success();
    let after = read_tree(&project, &[".gpkit"]);
    let mut changed = 0;
    for (path, old) in before.iter().filter(|(p, _)| !p.starts_with(".gpkit")) {
        let new = &after[path];
        assert!(is_crlf(new), "{path} lost its CRLF line endings");
        changed += usize::from(new != old);
    }
    assert!(
        changed >= 2,
        "add worker changed only {changed} existing files"
    );

    // And the result is up to date, not a fresh set of conflicts.
    let output = gpkit(&project)
        .args(["upgrade", "templates"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("Up to date"), "{stdout}");
}

/// A CRLF checkout of a project of the current set, which keeps no copies
/// of the kit: the bases regenerated from the released kit (LF) are
/// compared with the files as LF, so the kit files the user edited are kept
/// and nothing is written.
#[test]
fn a_crlf_checkout_without_copies_of_the_kit_is_up_to_date() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("legacy-shop");
    crate::support::materialise_fixture(
        &format!("v{}-edited", gpkit::engine::blueprint::TEMPLATE_SET_VERSION),
        &project,
    );
    assert!(!project.join(".gpkit/base/kit").exists());
    convert_to_crlf(&project);
    let before = read_tree(&project, &[]);

    let output = gpkit(&project)
        .args(["upgrade", "templates"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(stdout.starts_with("Up to date"), "{stdout}");
    for path in ["kit/src/telemetry.rs", "kit/src/outbox/dispatcher.rs"] {
        let kept = stdout
            .lines()
            .any(|l| l.trim_start().starts_with("kept ") && l.ends_with(path));
        assert!(kept, "{path}: {stdout}");
    }
    assert_eq!(
        read_tree(&project, &[]),
        before,
        "the upgrade changed files"
    );
}
