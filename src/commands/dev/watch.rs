//! What `gpkit dev` watches for a reload: the files under `src/`, `kit/`
//! and `migrations/`, and `Cargo.toml`, scanned for a change of modification
//! time or size (polling: no watcher to set up, the same on every system).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// How often the files are scanned.
pub(crate) const INTERVAL: Duration = Duration::from_millis(500);

type Snapshot = BTreeMap<PathBuf, (Option<SystemTime>, u64)>;

/// The last scan of the project's sources.
#[derive(Debug)]
pub(crate) struct Watch {
    root: PathBuf,
    last: Snapshot,
}

impl Watch {
    /// Scans the sources of the project at `root` now.
    pub(crate) fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
            last: scan(root),
        }
    }

    /// The files that changed (or appeared, or went) since the last scan;
    /// waits for a burst of writes (an editor, a `git checkout`) to settle.
    pub(crate) fn changes(&mut self) -> Vec<PathBuf> {
        let now = scan(&self.root);
        if now == self.last {
            return Vec::new();
        }
        let mut settled = now;
        loop {
            std::thread::sleep(Duration::from_millis(200));
            let again = scan(&self.root);
            if again == settled {
                break;
            }
            settled = again;
        }
        let mut changed: Vec<PathBuf> = settled
            .iter()
            .filter(|(path, stamp)| self.last.get(*path) != Some(stamp))
            .map(|(path, _)| path.clone())
            .chain(
                self.last
                    .keys()
                    .filter(|path| !settled.contains_key(*path))
                    .cloned(),
            )
            .collect();
        changed.sort();
        changed.dedup();
        self.last = settled;
        changed
    }
}

/// Every file watched, with its modification time and size; symbolic
/// links are not followed, and `target/` directories are skipped.
fn scan(root: &Path) -> Snapshot {
    let mut files = Snapshot::new();
    let mut stack: Vec<PathBuf> = ["src", "kit", "migrations"]
        .iter()
        .map(|dir| root.join(dir))
        .collect();
    if let Ok(meta) = std::fs::symlink_metadata(root.join("Cargo.toml")) {
        files.insert(
            PathBuf::from("Cargo.toml"),
            (meta.modified().ok(), meta.len()),
        );
    }
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            let path = entry.path();
            if meta.is_dir() {
                if entry.file_name() != "target" {
                    stack.push(path);
                }
            } else if meta.is_file() {
                let relative = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
                files.insert(relative, (meta.modified().ok(), meta.len()));
            }
        }
    }
    files
}
