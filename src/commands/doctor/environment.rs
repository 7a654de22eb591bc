//! The settings the project's binaries would see when started in the
//! project directory: the process environment over `.env`, read the way
//! the generated binaries read it (dotenvy; a variable already set wins).

use std::collections::BTreeMap;
use std::path::Path;

use super::report::Finding;

/// Where a setting came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    Environment,
    DotEnv,
    /// The running `gpkit dev`, whose servers the checks then use.
    DevRun,
}

/// The project's settings, by variable name.
#[derive(Debug, Default)]
pub(crate) struct Settings {
    values: BTreeMap<String, (String, Source)>,
}

impl Settings {
    /// The value of `name`, if set in the environment or `.env`.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(|(value, _)| value.as_str())
    }

    /// Where `name`'s value came from, for messages.
    pub(crate) fn source(&self, name: &str) -> Option<Source> {
        self.values.get(name).map(|(_, source)| *source)
    }

    /// Where to change `name`, for a fix: `.env` unless the environment
    /// set it (then that is where the value came from).
    pub(crate) fn where_set(&self, name: &str) -> &'static str {
        match self.source(name) {
            Some(Source::Environment) => "the environment",
            Some(Source::DevRun) => "the running `gpkit dev`",
            _ => ".env",
        }
    }

    /// Sets `name` to the value the running `gpkit dev` gives its processes.
    pub(crate) fn use_dev_run(&mut self, name: &str, value: &str) {
        self.values
            .insert(name.to_string(), (value.to_string(), Source::DevRun));
    }
}

/// Reads `.env` in `root` (if any) under the process environment, for the
/// variables `wanted`. Returns the settings and the finding about `.env`.
pub(crate) fn load(root: &Path, wanted: &[&str]) -> (Settings, Finding) {
    let mut settings = Settings::default();
    let finding = match std::fs::read_to_string(root.join(".env")) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Finding::ok(
            "env",
            "no .env; settings come from the environment and the defaults",
        ),
        Err(err) => Finding::fail(
            "env",
            format!("cannot read .env: {err}"),
            "make .env readable, or remove it",
        ),
        Ok(content) => match parse(&content) {
            Ok(pairs) => {
                for (key, value) in pairs {
                    if wanted.contains(&key.as_str()) {
                        settings.values.insert(key, (value, Source::DotEnv));
                    }
                }
                Finding::ok(
                    "env",
                    "read .env; variables set in the environment win over it",
                )
            }
            Err(line) => Finding::fail(
                "env",
                format!(".env line {line}: expected NAME=value, or a quote that is closed"),
                "correct that line; put a value that holds spaces or `#` in quotes",
            ),
        },
    };
    for name in wanted {
        if let Ok(value) = std::env::var(name) {
            settings
                .values
                .insert((*name).to_string(), (value, Source::Environment));
        }
    }
    (settings, finding)
}

/// The `NAME=value` pairs of a `.env` file, or the 1-based number of the
/// first line that does not parse. The line's text is never shown: it may
/// hold a secret.
fn parse(content: &str) -> Result<Vec<(String, String)>, usize> {
    let parse_all =
        |text: &str| dotenvy::from_read_iter(text.as_bytes()).collect::<Result<Vec<_>, _>>();
    if let Ok(pairs) = parse_all(content) {
        return Ok(pairs);
    }
    // A quoted value may span lines, so a prefix can fail only for lack of
    // its closing quote. The first bad line follows the longest prefix that
    // parses: from there on, no prefix parses again.
    let lines: Vec<&str> = content.lines().collect();
    let good = (0..=lines.len())
        .rev()
        .find(|&n| parse_all(&lines[..n].join("\n")).is_ok())
        .unwrap_or(0);
    Err(good + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_bad_line_is_named_and_quoted_values_may_span_lines() {
        assert_eq!(parse("A=1\nB=\"x\ny\"\nC=3\n").unwrap().len(), 3);
        assert_eq!(parse("A=1\nB=\"x\ny\"\nnot a pair\nC=3\n"), Err(4));
        assert_eq!(parse("A=1\nB=\"never closed\nC=3\n"), Err(2));
    }
}
