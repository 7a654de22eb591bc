//! The lock that keeps two gpkit runs in one project from interleaving.
//!
//! A run that changes a project holds an exclusive `flock` on its `.gpkit/`
//! directory from planning to the last rename. While it holds it, the file
//! `.gpkit/lock` says who it is, so that a second run can name it: the
//! second run says it waits for it, waits briefly, then fails without
//! changing anything. The lock belongs to the open directory, so the kernel
//! releases it when a run dies; a `.gpkit/lock` file left by a killed run is
//! only a note, replaced by the next run.

use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::engine::project_path;

/// The directory whose lock is taken.
const LOCK_DIR: &str = ".gpkit";
/// Who holds the lock, written while it is held.
const HOLDER_FILE: &str = ".gpkit/lock";
/// How long a second run waits for the first before it gives up.
const WAIT: Duration = Duration::from_secs(3);

/// An exclusive hold on a project, released on drop.
#[derive(Debug)]
pub(crate) struct ProjectLock {
    dir: File,
    holder: PathBuf,
}

impl ProjectLock {
    /// Takes the lock of the project at `root` for `command` (shown to a
    /// run that has to wait), waiting up to a few seconds for another run.
    pub(crate) fn acquire(root: &Path, command: &str) -> Result<Self> {
        project_path::refuse_links(root, HOLDER_FILE)?;
        let dir_path = root.join(LOCK_DIR);
        std::fs::create_dir_all(&dir_path)
            .with_context(|| format!("failed to create `{}`", dir_path.display()))?;
        let dir = File::open(&dir_path)
            .with_context(|| format!("failed to open `{}`", dir_path.display()))?;
        let holder = root.join(HOLDER_FILE);
        let start = Instant::now();
        let mut said_so = false;
        loop {
            match dir.try_lock() {
                Ok(()) => break,
                Err(TryLockError::WouldBlock) if start.elapsed() < WAIT => {
                    if !said_so {
                        eprintln!(
                            "waiting for {} to finish changing this project...",
                            holder_of(&holder)
                        );
                        said_so = true;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(TryLockError::WouldBlock) => {
                    let who = holder_of(&holder);
                    bail!(
                        "this project is being changed by {who}; nothing was changed\n\
                         help: wait for that run to finish, then run this command again"
                    );
                }
                Err(TryLockError::Error(err)) => {
                    return Err(err)
                        .with_context(|| format!("failed to lock `{}`", dir_path.display()));
                }
            }
        }
        // A note left by a killed run (or a link put there) is replaced.
        let _ = std::fs::remove_file(&holder);
        project_path::create_new(
            &holder,
            format!("`{command}` (process {})\n", std::process::id()).as_bytes(),
        )?;
        hold_for_tests();
        Ok(Self { dir, holder })
    }
}

/// Who holds the lock, as the note at `holder` names it.
fn holder_of(holder: &Path) -> String {
    std::fs::read_to_string(holder)
        .ok()
        .map(|text| text.trim().to_string())
        .filter(|text| !text.is_empty())
        .unwrap_or_else(|| "another gpkit run".to_string())
}

/// For the tests of concurrent runs, in debug builds only:
/// `GPKIT_HOLD_LOCK_MS=<n>` keeps the lock n milliseconds before the run
/// goes on, so that a second run surely meets it.
fn hold_for_tests() {
    if !cfg!(debug_assertions) {
        return;
    }
    if let Some(ms) = std::env::var("GPKIT_HOLD_LOCK_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
    {
        std::thread::sleep(Duration::from_millis(ms));
    }
}

impl Drop for ProjectLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.holder);
        let _ = self.dir.unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_run_waits_then_fails_naming_the_first() {
        let root = tempfile::tempdir().unwrap();
        let first = ProjectLock::acquire(root.path(), "gpkit add worker").unwrap();
        let started = Instant::now();
        let err = ProjectLock::acquire(root.path(), "gpkit upgrade templates")
            .unwrap_err()
            .to_string();
        assert!(started.elapsed() >= WAIT, "it did not wait");
        assert!(err.contains("`gpkit add worker` (process "), "{err}");
        drop(first);
        assert!(!root.path().join(HOLDER_FILE).exists());
        ProjectLock::acquire(root.path(), "gpkit upgrade templates").unwrap();
    }

    #[test]
    fn a_note_left_by_a_killed_run_does_not_block() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join(LOCK_DIR)).unwrap();
        std::fs::write(
            root.path().join(HOLDER_FILE),
            "`gpkit add worker` (process 1)\n",
        )
        .unwrap();
        let lock = ProjectLock::acquire(root.path(), "gpkit add event x").unwrap();
        let note = std::fs::read_to_string(root.path().join(HOLDER_FILE)).unwrap();
        assert!(note.starts_with("`gpkit add event x`"), "{note}");
        drop(lock);
    }
}
