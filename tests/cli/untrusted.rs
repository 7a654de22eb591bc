//! A project as untrusted input: crafted manifests and symbolic links that
//! try to make gpkit read, write or delete outside the project. Each attack
//! must exit 1 with a message naming the path, and leave every file outside
//! the project (and the project itself) byte for byte as it was.

use gpkit::engine::manifest::sha256_hex;

use crate::support::{disk_state, gpkit, new_project};

/// A workspace with a project `shop` and, beside it, a directory `outside`
/// holding a victim file.
struct Workspace {
    dir: tempfile::TempDir,
}

impl Workspace {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        new_project(dir.path(), &[]);
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("victim.txt"), "precious\n").unwrap();
        Self { dir }
    }

    fn project(&self) -> std::path::PathBuf {
        self.dir.path().join("shop")
    }

    fn outside(&self) -> std::path::PathBuf {
        self.dir.path().join("outside")
    }

    /// Adds a `[files."<path>"]` entry to the manifest, the path quoted as
    /// TOML quotes it (a NUL is `\u0000`).
    fn record(&self, path: &str, contents: &[u8]) {
        let manifest = self.project().join("gpkit.toml");
        let mut text = std::fs::read_to_string(&manifest).unwrap();
        text.push_str(&format!(
            "\n[files.{}]\nowner = \"kit\"\nsha256 = \"{}\"\n",
            toml_edit::Key::new(path),
            sha256_hex(contents)
        ));
        std::fs::write(manifest, text).unwrap();
    }

    /// Runs gpkit in the project with `args`, expects exit 1 with `needle`
    /// in the error, and checks that nothing changed anywhere.
    fn refused(&self, args: &[&str], needle: &str) {
        let before = disk_state(self.dir.path(), &[]);
        let output = gpkit(&self.project()).args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains(needle),
            "{args:?}: {needle:?} not in: {stderr}"
        );
        let after = disk_state(self.dir.path(), &[]);
        let changed: Vec<&String> = before
            .keys()
            .chain(after.keys())
            .filter(|k| before.get(*k) != after.get(*k))
            .collect();
        assert!(changed.is_empty(), "{args:?} changed {changed:?}");
    }
}

const COMMANDS: &[&[&str]] = &[
    &["upgrade", "templates"],
    &["upgrade", "templates", "--restore-deleted"],
    &["add", "event", "orderPlaced", "--listener", "audit"],
    &["new", "migration", "add_orders"],
];

#[test]
fn manifest_paths_outside_the_project_are_refused_by_every_command() {
    for (path, problem) in [
        ("../outside/victim.txt", "`..`"),
        ("src\\main.rs", "backslash"),
        (".git/config", "`.git/`"),
        // In gpkit.toml `"src/a\u0000b.rs"`; named as `"src/a\0b.rs"`.
        ("src/a\0b.rs", "it contains a NUL byte"),
    ] {
        let ws = Workspace::new();
        ws.record(path, b"precious\n");
        for args in COMMANDS {
            ws.refused(args, problem);
            ws.refused(args, &format!("`gpkit.toml` records the file {path:?}"));
        }
    }
}

