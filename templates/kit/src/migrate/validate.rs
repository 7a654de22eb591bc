//! `validate`: checks every migration file without a database.
//!
//! Each `.sql` file in the directory is parsed in both directions (as goose's
//! `validate` does), and its name is checked for a version. Unlike goose, two files
//! with the same version are reported too. The report is either a readable summary
//! or JSON: an array of
//! `{"file", "version", "up": {"statements", "use_tx", "error"?, "line"?}, "down": {...}, "error"?}`,
//! where the per-direction objects have the shape of goose's conformance corpus.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use super::naming;
use super::parser::{self, Direction};
use super::source::{self, DiscoveryError};

/// The result for one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct FileReport {
    /// The file name.
    pub(crate) file: String,
    /// The version from the name, if it has one.
    pub(crate) version: Option<i64>,
    /// The Up direction.
    pub(crate) up: DirectionReport,
    /// The Down direction.
    pub(crate) down: DirectionReport,
    /// A problem with the file name (bad version, duplicate version).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

/// The result for one direction of one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct DirectionReport {
    /// The statements goose would run (empty on error).
    pub(crate) statements: Vec<String>,
    /// Whether they run in a transaction (`false` on error, like goose).
    pub(crate) use_tx: bool,
    /// goose's parse error, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
    /// The line of the error, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) line: Option<usize>,
}

impl DirectionReport {
    fn failed(error: String, line: Option<usize>) -> Self {
        Self {
            statements: Vec::new(),
            use_tx: false,
            error: Some(error),
            line,
        }
    }
}

impl FileReport {
    /// Whether anything is wrong with this file.
    pub(crate) fn has_error(&self) -> bool {
        self.error.is_some() || self.up.error.is_some() || self.down.error.is_some()
    }
}

/// Checks every `.sql` file in `dir`. Fails only if the directory cannot be read.
pub(crate) fn validate(dir: &Path) -> Result<Vec<FileReport>, DiscoveryError> {
    let mut reports = Vec::new();
    let mut first_with_version: HashMap<i64, String> = HashMap::new();
    for path in source::sql_files(dir)? {
        let file = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let (version, mut error) = match naming::parse_version(&file) {
            Ok(version) => (Some(version), None),
            Err(e) => (None, Some(e.to_string())),
        };
        if let Some(version) = version {
            if let Some(other) = first_with_version.get(&version) {
                error = Some(format!("duplicate version {version}: also used by {other}"));
            } else {
                first_with_version.insert(version, file.clone());
            }
        }
        let (up, down) = match std::fs::read_to_string(&path) {
            Ok(sql) => (check(&sql, Direction::Up), check(&sql, Direction::Down)),
            Err(e) => {
                let message = format!("failed to read file: {e}");
                (
                    DirectionReport::failed(message.clone(), None),
                    DirectionReport::failed(message, None),
                )
            }
        };
        reports.push(FileReport {
            file,
            version,
            up,
            down,
            error,
        });
    }
    if reports.is_empty() {
        return Err(DiscoveryError::NoMigrations);
    }
    Ok(reports)
}

fn check(sql: &str, direction: Direction) -> DirectionReport {
    match parser::parse(sql, direction, &parser::process_env) {
        Ok(parsed) => DirectionReport {
            statements: parsed.statements,
            use_tx: parsed.use_tx,
            error: None,
            line: None,
        },
        Err(e) => DirectionReport::failed(e.message().to_owned(), e.line()),
    }
}

/// A readable summary: one block per file, then a total.
pub(crate) fn render_text(reports: &[FileReport]) -> String {
    let mut out = String::new();
    for report in reports {
        let version = report
            .version
            .map_or_else(|| "no version".to_owned(), |v| format!("version {v}"));
        let _ = writeln!(out, "{} ({version})", report.file);
        if let Some(error) = &report.error {
            let _ = writeln!(out, "  name: error: {error}");
        }
        for (label, direction) in [("up:  ", &report.up), ("down:", &report.down)] {
            let _ = writeln!(out, "  {label} {}", describe(direction));
        }
    }
    let failed = reports.iter().filter(|r| r.has_error()).count();
    let _ = writeln!(
        out,
        "{} file{}, {failed} with errors",
        reports.len(),
        if reports.len() == 1 { "" } else { "s" }
    );
    out
}

fn describe(report: &DirectionReport) -> String {
    if let Some(error) = &report.error {
        return match report.line {
            Some(line) => format!("error at line {line}: {error}"),
            None => format!("error: {error}"),
        };
    }
    let count = report.statements.len();
    format!(
        "{count} statement{}, {}",
        if count == 1 { "" } else { "s" },
        if report.use_tx {
            "in a transaction"
        } else {
            "no transaction"
        }
    )
}
