//! The kit's declared API changes (`kit_api_changes.toml`, the file
//! `scripts/kit-api check` holds the kit to) and the lines of a service's
//! own code that name a changed item: what an upgrade from an older
//! template set rewrites, where the entry has a rewrite, or reports.
//!
//! A line names an item when it spells the item's path from `kit` (or, for
//! a module `src/lib.rs` re-exports, from `crate` or the crate's name), when
//! a `use` imports the item or something under it, or when it spells the
//! item through a name a `use` bound (`use kit::migrate;` then
//! `migrate::Migrator`, `use kit::queue::Client;` then `Client`). A method
//! called on a value (`schedules.all()`) names no path and is not found;
//! the compiler names it.

use serde::Deserialize;

use super::api_changes::LineNote;

/// The declared changes, as gpkit was built with them.
const DECLARED: &str = include_str!("kit_api_changes.toml");

/// One declared change of the kit's public API.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(crate) struct Change {
    /// The template set that made the change.
    pub(crate) set: u32,
    /// The item's path, `kit::...`; it covers what lies under it.
    pub(crate) item: String,
    /// Which item, when a path names two (`kit::dispatch`).
    #[serde(default)]
    pub(crate) kind: Option<String>,
    /// `removed`, `changed` or `made private`.
    pub(crate) change: String,
    /// The textual rewrite an upgrade applies to a line naming the item.
    #[serde(default)]
    pub(crate) rewrite: Option<Rewrite>,
    /// What the service's code does instead.
    pub(crate) note: String,
    /// Whether an upgrade reports the lines that name the item: `false`
    /// for a change the service's code needs nothing for (a type that a
    /// signature names by another path).
    #[serde(default = "yes")]
    pub(crate) report: bool,
}

fn yes() -> bool {
    true
}

/// A textual rewrite: `from` becomes `to` on a line that names the item.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(crate) struct Rewrite {
    pub(crate) from: String,
    pub(crate) to: String,
}

#[derive(Deserialize)]
struct Declared {
    #[serde(default)]
    change: Vec<Change>,
}

/// Every declared change. The file is compiled in and checked by a test,
/// so it parses.
pub(crate) fn declared() -> Vec<Change> {
    toml_edit::de::from_str::<Declared>(DECLARED)
        .expect("src/domain/kit_api_changes.toml parses (a unit test checks it)")
        .change
}

/// The changes a project made by template set `from` meets on its way to
/// set `to`.
pub(crate) fn between(from: u32, to: u32) -> Vec<Change> {
    declared()
        .into_iter()
        .filter(|change| change.report && change.set > from && change.set <= to)
        .collect()
}

/// How a service's code reaches the kit: `kit`, and through the
/// compatibility re-exports of its `src/lib.rs`, `crate::<module>` and
/// `<crate_name>::<module>`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Roots {
    /// The service's crate name (`my_shop`).
    pub(crate) crate_name: String,
    /// The kit modules `src/lib.rs` re-exports (`outbox`, `queue`, ...).
    pub(crate) reexported: Vec<String>,
}

/// The kit modules a `src/lib.rs` re-exports at its root (`pub use
/// kit::{config, outbox};`, `pub use kit::orm;`).
pub(crate) fn reexported_modules(lib_rs: &str) -> Vec<String> {
    let mut modules: Vec<String> = uses(lib_rs)
        .into_iter()
        .filter(|u| u.public && u.path.len() == 2 && u.path[0] == "kit")
        .map(|u| u.binding)
        .collect();
    modules.sort();
    modules.dedup();
    modules
}

