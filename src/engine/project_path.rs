//! Paths inside a project, treated as untrusted input.
//!
//! A project's `gpkit.toml`, its `.gpkit/base/` copies and its tree may come
//! from someone else (a cloned repository), so gpkit never lets them reach
//! outside the project:
//! - every path recorded in the manifest must be a plain relative path
//!   ([`check_manifest_path`]): no `..`, no absolute or drive path, no
//!   backslash, no NUL, nothing under `.git/` or `.gpkit/`;
//! - no file is read, written or deleted through a symbolic link inside the
//!   project ([`refuse_links`]): each component below the root is checked
//!   with `symlink_metadata`, without following links (the root itself may
//!   be a link);
//! - new files are created with `O_EXCL` ([`create_new`]), so a link placed
//!   in advance at a staging name is never followed.

use std::io::Write as _;
use std::path::{Component, Path};

use anyhow::{Context, Result, bail};

/// Why a manifest path is not acceptable, or `None` when it is.
pub(crate) fn manifest_path_problem(path: &str) -> Option<&'static str> {
    if path.is_empty() {
        return Some("it is empty");
    }
    if path.contains('\0') {
        return Some("it contains a NUL byte");
    }
    if path.contains('\\') {
        return Some("it contains a backslash; paths use `/`");
    }
    if path.starts_with('/') {
        return Some("it is absolute; paths are relative to the project");
    }
    let bytes = path.as_bytes();
    if bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':' {
        return Some("it names a drive; paths are relative to the project");
    }
    for part in path.split('/') {
        match part {
            "" => return Some("it has an empty component (`//` or a trailing `/`)"),
            "." => return Some("it has a `.` component"),
            ".." => return Some("it has a `..` component, which could leave the project"),
            _ => {}
        }
    }
    let first = path.split('/').next().unwrap_or_default();
    if first == ".git" || first == ".gpkit" {
        return Some("it is inside `.git/` or `.gpkit/`, which gpkit does not manage as files");
    }
    None
}

/// Checks a path recorded in the manifest; the error names the entry.
pub(crate) fn check_manifest_path(path: &str) -> Result<()> {
    match manifest_path_problem(path) {
        None => Ok(()),
        Some(problem) => bail!(
            "`gpkit.toml` records the file {path:?}, which is not a path inside the project: \
             {problem}; nothing was changed\n\
             help: remove that `[files.{path:?}]` entry from `gpkit.toml` (the manifest may have \
             been edited by hand or come from an untrusted source)"
        ),
    }
}

/// Refuses `rel` (a path relative to `root`) when one of its components
/// below `root` is a symbolic link. Components that do not exist yet are
/// fine: gpkit creates them as real directories.
pub(crate) fn refuse_links(root: &Path, rel: &str) -> Result<()> {
    let mut at = root.to_path_buf();
    let mut shown = String::new();
    for component in Path::new(rel).components() {
        let Component::Normal(part) = component else {
            bail!("`{rel}` is not a plain relative path inside the project; nothing was changed");
        };
        at.push(part);
        if !shown.is_empty() {
            shown.push('/');
        }
        shown.push_str(&part.to_string_lossy());
        match std::fs::symlink_metadata(&at) {
            Ok(meta) if meta.file_type().is_symlink() => bail!(
                "`{shown}` in the project is a symbolic link; gpkit does not read or write \
                 through links inside a project, so nothing was changed\n\
                 help: replace the link with the directory or file itself, then run gpkit again"
            ),
            Ok(_) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(err) => {
                return Err(err).with_context(|| format!("failed to inspect `{}`", at.display()));
            }
        }
    }
    Ok(())
}

/// The file `rel` under `root`, if it exists, read without following a link
/// anywhere inside the project (a link is an error naming it).
pub(crate) fn read(root: &Path, rel: &str) -> Result<Option<Vec<u8>>> {
    refuse_links(root, rel)?;
    let path = root.join(rel);
    match std::fs::read(&path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err).with_context(|| format!("failed to read `{}`", path.display())),
    }
}

/// The regular file `rel` under `root`, or `None` when it is missing, a
/// link or anything but a regular file. Links in its leading directories
/// are an error naming them.
pub(crate) fn read_regular(root: &Path, rel: &str) -> Result<Option<Vec<u8>>> {
    let (dir, _) = rel.rsplit_once('/').unwrap_or(("", rel));
    if !dir.is_empty() {
        refuse_links(root, dir)?;
    }
    let path = root.join(rel);
    match std::fs::symlink_metadata(&path) {
        Ok(meta) if meta.file_type().is_file() => {}
        Ok(_) => return Ok(None),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => {
            return Err(err).with_context(|| format!("failed to inspect `{}`", path.display()));
        }
    }
    std::fs::read(&path)
        .map(Some)
        .with_context(|| format!("failed to read `{}`", path.display()))
}

