//! The journal that keeps a plan applied in place all or nothing when the
//! process is killed half-way.
//!
//! Applying a plan to an existing project goes through `.gpkit/journal.json`:
//! 1. the journal is written in state `staging`, listing every file to
//!    write and delete;
//! 2. each new content is written to a staging file beside its destination;
//! 3. the journal is replaced (atomically) by one in state `committed`;
//! 4. the staging files are renamed into place and the deletions done;
//! 5. the journal is removed.
//!
//! The next run (under the project lock) finds a journal left by a killed
//! run and [`recover`]s: a `staging` journal is rolled back (its staging
//! files removed, the project was not touched), a `committed` one is rolled
//! forward (the remaining renames and deletions done). Either way the
//! project ends as wholly old or wholly new, and the manifest, renamed with
//! the rest, says which. The journal is untrusted input like the manifest:
//! its paths are checked the same way.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::engine::manifest::BASE_DIR;
use crate::engine::project_path;

/// Where the journal lives while a plan is applied.
pub(crate) const JOURNAL_FILE: &str = ".gpkit/journal.json";

/// How far a run got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum State {
    /// Staging files are being written; the project is untouched.
    Staging,
    /// Every staging file is complete; renames may have begun.
    Committed,
}

/// One run's record of what it is changing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Journal {
    pub(crate) state: State,
    /// The process that writes the staging files (their names include it).
    pub(crate) pid: u32,
    /// Files written, as paths relative to the project root.
    pub(crate) writes: Vec<String>,
    /// Files deleted after the writes.
    pub(crate) deletes: Vec<String>,
}

impl Journal {
    /// The staging file of `dest` for this run.
    pub(crate) fn staging_path(&self, root: &Path, dest: &str) -> PathBuf {
        staging_path(&root.join(dest), self.pid)
    }

    /// Writes the journal, replacing any earlier state of it atomically.
    pub(crate) fn save(&self, root: &Path) -> Result<()> {
        project_path::refuse_links(root, JOURNAL_FILE)?;
        let path = root.join(JOURNAL_FILE);
        let tmp = path.with_extension("json.new");
        let _ = std::fs::remove_file(&tmp);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("failed to create `{}`", parent.display()))?;
        }
        let text = serde_json::to_string_pretty(self).expect("the journal serialises");
        project_path::create_new(&tmp, text.as_bytes())?;
        std::fs::rename(&tmp, &path)
            .with_context(|| format!("failed to write `{}`", path.display()))
    }

    /// Removes the journal: the run is complete.
    pub(crate) fn remove(root: &Path) -> Result<()> {
        let path = root.join(JOURNAL_FILE);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(err) => Err(err).with_context(|| format!("failed to remove `{}`", path.display())),
        }
    }

    /// The journal left in the project at `root`, if any, with every path
    /// checked.
    pub(crate) fn load(root: &Path) -> Result<Option<Self>> {
        let Some(bytes) = project_path::read(root, JOURNAL_FILE)? else {
            return Ok(None);
        };
        let journal: Self = serde_json::from_slice(&bytes).with_context(|| {
            format!(
                "`{JOURNAL_FILE}` (left by an interrupted gpkit run) cannot be read\n\
                 help: restore the project from version control, then delete `{JOURNAL_FILE}`"
            )
        })?;
        for path in journal.writes.iter().chain(&journal.deletes) {
            check_journal_path(path)?;
            project_path::refuse_links(root, path)?;
        }
        Ok(Some(journal))
    }
}

/// The staging file for `dest` of the process `pid`: a hidden name beside it.
pub(crate) fn staging_path(dest: &Path, pid: u32) -> PathBuf {
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    dest.with_file_name(format!(".{name}.gpkit-new-{pid}"))
}

/// A path a journal may name: a manifest-style path, or one under
/// `.gpkit/base/`, or the manifest itself.
fn check_journal_path(path: &str) -> Result<()> {
    let checked = path
        .strip_prefix(BASE_DIR)
        .and_then(|rest| rest.strip_prefix('/'))
        .unwrap_or(path);
    match project_path::manifest_path_problem(checked) {
        None => Ok(()),
        Some(problem) => bail!(
            "`{JOURNAL_FILE}` names {path:?}, which is not a path inside the project: {problem}; \
             nothing was changed\n\
             help: delete `{JOURNAL_FILE}` (it may have come from an untrusted source)"
        ),
    }
}

/// Finishes or undoes the run that left a journal in the project at `root`;
/// returns a sentence on what was done, or `None` when there was no journal.
pub(crate) fn recover(root: &Path) -> Result<Option<String>> {
    let Some(journal) = Journal::load(root)? else {
        return Ok(None);
    };
    let done = match journal.state {
        State::Staging => {
            for dest in &journal.writes {
                project_path::remove_if_there(&journal.staging_path(root, dest))?;
            }
            "an earlier gpkit run was interrupted before it changed any file; \
             its staging files were removed"
        }
        State::Committed => {
            for dest in &journal.writes {
                let tmp = journal.staging_path(root, dest);
                if std::fs::symlink_metadata(&tmp).is_ok_and(|m| m.is_file()) {
                    std::fs::rename(&tmp, root.join(dest))
                        .with_context(|| format!("failed to write `{dest}`"))?;
                }
            }
            for dest in &journal.deletes {
                project_path::remove_if_there(&root.join(dest))?;
                project_path::remove_empty_parents(root, dest);
            }
            "an earlier gpkit run was interrupted while it renamed its files into place; \
             the remaining renames and deletions were done, so the project is as that run \
             meant to leave it"
        }
    };
    Journal::remove(root)?;
    Ok(Some(done.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_under_the_base_directory_and_the_manifest_are_allowed() {
        check_journal_path(".gpkit/base/src/main.rs").unwrap();
        check_journal_path("gpkit.toml").unwrap();
        check_journal_path("src/main.rs").unwrap();
        for bad in [
            "../x",
            ".gpkit/base/../../x",
            ".gpkit/journal.json",
            "/etc/passwd",
        ] {
            assert!(check_journal_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_staging_journal_is_rolled_back_and_a_committed_one_forward() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::write(root.join("src/a.rs"), "old").unwrap();
        std::fs::write(root.join("gone.txt"), "old").unwrap();
        let mut journal = Journal {
            state: State::Staging,
            pid: 42,
            writes: vec!["src/a.rs".into()],
            deletes: vec!["gone.txt".into()],
        };
        journal.save(root).unwrap();
        std::fs::write(journal.staging_path(root, "src/a.rs"), "new").unwrap();

        let said = recover(root).unwrap().unwrap();
        assert!(said.contains("before it changed any file"), "{said}");
        assert_eq!(
            std::fs::read_to_string(root.join("src/a.rs")).unwrap(),
            "old"
        );
        assert!(root.join("gone.txt").exists());
        assert!(!journal.staging_path(root, "src/a.rs").exists());
        assert!(!root.join(JOURNAL_FILE).exists());

        journal.state = State::Committed;
        journal.save(root).unwrap();
        std::fs::write(journal.staging_path(root, "src/a.rs"), "new").unwrap();
        let said = recover(root).unwrap().unwrap();
        assert!(said.contains("remaining renames"), "{said}");
        assert_eq!(
            std::fs::read_to_string(root.join("src/a.rs")).unwrap(),
            "new"
        );
        assert!(!root.join("gone.txt").exists());
        assert!(!root.join(JOURNAL_FILE).exists());
        assert_eq!(recover(root).unwrap(), None);
    }
}
