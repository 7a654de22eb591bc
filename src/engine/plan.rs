//! Plans of file changes: how every command describes what it will do, shows
//! it (`--dry-run`, `--diff`), and applies it all or nothing.
//!
//! A command first builds a [`Plan`] without touching the disk, checks it,
//! and only then applies it. Applying stages every new file next to its
//! destination before the first rename, so a failure while writing leaves
//! the project as it was.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use similar::TextDiff;

use crate::engine::journal::{Journal, State};
use crate::engine::manifest::BASE_DIR;
use crate::engine::project_path;

/// What happens to one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    Create { contents: Vec<u8> },
    Update { old: Vec<u8>, new: Vec<u8> },
    Delete { old: Vec<u8> },
}

/// One planned change, with a path relative to the plan's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Change {
    pub(crate) path: String,
    pub(crate) action: Action,
    /// One line on why, shown in the plan.
    pub(crate) reason: String,
}

/// An ordered set of changes under one root directory.
#[derive(Debug, Clone, Default)]
pub(crate) struct Plan {
    pub(crate) changes: Vec<Change>,
}

impl Plan {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn create(
        &mut self,
        path: impl Into<String>,
        contents: Vec<u8>,
        reason: impl Into<String>,
    ) {
        self.push(path.into(), Action::Create { contents }, reason.into());
    }

    /// Plans `path` to hold `new`; no change when it already does.
    pub(crate) fn update(
        &mut self,
        path: impl Into<String>,
        old: Vec<u8>,
        new: Vec<u8>,
        reason: impl Into<String>,
    ) {
        if old != new {
            self.push(path.into(), Action::Update { old, new }, reason.into());
        }
    }

    pub(crate) fn delete(
        &mut self,
        path: impl Into<String>,
        old: Vec<u8>,
        reason: impl Into<String>,
    ) {
        self.push(path.into(), Action::Delete { old }, reason.into());
    }

