//! Runs that meet trouble: a second run while the first holds the project's
//! lock, and runs killed half-way. With the fault-injection point of debug builds
//! (`GPKIT_FAULT=<stage>:<n>`, an abort as from `kill -9`), a run is killed
//! while staging and while renaming; the next run repairs the project, which
//! then matches, byte for byte, a project that was never interrupted.

use std::path::Path;

use crate::support::{gpkit, new_project, read_tree};

/// A `--no-worker` project in `dir`, with `gpkit add worker` applied
/// without interruption: the tree every repaired run must reach.
fn reference(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    std::fs::create_dir_all(dir).unwrap();
    let project = new_project(dir, &["--no-worker"]);
    gpkit(&project).args(["add", "worker"]).assert().success();
    read_tree(&project, &[])
}

#[test]
fn a_run_killed_at_any_point_is_repaired_by_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let expected = reference(&dir.path().join("reference"));
    let files = expected.len();

    // `add worker` here writes 17 files (9 of the project's and 8 base
    // copies): killed at the first, in the middle and near the end.
    for fault in [
        "staged:1",
        "staged:12",
        "renamed:1",
        "renamed:12",
        "renamed:16",
    ] {
        let parent = dir.path().join(fault.replace(':', "-"));
        std::fs::create_dir(&parent).unwrap();
        let project = new_project(&parent, &["--no-worker"]);
        let before = read_tree(&project, &[]);

        let killed = gpkit(&project)
            .args(["add", "worker"])
            .env("GPKIT_FAULT", fault)
            .output()
            .unwrap();
        assert!(
            killed.status.code().is_none(),
            "{fault}: the run was not killed: {}",
            String::from_utf8_lossy(&killed.stderr)
        );
        assert!(
            project.join(".gpkit/journal.json").exists(),
            "{fault}: no journal"
        );
        if fault.starts_with("staged") {
            // Nothing of the project was touched yet (staging files aside).
            let now = read_tree(&project, &[]);
            for (path, contents) in &before {
                assert_eq!(now.get(path), Some(contents), "{fault}: {path} changed");
            }
        }

        // A dry run refuses to plan on a half-changed project.
        gpkit(&project)
            .args(["--dry-run", "add", "worker"])
            .assert()
            .code(1)
            .stderr(predicates::str::contains("was interrupted"));

        let repaired = gpkit(&project).args(["add", "worker"]).output().unwrap();
        let stderr = String::from_utf8_lossy(&repaired.stderr);
        assert!(repaired.status.success(), "{fault}: {stderr}");
        assert!(
            stderr.contains("note: an earlier gpkit run was interrupted"),
            "{stderr}"
        );

        let after = read_tree(&project, &[]);
        let differing: Vec<&String> = expected
            .keys()
            .chain(after.keys())
            .filter(|k| expected.get(*k) != after.get(*k))
            .collect();
        assert!(
            differing.is_empty(),
            "{fault}: after the repair {differing:?} differ from an uninterrupted run"
        );
        assert_eq!(after.len(), files);
    }
}

/// An upgrade that also deletes the base copies gpkit no longer needs (a
/// project of template set 4 keeps a copy of every file), killed once it
/// has begun renaming: the next run does the remaining renames and the
/// deletions, and the project matches one upgraded without interruption.
#[test]
fn an_upgrade_killed_before_it_deleted_the_redundant_copies_is_completed() {
    let dir = tempfile::tempdir().unwrap();
    let reference = dir.path().join("reference");
    let project = dir.path().join("killed");
    crate::support::materialise_fixture("v4-edited", &reference);
    crate::support::materialise_fixture("v4-edited", &project);
    let upgrade = |project: &Path| {
        gpkit(project)
            .args(["upgrade", "templates"])
            .output()
            .unwrap()
    };
    assert!(upgrade(&reference).status.success());
    let expected = read_tree(&reference, &[]);
    assert!(
        !expected.keys().any(|p| p.starts_with(".gpkit/base/kit/")),
        "the clean upgrade kept copies of the kit"
    );

    let killed = gpkit(&project)
        .args(["upgrade", "templates"])
        .env("GPKIT_FAULT", "renamed:1")
        .output()
        .unwrap();
    assert!(killed.status.code().is_none(), "the run was not killed");
    let repaired = upgrade(&project);
    let stderr = String::from_utf8_lossy(&repaired.stderr);
    assert!(repaired.status.success(), "{stderr}");
    assert!(
        stderr.contains("the remaining renames and deletions were done"),
        "{stderr}"
    );
    assert_eq!(read_tree(&project, &[]), expected);
}

/// Two runs in one project: the second waits briefly, then fails naming
/// the first and changing nothing; the first completes.
#[test]
fn a_second_run_meets_the_lock_of_the_first_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let project = new_project(dir.path(), &["--no-worker"]);
    let first = std::process::Command::new(assert_cmd::cargo::cargo_bin("gpkit"))
        .args(["add", "worker"])
        .current_dir(&project)
        .env("GPKIT_HOLD_LOCK_MS", "6000")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let holder = project.join(".gpkit/lock");
    let start = std::time::Instant::now();
    while !holder.exists() {
        assert!(start.elapsed().as_secs() < 10, "the first run never locked");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let before = read_tree(&project, &[".gpkit"]);

    let second = gpkit(&project).args(["add", "worker"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("`gpkit add worker` (process {})", first.id())),
        "{stderr}"
    );
    assert_eq!(read_tree(&project, &[".gpkit"]), before);

    let first = first.wait_with_output().unwrap();
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert!(project.join("src/bin/worker.rs").exists());
    assert!(!holder.exists(), "the lock note outlived the run");
}

/// A second run that meets the lock waits for it: when the first run ends
/// within the 3 s, the second takes the lock and succeeds. The test holds
/// the lock itself, as a run does (an exclusive `flock` on `.gpkit/`, with
/// `.gpkit/lock` naming the holder), until the second run says it waits
/// for that holder; it has changed nothing then, and finishes once the
/// lock is let go.
#[test]
fn a_second_run_waits_for_a_first_that_ends_within_the_wait() {
    let dir = tempfile::tempdir().unwrap();
    let project = new_project(dir.path(), &["--no-worker"]);
    let lock_dir = std::fs::File::open(project.join(".gpkit")).unwrap();
    lock_dir.try_lock().unwrap();
    let holder = project.join(".gpkit/lock");
    std::fs::write(&holder, "`gpkit add event` (process 1)\n").unwrap();

    let mut second = std::process::Command::new(assert_cmd::cargo::cargo_bin("gpkit"))
        .args(["add", "worker"])
        .current_dir(&project)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = crate::support::Lines::read(second.stderr.take().unwrap());
    let waiting = "waiting for `gpkit add event` (process 1) to finish changing this project";
    said.wait_for(
        "the second run says it waits",
        std::time::Duration::from_secs(10),
        |line| line.contains(waiting),
    );
    assert!(
        !project.join("src/bin/worker.rs").exists(),
        "the second run changed the project while it waited"
    );
    std::fs::remove_file(&holder).unwrap();
    lock_dir.unlock().unwrap();

    let status = second.wait().unwrap();
    let said = said.until_closed();
    assert!(status.success(), "the second run failed: {said:?}");
    assert!(project.join("src/bin/worker.rs").exists());
    assert!(!holder.exists(), "the lock note outlived the run");
}
