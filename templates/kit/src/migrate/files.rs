//! The commands that only touch the migration directory: `create` and `fix`.
//!
//! * `create NAME` writes `<UTC timestamp>_<snake_name>.sql` (`20240131120000_...`);
//!   with `--sequential` the version is the highest sequential (non-timestamp)
//!   version plus one, written `%05d` (`00007_...`).
//! * `fix` renames timestamped files to the next sequential versions, oldest first.
//!   This is goose's "hybrid versioning": developers create timestamped files (no
//!   merge conflicts) and CI runs `fix` before they reach production. Rows already
//!   in the version table are not touched.

use std::path::{Path, PathBuf};

use chrono::Utc;

use super::naming::{is_timestamp, snake_case};
use super::source::{self, DiscoveryError};

/// goose v3.27's SQL migration template.
pub const SQL_TEMPLATE: &str = "-- +goose Up
SELECT 'up SQL query';

-- +goose Down
SELECT 'down SQL query';
";

/// What can go wrong creating or renaming files.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FilesError {
    /// The directory's existing files are not valid migrations.
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    /// The name has no letters or digits.
    #[error("migration name {0:?} has no letters or digits")]
    EmptyName(String),
    /// The target file exists.
    #[error("failed to create migration file: {0}: file already exists")]
    Exists(PathBuf),
    /// Reading or writing failed.
    #[error("{action} {path}: {error}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
}

/// Creates a new migration file in `dir` (creating `dir` if needed) from the goose
/// template and returns its path.
pub(crate) fn create(dir: &Path, name: &str, sequential: bool) -> Result<PathBuf, FilesError> {
    let description = snake_case(name);
    if description.is_empty() {
        return Err(FilesError::EmptyName(name.to_owned()));
    }
    let version = if sequential {
        format!("{:05}", next_sequential_version(dir)?)
    } else {
        Utc::now().format("%Y%m%d%H%M%S").to_string()
    };
    std::fs::create_dir_all(dir).map_err(|error| FilesError::Io {
        action: "failed to create directory",
        path: dir.to_owned(),
        error,
    })?;
    let path = dir.join(format!("{version}_{description}.sql"));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|error| match error.kind() {
            std::io::ErrorKind::AlreadyExists => FilesError::Exists(path.clone()),
            _ => FilesError::Io {
                action: "failed to create migration file",
                path: path.clone(),
                error,
            },
        })?;
    std::io::Write::write_all(&mut file, SQL_TEMPLATE.as_bytes()).map_err(|error| {
        FilesError::Io {
            action: "failed to write migration file",
            path: path.clone(),
            error,
        }
    })?;
    Ok(path)
}

/// The highest sequential version in `dir` plus one; 1 if there is none (or no
/// directory yet).
fn next_sequential_version(dir: &Path) -> Result<i64, FilesError> {
    let migrations = match source::collect(dir) {
        Ok(migrations) => migrations,
        Err(DiscoveryError::NoMigrations | DiscoveryError::MissingDirectory(_)) => Vec::new(),
        Err(error) => return Err(error.into()),
    };
    Ok(migrations
        .iter()
        .map(|m| m.version)
        .filter(|&version| !is_timestamp(version))
        .max()
        .map_or(1, |max| max + 1))
}

/// Renames timestamped migrations in `dir` to sequential versions, oldest first.
/// Returns the `(old, new)` paths in order.
pub(crate) fn fix(dir: &Path) -> Result<Vec<(PathBuf, PathBuf)>, FilesError> {
    let migrations = source::collect(dir)?;
    let first = migrations
        .iter()
        .map(|m| m.version)
        .filter(|&version| !is_timestamp(version))
        .max()
        .map_or(1, |max| max + 1);
    let mut renamed = Vec::new();
    let timestamped = migrations.iter().filter(|m| is_timestamp(m.version));
    for (migration, next) in timestamped.zip(first..) {
        // Like goose: replace the first occurrence of the version in the whole path.
        let old = migration.path.to_string_lossy().into_owned();
        let new =
            PathBuf::from(old.replacen(&migration.version.to_string(), &format!("{next:05}"), 1));
        std::fs::rename(&migration.path, &new).map_err(|error| FilesError::Io {
            action: "failed to rename",
            path: migration.path.clone(),
            error,
        })?;
        renamed.push((migration.path.clone(), new));
    }
    Ok(renamed)
}