/// A file's text with the declared `changes` applied: each line that names
/// a changed item is rewritten (where the change has a rewrite) or noted.
pub(crate) fn carry(text: &str, changes: &[Change], roots: &Roots) -> super::api_changes::Carried {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let uses = uses(text);
    let in_use: Vec<bool> = {
        let mut in_use = vec![false; lines.len()];
        for u in &uses {
            for flag in in_use.iter_mut().take(u.last_line + 1).skip(u.first_line) {
                *flag = true;
            }
        }
        in_use
    };
    let mut named: Vec<(usize, &Change)> = Vec::new();
    for change in changes {
        let item: Vec<&str> = change.item.split("::").collect();
        for u in &uses {
            let Some(path) = u.kit_path(roots) else {
                continue;
            };
            let spelled = if starts_with(&path, &item) {
                // The `use` imports the item or something under it, which
                // the code then names by the name the `use` binds.
                named.push((u.line_of(&lines, path.last().unwrap()), change));
                if u.glob {
                    continue;
                }
                u.binding.clone()
            } else if starts_with(&item, &path) && !u.glob {
                // The `use` imports a module above the item, through which
                // the code spells it: `migrate::Migrator`.
                std::iter::once(u.binding.as_str())
                    .chain(item[path.len()..].iter().copied())
                    .collect::<Vec<_>>()
                    .join("::")
            } else {
                continue;
            };
            for (index, line) in lines.iter().enumerate() {
                if !in_use[index] && names(code(line), &spelled) {
                    named.push((index, change));
                }
            }
        }
        // The whole path, from `kit` or a re-exporting root.
        let rest = item[1..].join("::");
        let mut spellings = vec![format!("kit::{rest}")];
        if item.len() > 1 && roots.reexported.iter().any(|m| m == item[1]) {
            spellings.push(format!("crate::{rest}"));
            spellings.push(format!("{}::{rest}", roots.crate_name));
        }
        for (index, line) in lines.iter().enumerate() {
            if !in_use[index] && spellings.iter().any(|s| names(code(line), s)) {
                named.push((index, change));
            }
        }
    }
    named.sort_by_key(|(index, change)| (*index, change.item.clone()));
    named.dedup_by(|a, b| a.0 == b.0 && a.1.item == b.1.item);

    let mut out: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    let mut notes = Vec::new();
    for (index, change) in named {
        let rewritten = match &change.rewrite {
            Some(Rewrite { from, to }) if out[index].contains(from.as_str()) => {
                out[index] = out[index].replace(from.as_str(), to);
                true
            }
            _ => false,
        };
        let what = match change.change.as_str() {
            "made private" => "which the kit now keeps private",
            "removed" => "which is gone",
            _ => "which changed",
        };
        notes.push(LineNote {
            line: index + 1,
            text: format!("names `{}`, {what}: {}", change.item, change.note),
            rewritten,
        });
    }
    super::api_changes::Carried {
        text: out.concat(),
        notes,
    }
}

/// Whether `path` begins with every segment of `prefix`.
fn starts_with(path: &[&str], prefix: &[&str]) -> bool {
    path.len() >= prefix.len() && path[..prefix.len()] == *prefix
}

/// A line without its `//` comment (a `//` inside a string is rare in a
/// line that names the kit; such a line is cut short, never misread).
fn code(line: &str) -> &str {
    line.find("//").map_or(line, |at| &line[..at])
}

/// Whether `line` spells the path `spelled` as whole words: not preceded by
/// a part of a longer path or name, and not followed by one.
fn names(line: &str, spelled: &str) -> bool {
    let word = |c: char| c.is_alphanumeric() || c == '_';
    line.match_indices(spelled).any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let after = line[at + spelled.len()..].chars().next();
        before.is_none_or(|c| !word(c) && c != ':') && after.is_none_or(|c| !word(c))
    })
}

/// One path a `use` declaration imports.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Use {
    /// Its segments, from the root as written (`kit`, `crate`, a crate).
    path: Vec<String>,
    /// The name it binds (its last segment, or its `as` name).
    binding: String,
    /// A glob import (`use kit::prelude::*`).
    glob: bool,
    /// `pub use`.
    public: bool,
    /// The declaration's first and last lines, from 0.
    first_line: usize,
    last_line: usize,
}

impl Use {
    /// The path from `kit`: as written, or through a re-exported module.
    fn kit_path<'a>(&'a self, roots: &Roots) -> Option<Vec<&'a str>> {
        let path: Vec<&str> = self.path.iter().map(String::as_str).collect();
        match path.first().copied() {
            Some("kit") => Some(path),
            Some(root)
                if (root == "crate" || root == roots.crate_name)
                    && path.len() > 1
                    && roots.reexported.iter().any(|m| m == path[1]) =>
            {
                Some(
                    std::iter::once("kit")
                        .chain(path[1..].iter().copied())
                        .collect(),
                )
            }
            _ => None,
        }
    }

    /// The line of the declaration that holds `segment` (a grouped import
    /// spans lines), or its first line.
    fn line_of(&self, lines: &[&str], segment: &str) -> usize {
        (self.first_line..=self.last_line)
            .find(|&index| names(code(lines[index]), segment))
            .unwrap_or(self.first_line)
    }
}