/// An absolute path in the manifest naming a real file outside the
/// project, with that file's hash and a base copy (so that it looks
/// unchanged since gpkit wrote it, and an upgrade would delete it): every
/// command refuses, naming the entry, and the file keeps its bytes,
/// permissions, modification time and inode.
#[cfg(unix)]
#[test]
fn an_absolute_manifest_path_never_touches_the_file_it_names() {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

    let ws = Workspace::new();
    let victim = ws.outside().join("victim.txt");
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o640)).unwrap();
    // An old modification time, so that any write would show.
    let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
    std::fs::File::options()
        .write(true)
        .open(&victim)
        .unwrap()
        .set_modified(old)
        .unwrap();
    // `None` once the file is gone.
    let snapshot = || {
        let meta = std::fs::symlink_metadata(&victim).ok()?;
        Some((
            std::fs::read(&victim).ok()?,
            meta.permissions().mode(),
            meta.modified().unwrap(),
            meta.ino(),
        ))
    };
    let before = snapshot();
    assert_eq!(before.as_ref().unwrap().2, old);

    let path = victim.to_str().unwrap();
    assert!(path.starts_with('/'), "{path}");
    ws.record(path, b"precious\n");
    // Its base copy where `.gpkit/base/` + the path leads: the file looks
    // unchanged since gpkit wrote it, so the kit's dropping it would
    // delete it.
    let base = ws.project().join(".gpkit/base").join(&path[1..]);
    std::fs::create_dir_all(base.parent().unwrap()).unwrap();
    std::fs::write(&base, b"precious\n").unwrap();
    let whole = disk_state(ws.dir.path(), &[]);
    for args in COMMANDS {
        let output = gpkit(&ws.project()).args(*args).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            snapshot() == before,
            "{args:?} touched {path}: now {:?}\n{}{stderr}",
            snapshot(),
            String::from_utf8_lossy(&output.stdout)
        );
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        for needle in [
            format!("`gpkit.toml` records the file {path:?}"),
            "it is absolute".to_string(),
        ] {
            assert!(
                stderr.contains(&needle),
                "{args:?}: {needle:?} not in: {stderr}"
            );
        }
        assert!(
            disk_state(ws.dir.path(), &[]) == whole,
            "{args:?} changed the disk"
        );
    }
}

/// The attack from the issue: an entry for a file beside the project, with
/// its hash, so that upgrading would delete it as "unchanged by you".
#[test]
fn an_upgrade_never_deletes_a_file_beside_the_project() {
    let ws = Workspace::new();
    ws.record("../outside/victim.txt", b"precious\n");
    ws.refused(&["upgrade", "templates"], "../outside/victim.txt");
    assert_eq!(
        std::fs::read_to_string(ws.outside().join("victim.txt")).unwrap(),
        "precious\n"
    );
}

#[cfg(unix)]
#[test]
fn a_kit_file_that_is_a_link_out_of_the_project_is_refused() {
    let ws = Workspace::new();
    let config = ws.project().join("kit/src/config.rs");
    std::fs::copy(&config, ws.outside().join("config.rs")).unwrap();
    std::fs::remove_file(&config).unwrap();
    std::os::unix::fs::symlink(ws.outside().join("config.rs"), &config).unwrap();
    // (`new migration` touches neither, and rightly succeeds.)
    for args in &COMMANDS[..3] {
        ws.refused(
            args,
            "`kit/src/config.rs` in the project is a symbolic link",
        );
    }
}

/// The second attack from the issue: `kit/src/outbox` a link to a directory
/// outside, holding files that match their base copies.
#[cfg(unix)]
#[test]
fn a_kit_directory_that_is_a_link_out_of_the_project_is_refused() {
    let ws = Workspace::new();
    let outbox = ws.project().join("kit/src/outbox");
    let target = ws.outside().join("outbox");
    std::fs::rename(&outbox, &target).unwrap();
    std::os::unix::fs::symlink(&target, &outbox).unwrap();
    for args in &COMMANDS[..3] {
        ws.refused(args, "`kit/src/outbox` in the project is a symbolic link");
    }
}

#[cfg(unix)]
#[test]
fn base_copies_behind_a_link_are_refused() {
    let ws = Workspace::new();
    let base = ws.project().join(".gpkit/base");
    let target = ws.outside().join("base");
    std::fs::rename(&base, &target).unwrap();
    std::os::unix::fs::symlink(&target, &base).unwrap();
    for args in &COMMANDS[..3] {
        ws.refused(args, "`.gpkit/base` in the project is a symbolic link");
    }
}

#[cfg(unix)]
#[test]
fn a_migrations_directory_that_is_a_link_is_refused() {
    let ws = Workspace::new();
    let migrations = ws.project().join("migrations");
    let target = ws.outside().join("migrations");
    std::fs::rename(&migrations, &target).unwrap();
    std::os::unix::fs::symlink(&target, &migrations).unwrap();
    ws.refused(
        &["new", "migration", "add_orders"],
        "`migrations` in the project is a symbolic link",
    );
}

