//! Local settings from a `.env` file in the working directory.
//!
//! Every binary calls [`load`] first thing in `main`: each `NAME=value` line
//! of `.env` becomes an environment variable unless that variable is
//! already set, so the real environment (a deployment, a test, a shell
//! `export`) always wins over the file. Without a `.env` nothing changes.
//! A line that does not parse stops the binary with an error that names the
//! file and the line, and never shows the line, which may hold a secret.

use std::io;
use std::path::Path;

/// The file [`load`] reads, relative to the working directory.
pub const FILE: &str = ".env";

/// Why `.env` could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum EnvFileError {
    /// The file exists but cannot be read.
    #[error("cannot read `{path}`: {source}")]
    Read {
        /// The file's path.
        path: String,
        /// The read error.
        #[source]
        source: io::Error,
    },
    /// A line is not `NAME=value`.
    #[error(
        "`{path}` line {line}: expected NAME=value; put a value that holds spaces or `#` in quotes"
    )]
    Malformed {
        /// The file's path.
        path: String,
        /// The line's number, from 1.
        line: usize,
    },
    /// A quoted value has no closing quote.
    #[error("`{path}` line {line}: a quote opened on this line is never closed")]
    Unclosed {
        /// The file's path.
        path: String,
        /// The number of the line the quote opens on, from 1.
        line: usize,
    },
}

/// Loads `.env` from the working directory into the process environment, if
/// the file exists; variables already set keep their values. Returns whether
/// there was a file.
///
/// Call it before the process starts any thread (before the async runtime):
/// setting environment variables is sound only while nothing else runs.
pub fn load() -> Result<bool, EnvFileError> {
    load_from(Path::new(FILE))
}

/// [`load`] for the file at `path`.
pub(crate) fn load_from(path: &Path) -> Result<bool, EnvFileError> {
    let shown = path.display().to_string();
    let content = match std::fs::read_to_string(path) {
        Ok(content) => content,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(source) => {
            return Err(EnvFileError::Read {
                path: shown,
                source,
            });
        }
    };
    match dotenvy::from_read(content.as_bytes()) {
        Ok(()) => Ok(true),
        Err(dotenvy::Error::LineParse(..)) => Err(match locate(&content) {
            Problem::Malformed(line) => EnvFileError::Malformed { path: shown, line },
            Problem::Unclosed(line) => EnvFileError::Unclosed { path: shown, line },
        }),
        Err(err) => Err(EnvFileError::Read {
            path: shown,
            source: io::Error::other(err.to_string()),
        }),
    }
}

/// Where a file that does not parse goes wrong, by 1-based line number.
#[derive(Debug, PartialEq, Eq)]
enum Problem {
    /// The entry that ends on this line is not `NAME=value`.
    Malformed(usize),
    /// A quoted value starts on this line and never ends.
    Unclosed(usize),
}

/// Finds the line of the first problem in `content`, which does not parse.
///
/// A quoted value may span lines, so a line's meaning depends on the lines
/// before it: parse ever longer runs of whole lines. The first run whose
/// last entry is complete and wrong ends on the faulty line; a run that ends
/// inside an open quote is not wrong yet, as a later line may close it.
fn locate(content: &str) -> Problem {
    let mut content = content.to_string();
    if !content.ends_with('\n') {
        content.push('\n');
    }
    let mut open_since = None;
    for (index, (at, _)) in content.match_indices('\n').enumerate() {
        let line = index + 1;
        match first_error(&content[..=at]) {
            None => open_since = None,
            // dotenvy keeps the line breaks of an entry it could not finish.
            Some(text) if text.ends_with('\n') => {
                open_since.get_or_insert(line);
            }
            Some(_) => return Problem::Malformed(line),
        }
    }
    open_since.map_or(Problem::Malformed(1), Problem::Unclosed)
}

/// The text dotenvy could not parse in `content`, if any.
fn first_error(content: &str) -> Option<String> {
    dotenvy::from_read_iter(content.as_bytes()).find_map(|item| match item {
        Err(dotenvy::Error::LineParse(text, _)) => Some(text),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_faulty_line_is_found() {
        assert_eq!(locate("A=1\nB c\nC=3\n"), Problem::Malformed(2));
        assert_eq!(locate("A=1\n\n# note\nB=a b\n"), Problem::Malformed(4));
        assert_eq!(locate("A=1\nB-C=2"), Problem::Malformed(2));
    }

    #[test]
    fn a_value_over_several_lines_is_not_mistaken_for_a_fault() {
        assert_eq!(locate("A=\"one\ntwo\"\nB c\n"), Problem::Malformed(3));
        assert_eq!(locate("A='one\nB c\n'\nD e\n"), Problem::Malformed(4));
    }

    #[test]
    fn an_unclosed_quote_is_named_where_it_opens() {
        assert_eq!(locate("A=1\nB='open\nC=3\n"), Problem::Unclosed(2));
        assert_eq!(locate("A=\"open"), Problem::Unclosed(1));
    }
}