/// The `use` declarations of `text`, one entry per imported path.
fn uses(text: &str) -> Vec<Use> {
    let mut found = Vec::new();
    let mut offset = 0;
    let line_at = |at: usize| text[..at].matches('\n').count();
    for line in text.split_inclusive('\n') {
        let start = offset;
        offset += line.len();
        let trimmed = code(line).trim_start();
        let (public, rest) = match trimmed.strip_prefix("pub ") {
            Some(rest) => (true, rest.trim_start()),
            None => match trimmed.strip_prefix("pub(crate) ") {
                Some(rest) => (true, rest.trim_start()),
                None => (false, trimmed),
            },
        };
        if !rest.starts_with("use ") {
            continue;
        }
        // `rest` starts with the keyword: where it is in the line.
        let Some(at) = line.find(rest) else {
            continue;
        };
        let body_start = start + at + "use ".len();
        let Some(end) = text[body_start..].find(';') else {
            continue;
        };
        let body: String = text[body_start..body_start + end]
            .lines()
            .map(code)
            .collect::<Vec<_>>()
            .join(" ");
        let (first_line, last_line) = (line_at(start), line_at(body_start + end));
        for (path, binding, glob) in expand(&body) {
            found.push(Use {
                path,
                binding,
                glob,
                public,
                first_line,
                last_line,
            });
        }
    }
    found
}

/// The paths of a use tree (`a::{b, c::{d as e}, self, f::*}`): each with
/// the name it binds and whether it is a glob.
fn expand(tree: &str) -> Vec<(Vec<String>, String, bool)> {
    let tree = tree.trim().trim_start_matches("::");
    let mut out = Vec::new();
    if let Some(open) = tree.find('{') {
        let prefix: Vec<String> = segments(&tree[..open]);
        let inner = tree[open + 1..].trim_end().trim_end_matches('}');
        for part in split_top(inner) {
            for (mut path, binding, glob) in expand(part) {
                if path == ["self"] {
                    path = prefix.clone();
                    let binding = prefix.last().cloned().unwrap_or(binding);
                    out.push((path, binding, glob));
                    continue;
                }
                let mut full = prefix.clone();
                full.append(&mut path);
                out.push((full, binding, glob));
            }
        }
        return out;
    }
    if tree.is_empty() {
        return out;
    }
    let (path, alias) = match tree.split_once(" as ") {
        Some((path, alias)) => (path, Some(alias.trim().to_string())),
        None => (tree, None),
    };
    let mut path = segments(path);
    let glob = path.last().is_some_and(|s| s == "*");
    if glob {
        path.pop();
    }
    let binding = alias.unwrap_or_else(|| path.last().cloned().unwrap_or_default());
    out.push((path, binding, glob));
    out
}