/// The regular `.rs` files under the folder `dir` of `root`, as paths
/// relative to `root`, sorted. Links are not followed (a linked file or
/// folder is left out), so nothing outside the project is listed.
pub(crate) fn rust_sources(root: &Path, dir: &str) -> Result<Vec<String>> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_string()];
    while let Some(rel) = pending.pop() {
        let path = root.join(&rel);
        let entries = match std::fs::read_dir(&path) {
            Ok(entries) => entries,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
            Err(err) => {
                return Err(err).with_context(|| format!("failed to list `{}`", path.display()));
            }
        };
        for entry in entries {
            let entry = entry.with_context(|| format!("failed to list `{}`", path.display()))?;
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            let child = format!("{rel}/{name}");
            let kind = entry
                .file_type()
                .with_context(|| format!("failed to inspect `{}`", entry.path().display()))?;
            if kind.is_dir() {
                pending.push(child);
            } else if kind.is_file() && name.ends_with(".rs") {
                found.push(child);
            }
        }
    }
    found.sort();
    Ok(found)
}

/// Removes the file (or link) at `path`, if there is one; a link is removed
/// itself, never what it points to, and a directory is left alone.
pub(crate) fn remove_if_there(path: &Path) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.is_dir() => std::fs::remove_file(path)
            .with_context(|| format!("failed to remove `{}`", path.display())),
        _ => Ok(()),
    }
}

/// Removes the folders above `rel` (inside `root`, deepest first) that a
/// deletion left empty, as the move of the kit's files into `kit/` leaves
/// `src/queue/`. Stops at the first folder that still holds anything, and
/// never removes `root` itself.
pub(crate) fn remove_empty_parents(root: &Path, rel: &str) {
    let mut dir = Path::new(rel).parent();
    while let Some(parent) = dir.filter(|p| !p.as_os_str().is_empty()) {
        if std::fs::remove_dir(root.join(parent)).is_err() {
            return;
        }
        dir = parent.parent();
    }
}

/// Creates `path` with `contents`; fails if anything (a file, a link) is
/// already there, without following it.
pub(crate) fn create_new(path: &Path, contents: &[u8]) -> Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("failed to create `{}`", path.display()))?;
    file.write_all(contents)
        .with_context(|| format!("failed to write `{}`", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_folders_left_empty_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("src/queue/deep")).unwrap();
        std::fs::write(root.join("src/lib.rs"), "").unwrap();
        remove_empty_parents(root, "src/queue/deep/gone.rs");
        assert!(!root.join("src/queue").exists());
        assert!(root.join("src/lib.rs").exists());
        remove_empty_parents(root, "top.rs");
        assert!(root.exists());
    }

    #[test]
    fn plain_relative_paths_are_accepted() {
        for ok in ["Cargo.toml", "src/queue/mod.rs", ".env.example", "a..b/c"] {
            assert_eq!(manifest_path_problem(ok), None, "{ok}");
        }
    }

    #[test]
    fn paths_that_could_leave_the_project_are_refused() {
        for bad in [
            "",
            "../victim.txt",
            "src/../../x",
            "/etc/passwd",
            "C:/x",
            "c:x",
            "src\\main.rs",
            "a\0b",
            "./src/main.rs",
            "src//main.rs",
            "src/",
            ".git/config",
            ".git",
            ".gpkit/base/src/main.rs",
        ] {
            assert!(manifest_path_problem(bad).is_some(), "{bad:?} accepted");
        }
    }

    #[test]
    fn the_error_names_the_entry() {
        let err = check_manifest_path("../victim.txt")
            .unwrap_err()
            .to_string();
        assert!(err.contains("\"../victim.txt\""), "{err}");
        assert!(err.contains("`..`"), "{err}");
    }

    #[cfg(unix)]
    #[test]
    fn links_inside_the_project_are_refused_by_name() {
        let outside = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("src")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("src/outbox")).unwrap();
        let err = refuse_links(root.path(), "src/outbox/mod.rs")
            .unwrap_err()
            .to_string();
        assert!(err.contains("`src/outbox`"), "{err}");
        assert!(read(root.path(), "src/outbox/mod.rs").is_err());
        refuse_links(root.path(), "src/new/file.rs").unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_base_copy_that_is_a_link_or_a_directory_counts_as_missing() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("f"), "x").unwrap();
        let root = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path().join("f"), root.path().join("link")).unwrap();
        std::fs::create_dir(root.path().join("dir")).unwrap();
        std::fs::write(root.path().join("file"), "y").unwrap();
        assert_eq!(read_regular(root.path(), "link").unwrap(), None);
        assert_eq!(read_regular(root.path(), "dir").unwrap(), None);
        assert_eq!(read_regular(root.path(), "missing").unwrap(), None);
        assert_eq!(
            read_regular(root.path(), "file").unwrap(),
            Some(b"y".to_vec())
        );
    }

    #[cfg(unix)]
    #[test]
    fn create_new_does_not_follow_a_link_placed_in_advance() {
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let root = tempfile::tempdir().unwrap();
        let staged = root.path().join(".x.gpkit-new-1");
        std::os::unix::fs::symlink(&victim, &staged).unwrap();
        assert!(create_new(&staged, b"evil").is_err());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    }
}