/// A base copy replaced by a link to a file outside that matches the user's
/// edited file is refused; the file outside is neither trusted nor written.
#[cfg(unix)]
#[test]
fn a_base_copy_that_is_a_link_is_refused() {
    let ws = Workspace::new();
    let project = ws.project();
    // A kit file outside the kit crate, of which gpkit keeps a copy.
    let migration = project.join("migrations/20261130000000_inbox.sql");
    let mut edited = std::fs::read(&migration).unwrap();
    edited.extend_from_slice(b"-- my edit\n");
    std::fs::write(&migration, &edited).unwrap();
    std::fs::write(ws.outside().join("fake-base.sql"), &edited).unwrap();
    let base = project.join(".gpkit/base/migrations/20261130000000_inbox.sql");
    std::fs::remove_file(&base).unwrap();
    std::os::unix::fs::symlink(ws.outside().join("fake-base.sql"), &base).unwrap();
    ws.refused(
        &["upgrade", "templates", "--restore-deleted"],
        "`.gpkit/base/migrations/20261130000000_inbox.sql` in the project is a symbolic link",
    );
}

/// A link put where a kit crate file's base copy would be (gpkit keeps
/// none: it regenerates that base) is not followed: the fake base it
/// points to would make the user's edit look like gpkit's and be replaced.
#[cfg(unix)]
#[test]
fn a_link_where_no_base_copy_is_kept_is_not_followed() {
    let ws = Workspace::new();
    let project = ws.project();
    let config = project.join("kit/src/config.rs");
    let mut edited = std::fs::read(&config).unwrap();
    edited.extend_from_slice(b"// my edit\n");
    std::fs::write(&config, &edited).unwrap();
    std::fs::write(ws.outside().join("fake-base.rs"), &edited).unwrap();
    let base = project.join(".gpkit/base/kit/src/config.rs");
    std::fs::create_dir_all(base.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(ws.outside().join("fake-base.rs"), &base).unwrap();
    let before = disk_state(ws.dir.path(), &[]);

    let output = gpkit(&project)
        .args(["upgrade", "templates"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    let kept = stdout
        .lines()
        .any(|l| l.trim_start().starts_with("kept ") && l.ends_with(" kit/src/config.rs"));
    assert!(kept, "{stdout}");
    assert_eq!(disk_state(ws.dir.path(), &[]), before, "files changed");
}

/// A base that is neither a copy on disk nor a kit gpkit released (a hash
/// found nowhere) is no permission to overwrite: the user's edit is
/// reported as a conflict and kept in the file.
#[test]
fn a_missing_base_is_a_conflict_not_an_overwrite() {
    for (path, lose_base, mark) in [
        // A kit crate file whose recorded hash no release of gpkit has.
        ("kit/src/config.rs", "hash", "// my edit\n"),
        // A kit file gpkit keeps a copy of, the copy deleted.
        (
            "migrations/20261130000000_inbox.sql",
            "copy",
            "-- my edit\n",
        ),
    ] {
        let ws = Workspace::new();
        let project = ws.project();
        let file = project.join(path);
        let original = std::fs::read(&file).unwrap();
        let mut edited = String::from_utf8(original.clone()).unwrap();
        edited.push_str(mark);
        std::fs::write(&file, &edited).unwrap();
        if lose_base == "copy" {
            std::fs::remove_file(project.join(".gpkit/base").join(path)).unwrap();
        } else {
            let manifest = project.join("gpkit.toml");
            let text = std::fs::read_to_string(&manifest).unwrap();
            let text = text.replace(
                &sha256_hex(&original),
                &sha256_hex(b"a kit this gpkit never released"),
            );
            std::fs::write(&manifest, text).unwrap();
        }

        let output = gpkit(&project)
            .args(["upgrade", "templates"])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert_eq!(output.status.code(), Some(3), "{path}: {stdout}");
        let line = stdout
            .lines()
            .find(|l| l.split_whitespace().any(|w| w == path))
            .unwrap_or_default();
        assert!(line.contains("conflicted"), "{path}: {stdout}");
        let after = std::fs::read_to_string(&file).unwrap();
        assert!(after.contains(mark), "{path}: the edit was lost:\n{after}");
    }
}
