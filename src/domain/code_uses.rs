//! What a service's own Rust code names, read from its text (no files
//! here: the engine reads them): the kit's modules through the
//! compatibility re-exports of older projects (`crate::outbox`,
//! `shop::config`, `use crate::{config, outbox}`), and crates
//! (`serde::`, `use redis;`, `extern crate tokio`, `#[tokio::main]`).
//!
//! The scan is textual and errs on the side of "used": a path in a doc
//! comment or a string counts (doc comments compile as doctests), a plain
//! `//` comment does not. A re-export or a dependency kept by mistake costs
//! a line; one removed by mistake breaks the user's build.

use std::collections::BTreeMap;

/// The kit modules that the `src/lib.rs` of template sets 1-14 re-exported
/// under the paths they had before the kit became a crate
/// (`pub use kit::{config, outbox, ...};`), so that `crate::outbox::...`
/// kept compiling. A new project has none of these re-exports; an upgraded
/// one keeps those its code uses and the kit still lets it keep
/// ([`REEXPORTABLE_KIT_MODULES`]).
pub(crate) const COMPAT_MODULES: &[&str] = &[
    "config",
    "database",
    "dispatch",
    "env_file",
    "migrate",
    "outbox",
    "signals",
    "telemetry",
    "trace_context",
    "operations",
    "queue",
    "scheduler",
    "worker",
    "orm",
];

/// The compatibility modules ([`COMPAT_MODULES`]) that `src/lib.rs` may
/// still re-export: those the kit keeps public. Edit this list when the
/// kit makes a module private; a re-export of a module not listed here is
/// never written, and the user's lines that name it are reported instead.
pub(crate) const REEXPORTABLE_KIT_MODULES: &[&str] = &[
    "config",
    "database",
    "dispatch",
    "env_file",
    "migrate",
    "outbox",
    "signals",
    "telemetry",
    "trace_context",
    "operations",
    // `queue` went private in template set 15: an upgrade reports each
    // line that names it (`domain::kit_api`).
    "scheduler",
    "worker",
    "orm",
];

/// The compatibility modules that exist only with the kit's `worker`
/// feature; the others but `orm` are always there.
pub(crate) const WORKER_MODULES: &[&str] = &["operations", "queue", "scheduler", "worker"];

/// The compatibility module that exists only with the kit's `seaorm`
/// feature.
pub(crate) const SEAORM_MODULES: &[&str] = &["orm"];

/// Where a file names something: its path (as the caller gave it) and the
/// line, from 1.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Named {
    pub(crate) path: String,
    pub(crate) line: usize,
}

impl std::fmt::Display for Named {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} line {}", self.path, self.line)
    }
}

/// The compatibility modules ([`COMPAT_MODULES`]) that `sources` (path,
/// text) name through the service's crate root (`crate::<m>`,
/// `<crate_name>::<m>`, or a grouped `use`), each with every place that
/// names it, in the order of `sources` and their lines.
pub(crate) fn compat_modules_named(
    sources: &[(String, String)],
    crate_name: &str,
) -> BTreeMap<&'static str, Vec<Named>> {
    let mut found: BTreeMap<&'static str, Vec<Named>> = BTreeMap::new();
    for (path, text) in sources {
        for (line, module) in compat_modules_in(text, crate_name) {
            let named = Named {
                path: path.clone(),
                line,
            };
            let places = found.entry(module).or_default();
            if !places.contains(&named) {
                places.push(named);
            }
        }
    }
    found
}

/// The compatibility modules one text names through the crate root, with
/// the line of each mention, in the order of the text.
pub(crate) fn compat_modules_in(text: &str, crate_name: &str) -> Vec<(usize, &'static str)> {
    let text = without_line_comments(text);
    let mut found = Vec::new();
    for root in ["crate", crate_name] {
        for at in path_roots(&text, root) {
            let rest = text[at + root.len()..].trim_start();
            let Some(rest) = rest.strip_prefix("::") else {
                continue;
            };
            let rest = rest.trim_start();
            if let Some(group) = rest.strip_prefix('{') {
                let offset = text.len() - group.len();
                for (item, name) in group_heads(group) {
                    if let Some(module) = compat_module(name) {
                        found.push((line_of(&text, offset + item), module));
                    }
                }
            } else if let Some(module) = compat_module(identifier(rest)) {
                found.push((line_of(&text, at), module));
            }
        }
    }
    found.sort();
    found
}