/// `a::b::` as `["a", "b"]`.
fn segments(path: &str) -> Vec<String> {
    path.split("::")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// `inner` split at the commas outside braces.
fn split_top(inner: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (at, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..at]);
                start = at + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts.into_iter().filter(|p| !p.trim().is_empty()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(item: &str) -> Change {
        Change {
            set: 15,
            item: item.to_string(),
            kind: None,
            change: "made private".to_string(),
            rewrite: None,
            note: "do this instead".to_string(),
            report: true,
        }
    }

    fn roots(reexported: &[&str]) -> Roots {
        Roots {
            crate_name: "shop".to_string(),
            reexported: reexported.iter().map(|m| m.to_string()).collect(),
        }
    }

    fn noted(text: &str, items: &[&str], reexported: &[&str]) -> Vec<usize> {
        let changes: Vec<Change> = items.iter().map(|i| change(i)).collect();
        carry(text, &changes, &roots(reexported))
            .notes
            .iter()
            .map(|n| n.line)
            .collect()
    }

    #[test]
    fn the_declared_file_parses_and_names_kit_paths() {
        let declared = declared();
        assert!(
            declared
                .iter()
                .any(|c| c.item == "kit::queue" && c.set == 15)
        );
        for change in &declared {
            assert!(change.item.starts_with("kit::"), "{change:?}");
            assert!(
                ["removed", "changed", "made private"].contains(&change.change.as_str()),
                "{change:?}"
            );
            assert!(!change.note.is_empty(), "{change:?}");
        }
        assert!(between(14, 15).iter().all(|c| c.set == 15));
        assert!(between(15, 15).is_empty());
        // A renamed error type in `up`'s signature needs nothing of a
        // service: not reported.
        assert!(
            !between(14, 15)
                .iter()
                .any(|c| c.item == "kit::migrate::testing::up")
        );
    }

    #[test]
    fn an_import_of_the_item_or_below_it_and_each_use_of_its_name_are_noted() {
        let text = "\
use kit::queue::Client;
use kit::dispatch;

// Client in a comment is not code.
async fn f() {
    let c = Client::from_config(&cfg).await?;
    let d = MyClient::new();
}
";
        assert_eq!(noted(text, &["kit::queue"], &[]), vec![1, 6]);
    }

    #[test]
    fn a_grouped_import_is_noted_on_the_line_of_the_name() {
        let text = "\
use kit::{
    dispatch,
    queue::{self, Client},
    worker,
};

fn f() -> queue::Task { todo!() }
";
        // `queue` (self) on line 3, its use on line 7; `Client` on line 3.
        assert_eq!(noted(text, &["kit::queue"], &[]), vec![3, 7]);
    }

    #[test]
    fn a_module_import_notes_the_paths_spelled_through_it() {
        let text = "\
use kit::migrate;

fn f() {
    migrate::cli::main();
    let m = migrate::Migrator::new(dir);
    let n = not_migrate::Migrator::new(dir);
}
";
        assert_eq!(noted(text, &["kit::migrate::Migrator"], &[]), vec![5]);
    }

    #[test]
    fn full_paths_and_paths_through_the_re_exports_are_noted() {
        let text = "\
fn f() {
    kit::queue::Client::from_config(&c);
    crate::queue::Client::from_config(&c);
    shop::queue::Client::from_config(&c);
    crate::outbox::dispatch(&c);
    other::queue::Client::from_config(&c);
}
";
        assert_eq!(noted(text, &["kit::queue"], &["queue"]), vec![2, 3, 4]);
        // Without the re-export, `crate::queue` is the service's own.
        assert_eq!(noted(text, &["kit::queue"], &[]), vec![2]);
        let through = "use crate::queue::Client;\nuse shop::{queue, settings};\n";
        assert_eq!(noted(through, &["kit::queue"], &["queue"]), vec![1, 2]);
    }

    #[test]
    fn a_line_that_names_nothing_changed_is_left_alone() {
        let text = "use kit::prelude::*;\nuse kit::queue_helper;\nfn f() { dispatch(x); }\n";
        let carried = carry(text, &[change("kit::queue")], &roots(&["queue"]));
        assert!(carried.notes.is_empty(), "{:?}", carried.notes);
        assert_eq!(carried.text, text);
    }

    #[test]
    fn a_rewrite_changes_the_line_and_says_so() {
        let mut renamed = change("kit::outbox::OutboxDispatcher");
        renamed.rewrite = Some(Rewrite {
            from: "kit::outbox::OutboxDispatcher::new().dispatch(".to_string(),
            to: "kit::dispatch(".to_string(),
        });
        let text = "fn f() {\n    kit::outbox::OutboxDispatcher::new().dispatch(&tx, &e);\n}\n";
        let carried = carry(text, &[renamed], &roots(&[]));
        assert_eq!(carried.text, "fn f() {\n    kit::dispatch(&tx, &e);\n}\n");
        assert!(carried.notes[0].rewritten);
    }

    #[test]
    fn the_re_exports_of_a_lib_rs_are_read() {
        let lib = "\
pub mod events;
pub use kit::{
    config, database, dispatch,
};
pub use kit::orm;
use kit::queue;
pub use kit::worker::listeners;
";
        assert_eq!(
            reexported_modules(lib),
            vec!["config", "database", "dispatch", "orm"]
        );
    }
}
