//! goose's rules for migration file names and version numbers.
//!
//! * [`parse_version`]: the version is the number before the first `_` of a
//!   `.sql`/`.go` file name (`00002_add_users.sql` is version 2).
//! * [`is_timestamp`]: whether a version is a `YYYYMMDDhhmmss` timestamp (as made by
//!   `create`) rather than a sequential number (as made by `create -s` or `fix`).
//! * [`snake_case`]: how `create` turns a description into a file name.
//!
//! Ported from pressly/goose v3.27 (`NumericComponent`, `Migrations.timestamped`,
//! `snakeCase`); error messages are goose's. This file depends on `std` only, so
//! gpkit's own tests can include it with `#[path]`.

use std::fmt;
use std::num::IntErrorKind;
use std::path::Path;

/// Why a file name does not carry a valid migration version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VersionError {
    /// The extension is not exactly `.sql` or `.go`.
    Extension,
    /// There is no `_` in the name.
    NoSeparator,
    /// The part before the first `_` is not a 64-bit integer.
    NotANumber {
        /// The file's base name.
        file_name: String,
        /// Go's `strconv.ParseInt` error text.
        reason: String,
    },
    /// The version is zero or negative (0 is the version table's initial row).
    NotPositive,
}

impl fmt::Display for VersionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VersionError::Extension => {
                f.write_str("migration file does not have .sql or .go file extension")
            }
            VersionError::NoSeparator => f.write_str("no filename separator '_' found"),
            VersionError::NotANumber { file_name, reason } => write!(
                f,
                "failed to parse version from migration file: {file_name}: {reason}"
            ),
            VersionError::NotPositive => f.write_str("migration version must be greater than zero"),
        }
    }
}

impl std::error::Error for VersionError {}

/// The version of a migration file, from its name (any leading directories are
/// ignored). Leading zeros and a leading `+` are accepted, as in goose.
pub fn parse_version(file_name: &str) -> Result<i64, VersionError> {
    let base = Path::new(file_name)
        .file_name()
        .map_or(file_name.to_owned(), |name| {
            name.to_string_lossy().into_owned()
        });
    // Go's filepath.Ext: from the last '.', case-sensitive.
    let extension = base.rfind('.').map_or("", |dot| &base[dot..]);
    if extension != ".sql" && extension != ".go" {
        return Err(VersionError::Extension);
    }
    let (number, _) = base.split_once('_').ok_or(VersionError::NoSeparator)?;
    let version = go_parse_int(number).map_err(|reason| VersionError::NotANumber {
        file_name: base.clone(),
        reason,
    })?;
    if version < 1 {
        return Err(VersionError::NotPositive);
    }
    Ok(version)
}

/// Go's `strconv.ParseInt(s, 10, 64)`, with its error text.
fn go_parse_int(s: &str) -> Result<i64, String> {
    // Rust's parser accepts exactly Go's base-10 syntax: an optional sign, then
    // ASCII digits (no underscores, no spaces).
    s.parse::<i64>().map_err(|e| {
        let reason = match e.kind() {
            IntErrorKind::PosOverflow | IntErrorKind::NegOverflow => "value out of range",
            _ => "invalid syntax",
        };
        format!("strconv.ParseInt: parsing {}: {reason}", quote(s))
    })
}

/// Go's `%q` for the short strings that appear here: `"` and `\` escaped, control
/// characters as `\xNN`/`\uNNNN`, everything else kept.
fn quote(s: &str) -> String {
    let mut out = String::from('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Whether goose considers `version` a timestamp: its decimal form is exactly 14
/// digits forming a valid `YYYYMMDDhhmmss` date and time, later than the Unix epoch.
/// Any other version is "versioned" (sequential).
pub fn is_timestamp(version: i64) -> bool {
    let text = version.to_string();
    if text.len() != 14 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    let field = |range: std::ops::Range<usize>| text[range].parse::<u32>().unwrap_or(u32::MAX);
    let (year, month, day) = (field(0..4), field(4..6), field(6..8));
    let (hour, minute, second) = (field(8..10), field(10..12), field(12..14));
    let valid = (1..=12).contains(&month)
        && day >= 1
        && day <= days_in_month(year, month)
        && hour < 24
        && minute < 60
        && second < 60;
    // time.Time.After(epoch): 1970-01-01 00:00:00 itself is not a timestamp.
    valid && year >= 1970 && version != 19700101000000
}

fn days_in_month(year: u32, month: u32) -> u32 {
    match month {
        4 | 6 | 9 | 11 => 30,
        2 if year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400)) => {
            29
        }
        2 => 28,
        _ => 31,
    }
}

/// goose's `snakeCase` for `create NAME`: letters and digits lowercased, each run of
/// other characters turned into one `_`, leading separators dropped. A trailing
/// separator survives only after a single trailing non-alphanumeric character:
/// `"foo!"` gives `foo_` but `"foo!!"` gives `foo`.
pub fn snake_case(name: &str) -> String {
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum State {
        Idle,
        FirstAlphaNum,
        AlphaNum,
        Delimiter,
    }
    let is_alphanumeric = |c: char| c.is_alphabetic() || c.is_numeric();
    let mut out = String::with_capacity(name.len());
    let mut state = State::Idle;
    for c in name.chars() {
        state = match (state, is_alphanumeric(c)) {
            (State::Idle, true) | (State::Delimiter, true) => State::FirstAlphaNum,
            (State::Idle, false) | (State::Delimiter, false) => State::Idle,
            (State::FirstAlphaNum, true) | (State::AlphaNum, true) => State::AlphaNum,
            (State::FirstAlphaNum, false) | (State::AlphaNum, false) => State::Delimiter,
        };
        match state {
            State::FirstAlphaNum | State::AlphaNum => {
                // Go's unicode.ToLower maps one rune to one rune.
                out.push(c.to_lowercase().next().unwrap_or(c));
            }
            State::Delimiter => out.push('_'),
            State::Idle => {}
        }
    }
    if state == State::Idle && out.ends_with('_') {
        out.pop();
    }
    out
}