/// Where the service's code names the crate whose library is `lib` (a
/// dependency's key with `-` as `_`): the first of `sources` (path, text)
/// that has `lib::...` as a path root, `use lib`, `extern crate lib`,
/// `#[lib::...]` or `lib::macro!`.
pub(crate) fn first_use_of_crate(sources: &[(String, String)], lib: &str) -> Option<Named> {
    let lib = lib.replace('-', "_");
    sources.iter().find_map(|(path, text)| {
        crate_named_in(text, &lib).map(|line| Named {
            path: path.clone(),
            line,
        })
    })
}

/// The first line of `text` that names the crate `lib` (see
/// [`first_use_of_crate`]).
pub(crate) fn crate_named_in(text: &str, lib: &str) -> Option<usize> {
    let text = without_line_comments(text);
    path_roots(&text, lib)
        .into_iter()
        .find(|&at| {
            let rest = text[at + lib.len()..].trim_start();
            rest.starts_with("::") || is_used_as_a_whole(&text[..at], rest)
        })
        .map(|at| line_of(&text, at))
}

/// Whether a crate name at the end of `before` and followed by `rest` is
/// named as a whole: `use lib;`, `use lib as x;`, `extern crate lib`.
fn is_used_as_a_whole(before: &str, rest: &str) -> bool {
    let before = before.trim_end();
    let after_use = before.ends_with("use") || before.ends_with("crate");
    let word_before = before
        .rsplit(|c: char| !is_ident_char(c))
        .next()
        .unwrap_or_default();
    after_use
        && matches!(word_before, "use" | "crate")
        && (rest.starts_with(';') || rest.starts_with("as ") || rest.starts_with(','))
}

/// The byte offsets in `text` where the identifier `root` starts a path:
/// not preceded by an identifier's character, nor by `::` after one (a
/// module of that name inside another path). `$crate` counts as `crate`.
fn path_roots(text: &str, root: &str) -> Vec<usize> {
    let mut found = Vec::new();
    if root.is_empty() {
        return found;
    }
    let mut from = 0;
    while let Some(pos) = text[from..].find(root) {
        let at = from + pos;
        from = at + root.len();
        let before = &text[..at];
        let after = &text[at + root.len()..];
        if before.ends_with(is_ident_char) || after.starts_with(is_ident_char) {
            continue;
        }
        if let Some(head) = before.strip_suffix("::")
            && head.trim_end().ends_with(is_ident_char)
        {
            continue;
        }
        found.push(at);
    }
    found
}

/// The first identifier of each item of a `use` group whose `{` was just
/// read (`config::{self, X}, outbox as o` gives `config`, `outbox`), with
/// its byte offset in `group`. Only the group's own level is read.
fn group_heads(group: &str) -> Vec<(usize, &str)> {
    let mut heads = Vec::new();
    let mut depth = 0usize;
    let mut expect_item = true;
    for (at, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => expect_item = true,
            c if depth == 0 && expect_item && !c.is_whitespace() => {
                expect_item = false;
                heads.push((at, identifier(&group[at..])));
            }
            _ => {}
        }
    }
    heads
}

/// The identifier at the start of `text` (empty when there is none).
fn identifier(text: &str) -> &str {
    let end = text.find(|c: char| !is_ident_char(c)).unwrap_or(text.len());
    &text[..end]
}

fn compat_module(name: &str) -> Option<&'static str> {
    COMPAT_MODULES.iter().copied().find(|m| *m == name)
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The line, from 1, of the byte offset `at`.
fn line_of(text: &str, at: usize) -> usize {
    text[..at].matches('\n').count() + 1
}

/// `text` with plain `//` comments blanked out (doc comments, `///` and
/// `//!`, are kept: their examples compile as doctests). Blanking keeps
/// every offset and line where it was. A `//` inside a string literal
/// (`"redis://..."`) is not a comment.
fn without_line_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        match plain_comment_start(line) {
            Some(at) => {
                out.push_str(&line[..at]);
                out.extend(
                    line[at..]
                        .chars()
                        .map(|c| if c == '\n' { '\n' } else { ' ' }),
                );
            }
            None => out.push_str(line),
        }
    }
    out
}