    fn push(&mut self, path: String, action: Action, reason: String) {
        debug_assert!(
            !self.changes.iter().any(|c| c.path == path),
            "{path} is planned twice"
        );
        self.changes.push(Change {
            path,
            action,
            reason,
        });
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// The plan as text: one line per change (the `.gpkit/base/` copies are
    /// summarised in a line for those written and one for those deleted),
    /// and unified diffs when `diff` is set.
    pub(crate) fn render(&self, diff: bool) -> String {
        let shown: Vec<&Change> = self
            .changes
            .iter()
            .filter(|c| !is_base_copy(&c.path))
            .collect();
        let width = shown.iter().map(|c| c.path.len()).max().unwrap_or(0);
        let mut out = String::new();
        for change in &shown {
            let verb = match change.action {
                Action::Create { .. } => "create",
                Action::Update { .. } => "update",
                Action::Delete { .. } => "delete",
            };
            let _ = writeln!(
                out,
                "  {verb:<6}  {:<width$}  {}",
                change.path, change.reason
            );
        }
        let (dropped, recorded): (Vec<&Change>, Vec<&Change>) = self
            .changes
            .iter()
            .filter(|c| is_base_copy(&c.path))
            .partition(|c| matches!(c.action, Action::Delete { .. }));
        let files = |n: usize| format!("{n} file{}", if n == 1 { "" } else { "s" });
        if !recorded.is_empty() {
            let _ = writeln!(
                out,
                "  record  {BASE_DIR}/ ({}: what gpkit wrote, for later 3-way merges)",
                files(recorded.len())
            );
        }
        if !dropped.is_empty() {
            let _ = writeln!(
                out,
                "  delete  {BASE_DIR}/ ({}: copies no longer needed, of files gone or that \
                 gpkit regenerates from its released kits)",
                files(dropped.len())
            );
        }
        if diff {
            for change in &shown {
                out.push('\n');
                out.push_str(&unified_diff(change));
            }
        }
        out
    }

    /// Counts of creations, updates and deletions, `.gpkit/base/` copies left out.
    pub(crate) fn summary(&self) -> String {
        let (mut created, mut updated, mut deleted) = (0, 0, 0);
        for change in self.changes.iter().filter(|c| !is_base_copy(&c.path)) {
            match change.action {
                Action::Create { .. } => created += 1,
                Action::Update { .. } => updated += 1,
                Action::Delete { .. } => deleted += 1,
            }
        }
        format!("{created} to create, {updated} to update, {deleted} to delete")
    }

    /// Writes the plan into a new directory `dest`, which must not exist or
    /// be empty. Everything is written into a staging directory next to
    /// `dest` and renamed into place at the end, so an interrupted run leaves
    /// no half-made tree.
    pub(crate) fn apply_to_new_dir(&self, dest: &Path) -> Result<()> {
        let parent = dest
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let name = dest
            .file_name()
            .context("the destination has no file name")?;
        let staging = parent.join(format!(
            ".{}.gpkit-staging-{}",
            name.to_string_lossy(),
            std::process::id()
        ));
        let result = (|| {
            std::fs::create_dir(&staging).with_context(|| {
                format!("failed to create a directory in `{}`", parent.display())
            })?;
            for change in &self.changes {
                let Action::Create { contents } = &change.action else {
                    bail!("a new project can only create files (`{}`)", change.path);
                };
                write_file(&staging.join(&change.path), contents)?;
            }
            if dest.exists() {
                // Only an empty directory is accepted here (checked by the caller).
                std::fs::remove_dir(dest)
                    .with_context(|| format!("failed to replace `{}`", dest.display()))?;
            }
            std::fs::rename(&staging, dest)
                .with_context(|| format!("failed to move the project into `{}`", dest.display()))
        })();
        if result.is_err() {
            let _ = std::fs::remove_dir_all(&staging);
        }
        result
    }

    /// Applies the plan to the existing tree at `root`, all or nothing even
    /// if the process is killed: every new content is staged in a file
    /// beside its destination, then the journal (see [`crate::engine::journal`]) is
    /// committed, then the staging files are renamed into place and the
    /// deletions done. A run killed before the commit is rolled back by the
    /// next one, a run killed after it is rolled forward.
    ///
    /// Nothing is written through a symbolic link inside `root`: every path
    /// is checked before the first write, and staging files are created
    /// with `O_EXCL`, so a link placed at a staging name is not followed.
    pub(crate) fn apply_in_place(&self, root: &Path) -> Result<()> {
        for change in &self.changes {
            project_path::refuse_links(root, &change.path)?;
        }
        let mut journal = Journal {
            state: State::Staging,
            pid: std::process::id(),
            writes: Vec::new(),
            deletes: Vec::new(),
        };
        for change in &self.changes {
            match &change.action {
                Action::Create { .. } | Action::Update { .. } => {
                    journal.writes.push(change.path.clone());
                }
                Action::Delete { .. } => journal.deletes.push(change.path.clone()),
            }
        }
        journal.save(root)?;
        let mut staged: Vec<PathBuf> = Vec::new();
        let stage_all = (|| {
            for change in &self.changes {
                let dest = root.join(&change.path);
                let new = match &change.action {
                    Action::Create { contents } => {
                        if dest.exists() {
                            bail!(
                                "`{}` appeared while gpkit was running; nothing was changed",
                                change.path
                            );
                        }
                        contents
                    }
                    Action::Update { new, .. } => new,
                    Action::Delete { .. } => continue,
                };
                let tmp = journal.staging_path(root, &change.path);
                // A leftover of an interrupted run (or anything put there) goes.
                project_path::remove_if_there(&tmp)?;
                write_file(&tmp, new)?;
                staged.push(tmp);
                fault::point("staged", staged.len());
            }
            Ok(())
        })();
        if let Err(err) = stage_all {
            for tmp in &staged {
                let _ = std::fs::remove_file(tmp);
            }
            let _ = Journal::remove(root);
            return Err(err);
        }
        journal.state = State::Committed;
        journal.save(root)?;
        for (renamed, dest) in journal.writes.iter().enumerate() {
            let tmp = journal.staging_path(root, dest);
            std::fs::rename(&tmp, root.join(dest))
                .with_context(|| format!("failed to write `{dest}`"))?;
            fault::point("renamed", renamed + 1);
        }
        for dest in &journal.deletes {
            std::fs::remove_file(root.join(dest))
                .with_context(|| format!("failed to delete `{dest}`"))?;
            project_path::remove_empty_parents(root, dest);
        }
        Journal::remove(root)
    }
}

/// Fault injection for the tests of interrupted runs: in debug builds only,
/// `GPKIT_FAULT=<stage>:<n>` (`staged:3`, `renamed:5`) aborts the process,
/// as a `kill -9` would, once `n` files have reached that stage.
mod fault {
    pub(crate) fn point(stage: &str, count: usize) {
        if cfg!(debug_assertions)
            && std::env::var("GPKIT_FAULT").is_ok_and(|f| f == format!("{stage}:{count}"))
        {
            std::process::abort();
        }
    }
}

fn is_base_copy(path: &str) -> bool {
    path.starts_with(BASE_DIR)
}

/// Creates the new file `path` (and its missing directories); anything
/// already there, a link included, is an error rather than followed.
fn write_file(path: &Path, contents: &[u8]) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("failed to create directory `{}`", parent.display()))?;
    }
    project_path::create_new(path, contents)
}

