//! Finding migration files on disk and reading them.
//!
//! Like goose: only `*.sql` files directly inside the directory count (no
//! recursion, case-sensitive extension), every one of them must have a valid
//! `<version>_<description>.sql` name, and two files with the same version (say
//! `1_a.sql` and `001_b.sql`) are a fatal error naming both.

use std::fmt;
use std::path::{Path, PathBuf};

use super::naming::{self, VersionError};
use super::parser::{self, Direction, ParseError, ParsedSql};

/// One migration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    /// The number before the first `_` of the file name.
    pub version: i64,
    /// Where the file is.
    pub path: PathBuf,
}

impl Migration {
    /// The file name without its directory, as goose logs it.
    pub fn file_name(&self) -> String {
        self.path.file_name().map_or_else(
            || self.path.display().to_string(),
            |name| name.to_string_lossy().into_owned(),
        )
    }

    /// Reads the file and parses one direction, substituting `ENVSUB` variables from
    /// the process environment.
    pub(crate) fn parse(&self, direction: Direction) -> Result<ParsedSql, LoadError> {
        let sql = std::fs::read_to_string(&self.path).map_err(|error| LoadError::Read {
            file: self.file_name(),
            error,
        })?;
        parser::parse(&sql, direction, &parser::process_env).map_err(|error| LoadError::Parse {
            file: self.file_name(),
            error,
        })
    }
}

/// A migration file that could not be read or parsed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read (or is not UTF-8).
    #[error("ERROR {file}: failed to read SQL migration file: {error}")]
    Read {
        /// The file name.
        file: String,
        /// The I/O error.
        error: std::io::Error,
    },
    /// goose's parser rejected the file.
    #[error("ERROR {file}{}: failed to parse SQL migration file: {error}", line_suffix(.error))]
    Parse {
        /// The file name.
        file: String,
        /// The parser's error, with its line number.
        error: ParseError,
    },
}

fn line_suffix(error: &ParseError) -> String {
    error
        .line()
        .map(|line| format!(":{line}"))
        .unwrap_or_default()
}

/// Why the migration directory could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// The directory does not exist.
    #[error("{0} directory does not exist")]
    MissingDirectory(String),
    /// The directory could not be read.
    #[error("failed to read migration directory {dir}: {error}")]
    Read {
        /// The directory.
        dir: String,
        /// The I/O error.
        error: std::io::Error,
    },
    /// The directory holds no `.sql` files.
    #[error("no migration files found")]
    NoMigrations,
    /// A `.sql` file whose name carries no valid version.
    #[error("could not parse SQL migration file \"{path}\": {error}")]
    BadName {
        /// The file.
        path: String,
        /// What is wrong with its name.
        error: VersionError,
    },
    /// Two files with the same version.
    #[error("{0}")]
    Duplicate(Duplicate),
}

/// Two migration files with the same version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Duplicate {
    /// The shared version.
    pub version: i64,
    /// The first file (in name order).
    pub first: PathBuf,
    /// The second file.
    pub second: PathBuf,
}

impl fmt::Display for Duplicate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "duplicate version {} detected:\n\t{}\n\t{}",
            self.version,
            self.first.display(),
            self.second.display()
        )
    }
}

/// The `*.sql` files directly inside `dir`, sorted by name.
pub(crate) fn sql_files(dir: &Path) -> Result<Vec<PathBuf>, DiscoveryError> {
    if !dir.is_dir() {
        return Err(DiscoveryError::MissingDirectory(dir.display().to_string()));
    }
    let read_error = |error| DiscoveryError::Read {
        dir: dir.display().to_string(),
        error,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read_error)? {
        let path = entry.map_err(read_error)?.path();
        let is_sql = path.extension().is_some_and(|ext| ext == "sql");
        if is_sql && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// All migrations in `dir`, sorted by version.
pub(crate) fn collect(dir: &Path) -> Result<Vec<Migration>, DiscoveryError> {
    let mut migrations = Vec::new();
    for path in sql_files(dir)? {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let version = naming::parse_version(&name).map_err(|error| DiscoveryError::BadName {
            path: path.display().to_string(),
            error,
        })?;
        migrations.push(Migration { version, path });
    }
    if migrations.is_empty() {
        return Err(DiscoveryError::NoMigrations);
    }
    migrations.sort_by_key(|m| m.version);
    if let Some(pair) = find_duplicate(&migrations) {
        return Err(DiscoveryError::Duplicate(pair));
    }
    Ok(migrations)
}

/// The first pair of migrations sharing a version, if any (`migrations` sorted).
pub(crate) fn find_duplicate(migrations: &[Migration]) -> Option<Duplicate> {
    migrations.windows(2).find_map(|pair| {
        (pair[0].version == pair[1].version).then(|| Duplicate {
            version: pair[0].version,
            first: pair[0].path.clone(),
            second: pair[1].path.clone(),
        })
    })
}