/// Where a plain `//` comment starts in `line`, outside string literals.
fn plain_comment_start(line: &str) -> Option<usize> {
    let bytes = line.as_bytes();
    let mut in_string = false;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if in_string => i += 1,
            // A character literal: `'"'` opens no string.
            b'\'' if !in_string && bytes.get(i + 2) == Some(&b'\'') => i += 2,
            b'"' => in_string = !in_string,
            b'/' if !in_string && bytes.get(i + 1) == Some(&b'/') => {
                let doc = matches!(bytes.get(i + 2), Some(b'/' | b'!'))
                    && bytes.get(i + 3) != Some(&b'/');
                return (!doc).then_some(i);
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// The kit modules that `src/lib.rs` re-exports for code that `used`
/// them, with the kit's features on (`worker`, `seaorm`): those of
/// [`REEXPORTABLE_KIT_MODULES`] whose feature is on.
pub(crate) fn reexported(used: &[&str], worker: bool, seaorm: bool) -> Vec<&'static str> {
    REEXPORTABLE_KIT_MODULES
        .iter()
        .copied()
        .filter(|m| used.contains(m))
        .filter(|m| worker || !WORKER_MODULES.contains(m))
        .filter(|m| seaorm || !SEAORM_MODULES.contains(m))
        .collect()
}

/// The re-export lines of `modules` as rustfmt writes them: one `pub use`
/// for the modules of every project, one for the worker's and one for
/// SeaORM's, separated by blank lines. Empty when there are none.
pub(crate) fn reexport_lines(modules: &[&str]) -> String {
    let groups = [
        modules
            .iter()
            .copied()
            .filter(|m| !WORKER_MODULES.contains(m) && !SEAORM_MODULES.contains(m))
            .collect::<Vec<_>>(),
        modules
            .iter()
            .copied()
            .filter(|m| WORKER_MODULES.contains(m))
            .collect(),
        modules
            .iter()
            .copied()
            .filter(|m| SEAORM_MODULES.contains(m))
            .collect(),
    ];
    let uses: Vec<String> = groups
        .into_iter()
        .filter(|g| !g.is_empty())
        .map(|mut group| {
            group.sort_unstable();
            use_line(&group)
        })
        .collect();
    uses.join("\n\n")
}

/// `pub use kit::...;` of `modules` (sorted), wrapped at 100 columns as
/// rustfmt does.
fn use_line(modules: &[&str]) -> String {
    if let [one] = modules {
        return format!("pub use kit::{one};");
    }
    let line = format!("pub use kit::{{{}}};", modules.join(", "));
    if line.len() <= 100 {
        return line;
    }
    let mut out = String::from("pub use kit::{\n");
    let mut current = String::new();
    for module in modules {
        let item = format!("{module},");
        if !current.is_empty() && 4 + current.len() + 1 + item.len() > 100 {
            out.push_str(&format!("    {current}\n"));
            current.clear();
        }
        if !current.is_empty() {
            current.push(' ');
        }
        current.push_str(&item);
    }
    out.push_str(&format!("    {current}\n}};"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources(files: &[(&str, &str)]) -> Vec<(String, String)> {
        files
            .iter()
            .map(|(p, t)| (p.to_string(), t.to_string()))
            .collect()
    }

    fn modules(text: &str) -> Vec<&'static str> {
        compat_modules_in(text, "shop_api")
            .into_iter()
            .map(|(_, m)| m)
            .collect()
    }

    #[test]
    fn finds_the_modules_named_through_the_crate_root() {
        assert_eq!(modules("use crate::outbox::Relay;\n"), ["outbox"]);
        assert_eq!(modules("let c = shop_api::config::load();\n"), ["config"]);
        assert_eq!(
            modules("fn f(x: &$crate::database::Pool) {}\n"),
            ["database"]
        );
        assert_eq!(modules("use crate :: signals;\n"), ["signals"]);
        // The service's own modules, and the kit's paths, are not the
        // compatibility re-exports.
        assert!(modules("use crate::startup::AppState;\nuse kit::config;\n").is_empty());
        assert!(modules("use other::shop_api::config;\n").is_empty());
        assert!(modules("use my_crate::config;\n").is_empty());
        assert!(modules("use crate::configs::X;\n").is_empty());
        // A plain comment compiles as it is; a doc comment's example does not.
        assert!(modules("// crate::outbox was here\n").is_empty());
        assert_eq!(modules("/// See [`crate::outbox`].\n"), ["outbox"]);
    }

    #[test]
    fn finds_the_modules_of_grouped_uses() {
        let text =
            "use crate::{\n    config::{self, Config},\n    routes,\n    outbox as ob,\n};\n";
        assert_eq!(
            compat_modules_in(text, "shop_api"),
            [(2, "config"), (4, "outbox")]
        );
        assert_eq!(
            modules("use shop_api::{startup::Application, worker::{self, run}, queue};\n"),
            ["queue", "worker"]
        );
        // Only the group's own level: `database` here is a module of `config`.
        assert_eq!(modules("use crate::{config::{database, X}};\n"), ["config"]);
    }

    #[test]
    fn every_place_that_names_a_module_is_listed() {
        let found = compat_modules_named(
            &sources(&[
                ("src/a.rs", "use crate::routes;\n\nuse crate::outbox::X;\n"),
                (
                    "tests/b.rs",
                    "use shop_api::outbox;\nuse shop_api::queue::Y;\nuse shop_api::{queue, outbox::Z};\n",
                ),
            ]),
            "shop_api",
        );
        let named = |path: &str, line| Named {
            path: path.to_string(),
            line,
        };
        assert_eq!(
            found.into_iter().collect::<Vec<_>>(),
            [
                (
                    "outbox",
                    vec![
                        named("src/a.rs", 3),
                        named("tests/b.rs", 1),
                        named("tests/b.rs", 3)
                    ]
                ),
                (
                    "queue",
                    vec![named("tests/b.rs", 2), named("tests/b.rs", 3)]
                ),
            ]
        );
    }

    #[test]
    fn finds_a_crate_in_every_form_code_names_it() {
        for text in [
            "use redis::AsyncCommands;\n",
            "let c = redis::Client::open(url)?;\n",
            "let c = ::redis::Client::open(url)?;\n",
            "use redis;\n",
            "use redis as r;\n",
            "pub use redis;\n",
            "extern crate redis;\n",
            "#[redis::attr]\nfn f() {}\n",
            "let x = redis::cmd!(\"GET\");\n",
            "use {redis::Client, std::fmt};\n",
            "/// ```\n/// let c = redis::Client::open(\"redis://x\");\n/// ```\n",
        ] {
            assert!(crate_named_in(text, "redis").is_some(), "{text}");
        }
        for text in [
            "let url = \"redis://localhost:6379\";\n",
            "// redis::Client was here\n",
            "use kit::redis::Client;\n",
            "use my_redis::Client;\n",
            "let redis = 1;\n",
            "fn redis() {}\n",
            "use crate::redis_pool;\n",
        ] {
            assert_eq!(crate_named_in(text, "redis"), None, "{text}");
        }
        assert_eq!(
            crate_named_in("fn main() {}\n\n#[tokio::main]\n", "tokio"),
            Some(3)
        );
    }

    #[test]
    fn a_dependency_key_is_matched_by_its_library_name() {
        let code = sources(&[
            ("src/lib.rs", "pub mod x;\n"),
            ("src/entities.rs", "\nuse sea_orm::entity::prelude::*;\n"),
        ]);
        assert_eq!(
            first_use_of_crate(&code, "sea-orm"),
            Some(Named {
                path: "src/entities.rs".into(),
                line: 2
            })
        );
        assert_eq!(first_use_of_crate(&code, "tokio-util"), None);
    }

    #[test]
    fn reexports_only_what_the_kit_lets_a_project_keep() {
        // `queue` went private in set 15: never re-exported again.
        assert_eq!(
            reexported(&["outbox", "queue", "orm", "routes", "worker"], true, false),
            ["outbox", "worker"]
        );
        assert_eq!(
            reexported(&["outbox", "queue", "orm"], false, true),
            ["outbox", "orm"]
        );
        for module in REEXPORTABLE_KIT_MODULES {
            assert!(COMPAT_MODULES.contains(module), "{module}");
        }
    }

    #[test]
    fn reexport_lines_are_formatted_as_rustfmt_writes_them() {
        assert_eq!(reexport_lines(&[]), "");
        assert_eq!(reexport_lines(&["outbox"]), "pub use kit::outbox;");
        assert_eq!(
            reexport_lines(&["outbox", "config", "worker", "queue", "orm"]),
            "pub use kit::{config, outbox};\n\npub use kit::{queue, worker};\n\npub use kit::orm;"
        );
        let all: Vec<&str> = COMPAT_MODULES.to_vec();
        assert_eq!(
            reexport_lines(&all),
            "pub use kit::{\n    config, database, dispatch, env_file, migrate, outbox, signals, \
             telemetry, trace_context,\n};\n\npub use kit::{operations, queue, scheduler, worker};\
             \n\npub use kit::orm;"
        );
    }
}