fn unified_diff(change: &Change) -> String {
    let (old, new): (&[u8], &[u8]) = match &change.action {
        Action::Create { contents } => (b"", contents),
        Action::Update { old, new } => (old, new),
        Action::Delete { old } => (old, b""),
    };
    let old = String::from_utf8_lossy(old);
    let new = String::from_utf8_lossy(new);
    let (a, b) = match change.action {
        Action::Create { .. } => ("/dev/null".to_string(), format!("b/{}", change.path)),
        Action::Delete { .. } => (format!("a/{}", change.path), "/dev/null".to_string()),
        Action::Update { .. } => (format!("a/{}", change.path), format!("b/{}", change.path)),
    };
    TextDiff::from_lines(old.as_ref(), new.as_ref())
        .unified_diff()
        .context_radius(3)
        .header(&a, &b)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_update_to_the_same_bytes_is_no_change() {
        let mut plan = Plan::new();
        plan.update("a", b"x".to_vec(), b"x".to_vec(), "same");
        assert!(plan.is_empty());
    }

    #[test]
    fn renders_lines_and_diffs() {
        let mut plan = Plan::new();
        plan.create("src/a.rs", b"fn a() {}\n".to_vec(), "a new file");
        plan.update("b.txt", b"one\n".to_vec(), b"two\n".to_vec(), "changed");
        plan.create(
            format!("{BASE_DIR}/src/a.rs"),
            b"fn a() {}\n".to_vec(),
            "base",
        );
        let text = plan.render(true);
        assert!(text.contains("  create  src/a.rs  a new file\n"), "{text}");
        assert!(text.contains("  update  b.txt     changed\n"), "{text}");
        assert!(text.contains("record  .gpkit/base/ (1 file"), "{text}");
        assert!(!text.contains("delete  .gpkit/base/"), "{text}");
        assert!(text.contains("--- /dev/null\n+++ b/src/a.rs\n"), "{text}");
        assert!(text.contains("-one\n+two\n"), "{text}");
        assert_eq!(plan.summary(), "1 to create, 1 to update, 0 to delete");
    }

    #[test]
    fn deleted_base_copies_are_one_line() {
        let mut plan = Plan::new();
        for name in ["a", "b", "c"] {
            plan.delete(format!("{BASE_DIR}/kit/src/{name}.rs"), b"x".to_vec(), "r");
        }
        plan.create(format!("{BASE_DIR}/Cargo.toml"), b"y".to_vec(), "r");
        let text = plan.render(false);
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(text.contains("  delete  .gpkit/base/ (3 files: "), "{text}");
        assert!(text.contains("  record  .gpkit/base/ (1 file: "), "{text}");
        assert_eq!(plan.summary(), "0 to create, 0 to update, 0 to delete");
    }

    #[test]
    fn a_failed_staging_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("keep.txt"), "old").unwrap();
        // A file where a directory must go makes the second write fail.
        std::fs::write(dir.path().join("blocker"), "").unwrap();
        let mut plan = Plan::new();
        plan.update("keep.txt", b"old".to_vec(), b"new".to_vec(), "r");
        plan.create("blocker/inner.txt", b"x".to_vec(), "r");
        assert!(plan.apply_in_place(dir.path()).is_err());
        assert_eq!(
            std::fs::read_to_string(dir.path().join("keep.txt")).unwrap(),
            "old"
        );
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.contains("gpkit-new"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
}
