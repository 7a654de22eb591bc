//! The embedded template tree and the one minijinja environment that renders it.
//!
//! Templates live under `templates/` in the gpkit repository and are compiled
//! into the binary with `include_dir`. A file whose name ends in `.jinja` is
//! rendered (and loses the suffix); every other file is copied byte for byte,
//! so Rust braces and `${{ }}` in plain files never need escaping.

use std::collections::HashMap;
use std::sync::OnceLock;

use anyhow::{Context, Result, anyhow};
use include_dir::{Dir, DirEntry, include_dir};
use minijinja::{AutoEscape, Environment, UndefinedBehavior, Value};

static TEMPLATES: Dir<'static> = include_dir!("$CARGO_MANIFEST_DIR/templates");

/// The folder of `templates/` that holds the store of released kit files
/// (see [`crate::engine::released`]); not a template set.
const RELEASED_DIR: &str = "released";

/// The suffix that marks a file as a template to render.
const TEMPLATE_SUFFIX: &str = ".jinja";

/// One file of a template set, before rendering.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TemplateFile {
    /// Path inside the template set, e.g. `src/startup.rs.jinja`.
    pub(crate) source: &'static str,
    /// Path in the generated project, e.g. `src/startup.rs`.
    pub(crate) output: &'static str,
    contents: &'static [u8],
}

impl TemplateFile {
    /// Whether the file is rendered by minijinja (rather than copied).
    pub(crate) fn is_template(&self) -> bool {
        self.source.ends_with(TEMPLATE_SUFFIX)
    }

    /// The file's bytes as embedded, before rendering (the tests compare
    /// them with the released kit's).
    #[cfg(test)]
    pub(crate) fn contents(&self) -> &'static [u8] {
        self.contents
    }
}

/// Lists the files of one template set (a top-level folder of `templates/`),
/// sorted by output path.
pub(crate) fn template_set(set: &str) -> Result<Vec<TemplateFile>> {
    let dir = TEMPLATES
        .get_dir(set)
        .ok_or_else(|| anyhow!("gpkit has no template set `{set}` (this is a bug in gpkit)"))?;
    let mut files = Vec::new();
    collect(dir, set, &mut files);
    files.sort_by(|a, b| a.output.cmp(b.output));
    Ok(files)
}

/// The file `path` of the store of released kit files
/// (`templates/released/<path>`), if there is one.
pub(crate) fn released_file(path: &str) -> Option<&'static [u8]> {
    released_index().get(path).copied()
}

/// The store's files by path inside it, indexed once: `include_dir` finds a
/// path by comparing it with each entry of each folder on the way, and the
/// store is read a file of every release at a time (thousands of lookups
/// among its hundreds of blobs).
fn released_index() -> &'static HashMap<&'static str, &'static [u8]> {
    fn add(dir: &'static Dir<'static>, index: &mut HashMap<&'static str, &'static [u8]>) {
        for entry in dir.entries() {
            match entry {
                DirEntry::Dir(dir) => add(dir, index),
                DirEntry::File(file) => {
                    let path = file.path().to_str().unwrap_or_default();
                    if let Some(inside) = path
                        .strip_prefix(RELEASED_DIR)
                        .and_then(|p| p.strip_prefix('/'))
                    {
                        index.insert(inside, file.contents());
                    }
                }
            }
        }
    }
    static INDEX: OnceLock<HashMap<&'static str, &'static [u8]>> = OnceLock::new();
    INDEX.get_or_init(|| {
        let mut index = HashMap::new();
        if let Some(dir) = TEMPLATES.get_dir(RELEASED_DIR) {
            add(dir, &mut index);
        }
        index
    })
}

/// The names of the files directly in the store of released kit files.
pub(crate) fn released_names() -> Vec<&'static str> {
    TEMPLATES
        .get_dir(RELEASED_DIR)
        .map(|dir| {
            dir.files()
                .filter_map(|f| f.path().file_name()?.to_str())
                .collect()
        })
        .unwrap_or_default()
}

fn collect(dir: &'static Dir<'static>, set: &str, files: &mut Vec<TemplateFile>) {
    for entry in dir.entries() {
        match entry {
            DirEntry::Dir(sub) => collect(sub, set, files),
            DirEntry::File(file) => {
                let full = file.path().to_str().expect("template paths are UTF-8");
                let source = full
                    .strip_prefix(set)
                    .and_then(|p| p.strip_prefix('/'))
                    .expect("file lies inside its template set");
                let output = source.strip_suffix(TEMPLATE_SUFFIX).unwrap_or(source);
                files.push(TemplateFile {
                    source,
                    output,
                    contents: file.contents(),
                });
            }
        }
    }
}

/// Renders template files with one strict environment.
pub(crate) struct Renderer {
    env: Environment<'static>,
}

impl Renderer {
    /// The environment every gpkit template is rendered with: undefined
    /// variables are errors, no HTML escaping, and whitespace control that
    /// suits source code (blocks don't leave blank lines behind).
    pub(crate) fn new() -> Self {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.set_keep_trailing_newline(true);
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        Self { env }
    }

    /// Renders (or copies) `file` with `context`.
    pub(crate) fn render(&self, file: &TemplateFile, context: &Value) -> Result<Vec<u8>> {
        if !file.is_template() {
            return Ok(file.contents.to_vec());
        }
        let source = std::str::from_utf8(file.contents)
            .with_context(|| format!("template `{}` is not UTF-8", file.source))?;
        self.env
            .render_str(source, context)
            .map(String::into_bytes)
            .map_err(|err| anyhow!("failed to render template `{}`: {err:#}", file.source))
    }
}

impl Default for Renderer {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Templates print only plain variables and their attributes, written
    /// `{{ name }}` or `{{ event.module }}`. Anything else that looks like an
    /// expression is most likely Rust (`format!("{{{x}}}")`) that minijinja
    /// would swallow: keep such code in a plain (non-`.jinja`) file.
    fn strip_variables(line: &str) -> String {
        let mut out = String::new();
        let mut rest = line;
        while let Some(start) = rest.find("{{ ") {
            let after = &rest[start + 3..];
            let Some(end) = after.find(" }}") else { break };
            let path = &after[..end];
            let plain = path.split('.').all(|part| {
                !part.is_empty() && part.chars().all(|c| c.is_ascii_lowercase() || c == '_')
            });
            if !plain {
                break;
            }
            out.push_str(&rest[..start]);
            rest = &after[end + 3..];
        }
        out.push_str(rest);
        out
    }

    #[test]
    fn templates_print_only_plain_variables() {
        assert_eq!(strip_variables("pub mod {{ event.module }};"), "pub mod ;");
        assert_eq!(
            strip_variables("format!(\"{{{x}}}\")"),
            "format!(\"{{{x}}}\")"
        );
        for set in ["project", "worker", "event", "schedule", "tests", "legacy"] {
            for file in template_set(set)
                .unwrap()
                .iter()
                .filter(|f| f.is_template())
            {
                let text = String::from_utf8(file.contents.to_vec()).unwrap();
                for (number, line) in text.lines().enumerate() {
                    let line = strip_variables(line);
                    assert!(
                        !line.contains("{{") && !line.contains("}}"),
                        "{set}/{}:{}: an expression minijinja would evaluate: {line}",
                        file.source,
                        number + 1
                    );
                }
            }
        }
    }
}
