//! Structural updates of a project's `Cargo.toml` with toml_edit: the kit's
//! dependencies and binaries are added, bumped or removed, while the user's
//! own dependencies, comments, order and formatting stay as they were.
//!
//! The rule for each kit-managed entry, with base = what gpkit last wrote,
//! ours = the file now, theirs = what the templates render now: an entry the
//! user never changed follows the templates; an entry the user changed or
//! removed is left alone and reported. A dependency the templates no longer
//! list (the kit's own, now only in `kit/Cargo.toml`) is removed only when
//! no code of the service names it; either way the report says so, with the
//! file that uses it when it is kept.

use anyhow::{Context, Result};
use toml_edit::{ArrayOfTables, DocumentMut, Item, Table};

use crate::domain::code_uses;

/// The `[package]` keys gpkit manages: what the generated code needs of
/// the compiler. The package's name, version and the rest are the user's.
const PACKAGE_KEYS: &[&str] = &["edition", "rust-version"];

/// The dependency tables gpkit manages entries in.
const DEPENDENCY_TABLES: &[&str] = &["dependencies", "dev-dependencies", "build-dependencies"];

/// The merged manifest, and notes on entries left as the user had them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Merged {
    pub(crate) text: String,
    pub(crate) notes: Vec<String>,
}

/// Merges the kit's changes (base → theirs) into `ours`. `code` is the
/// service's own Rust code (path, text), which decides whether a
/// dependency the templates dropped stays.
pub(crate) fn merge(
    base: &str,
    ours: &str,
    theirs: &str,
    code: &[(String, String)],
) -> Result<Merged> {
    let base: DocumentMut = base
        .parse()
        .context("gpkit's base copy of Cargo.toml does not parse")?;
    let theirs: DocumentMut = theirs
        .parse()
        .context("the rendered Cargo.toml does not parse")?;
    let mut doc: DocumentMut = ours
        .parse()
        .context("`Cargo.toml` is not valid TOML; fix it before running gpkit")?;
    let mut notes = Vec::new();
    for table in DEPENDENCY_TABLES {
        merge_table(&base, &mut doc, &theirs, table, code, &mut notes);
    }
    merge_bins(&base, &mut doc, &theirs, &mut notes);
    merge_package_keys(&base, &mut doc, &theirs, &mut notes);
    merge_workspace_members(&mut doc, &theirs, &mut notes);
    Ok(Merged {
        text: doc.to_string(),
        notes,
    })
}

fn table<'a>(doc: &'a DocumentMut, name: &str) -> Option<&'a Table> {
    doc.get(name).and_then(Item::as_table)
}

/// An entry's value without its surrounding whitespace and comments.
fn normalized(item: &Item) -> String {
    let mut item = item.clone();
    if let Some(value) = item.as_value_mut() {
        value.decor_mut().clear();
    }
    item.to_string().trim().to_string()
}

fn is_sorted(table: &Table) -> bool {
    let keys: Vec<&str> = table.iter().map(|(k, _)| k).collect();
    keys.windows(2).all(|w| w[0] <= w[1])
}

fn merge_table(
    base: &DocumentMut,
    doc: &mut DocumentMut,
    theirs: &DocumentMut,
    name: &str,
    code: &[(String, String)],
    notes: &mut Vec<String>,
) {
    let empty = Table::new();
    let base_table = table(base, name).unwrap_or(&empty);
    let Some(theirs_table) = table(theirs, name) else {
        // The kit has no entries here now: remove those it wrote, unchanged,
        // that no code uses.
        if let Some(ours) = doc.get_mut(name).and_then(Item::as_table_mut) {
            for (key, old) in base_table.iter() {
                if ours
                    .get(key)
                    .is_some_and(|item| normalized(item) == normalized(old))
                {
                    drop_unless_used(ours, name, key, code, notes);
                }
            }
        }
        return;
    };
    if doc.get(name).is_none() {
        doc.insert(name, Item::Table(Table::new()));
    }
    let Some(ours) = doc.get_mut(name).and_then(Item::as_table_mut) else {
        notes.push(format!("[{name}] is not a table; left as it is"));
        return;
    };
    let was_sorted = is_sorted(ours);
    for (key, wanted) in theirs_table.iter() {
        let old = base_table.get(key);
        match (ours.get(key), old) {
            (None, None) => {
                ours.insert(key, wanted.clone());
            }
            (None, Some(_)) => notes.push(format!("[{name}] `{key}`: you removed it; left out")),
            (Some(current), _) if normalized(current) == normalized(wanted) => {}
            (Some(current), Some(old)) if normalized(current) == normalized(old) => {
                let decor = current.as_value().map(|v| v.decor().clone());
                let mut new = wanted.clone();
                if let (Some(decor), Some(value)) = (decor, new.as_value_mut()) {
                    *value.decor_mut() = decor;
                }
                ours.insert(key, new);
            }
            (Some(_), _) => notes.push(format!(
                "[{name}] `{key}`: you changed it; kept yours (gpkit's is `{}`)",
                normalized(wanted)
            )),
        }
    }
    for (key, old) in base_table.iter() {
        if theirs_table.contains_key(key) {
            continue;
        }
        match ours.get(key) {
            Some(current) if normalized(current) == normalized(old) => {
                drop_unless_used(ours, name, key, code, notes);
            }
            Some(_) => notes.push(format!(
                "[{name}] `{key}`: no longer needed by the kit; kept your version"
            )),
            None => {}
        }
    }
    if was_sorted {
        ours.sort_values();
    }
}

/// Removes the dependency `key` that gpkit wrote to the table `name` and
/// no longer lists, unless the service's `code` names it: then it stays,
/// the user's from now on. Either is one note of the report.
fn drop_unless_used(
    ours: &mut Table,
    name: &str,
    key: &str,
    code: &[(String, String)],
    notes: &mut Vec<String>,
) {
    match code_uses::first_use_of_crate(code, key) {
        Some(named) => notes.push(format!(
            "[{name}] `{key}`: kept, now yours: {named} uses it (gpkit no longer lists it)"
        )),
        None => {
            ours.remove(key);
            notes.push(format!(
                "[{name}] `{key}`: removed: no code of yours uses it (the kit's dependencies \
                 are in kit/Cargo.toml)"
            ));
        }
    }
}

/// The kit's `[package]` keys follow the templates unless the user changed
/// or removed them.
fn merge_package_keys(
    base: &DocumentMut,
    doc: &mut DocumentMut,
    theirs: &DocumentMut,
    notes: &mut Vec<String>,
) {
    let Some(ours) = doc.get_mut("package").and_then(Item::as_table_mut) else {
        return;
    };
    for key in PACKAGE_KEYS {
        let old = table(base, "package").and_then(|t| t.get(key));
        let wanted = table(theirs, "package").and_then(|t| t.get(key));
        let current = ours.get(key);
        let same = |a: Option<&Item>, b: Option<&Item>| a.map(normalized) == b.map(normalized);
        if same(current, wanted) {
            continue;
        }
        if !same(current, old) {
            if current.is_none() {
                notes.push(format!("[package] `{key}`: you removed it; left out"));
            } else if let Some(wanted) = wanted {
                notes.push(format!(
                    "[package] `{key}`: you changed it; kept yours (gpkit's is `{}`)",
                    normalized(wanted)
                ));
            }
            continue;
        }
        match wanted {
            Some(wanted) => {
                let decor = current
                    .and_then(|c| c.as_value())
                    .map(|v| v.decor().clone());
                let mut new = wanted.clone();
                if let (Some(decor), Some(value)) = (decor, new.as_value_mut()) {
                    *value.decor_mut() = decor;
                }
                ours.insert(key, new);
            }
            None => {
                ours.remove(key);
            }
        }
    }
}

/// The kit crate is a workspace member: the `[workspace]` table is added
/// when the manifest has none, and the kit's members are added to one the
/// user already has. The rest of the table is the user's.
fn merge_workspace_members(doc: &mut DocumentMut, theirs: &DocumentMut, notes: &mut Vec<String>) {
    let Some(wanted) = table(theirs, "workspace") else {
        return;
    };
    let Some(ours) = doc.get_mut("workspace") else {
        // Right after `[package]`, as a new project has it: the tables
        // after it move one place down.
        let mut wanted = wanted.clone();
        let after = doc
            .get("package")
            .and_then(Item::as_table)
            .and_then(Table::position)
            .unwrap_or_default();
        for (_, item) in doc.as_table_mut().iter_mut() {
            let tables: Vec<&mut Table> = match item {
                Item::Table(table) => vec![table],
                Item::ArrayOfTables(array) => array.iter_mut().collect(),
                _ => Vec::new(),
            };
            for table in tables {
                if let Some(position) = table.position().filter(|p| *p > after) {
                    table.set_position(position + 1);
                }
            }
        }
        wanted.set_position(after + 1);
        doc.insert("workspace", Item::Table(wanted));
        return;
    };
    let Some(ours) = ours.as_table_mut() else {
        notes.push("`workspace` is not a table; the kit's members left out".into());
        return;
    };
    let wanted_members = wanted
        .get("members")
        .and_then(Item::as_array)
        .into_iter()
        .flatten()
        .filter_map(|m| m.as_str());
    let members = ours
        .entry("members")
        .or_insert(toml_edit::value(toml_edit::Array::new()));
    let Some(members) = members.as_array_mut() else {
        notes.push("[workspace] `members` is not an array; the kit's members left out".into());
        return;
    };
    for member in wanted_members {
        if !members.iter().any(|m| m.as_str() == Some(member)) {
            members.push(member);
        }
    }
}

fn bins(doc: &DocumentMut) -> Option<&ArrayOfTables> {
    doc.get("bin").and_then(Item::as_array_of_tables)
}

fn bin_name(table: &Table) -> Option<&str> {
    table.get("name").and_then(Item::as_str)
}

fn merge_bins(
    base: &DocumentMut,
    doc: &mut DocumentMut,
    theirs: &DocumentMut,
    notes: &mut Vec<String>,
) {
    let base_names: Vec<&str> = bins(base)
        .into_iter()
        .flatten()
        .filter_map(bin_name)
        .collect();
    let wanted: Vec<Table> = bins(theirs).into_iter().flatten().cloned().collect();
    let wanted_names: Vec<&str> = wanted.iter().filter_map(bin_name).collect();
    if doc.get("bin").is_none() && !wanted.is_empty() {
        doc.insert("bin", Item::ArrayOfTables(ArrayOfTables::new()));
    }
    let Some(ours) = doc.get_mut("bin").and_then(Item::as_array_of_tables_mut) else {
        notes.push("`bin` is not an array of tables; binaries left as they are".into());
        return;
    };
    for bin in &wanted {
        let name = bin_name(bin).unwrap_or_default();
        let present = ours.iter().any(|t| bin_name(t) == Some(name));
        if !present && base_names.contains(&name) {
            notes.push(format!("[[bin]] `{name}`: you removed it; left out"));
        } else if !present {
            // Next to the last binary, not wherever the template had it:
            // toml_edit orders tables by position, and a tie keeps the
            // array's order.
            let mut bin = bin.clone();
            if let Some(last) = ours.iter().filter_map(Table::position).max() {
                bin.set_position(last);
            }
            ours.push(bin);
        }
    }
    let removed: Vec<&str> = base_names
        .iter()
        .copied()
        .filter(|n| !wanted_names.contains(n))
        .collect();
    ours.retain(|t| !bin_name(t).is_some_and(|n| removed.contains(&n)));
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"[package]
name = "shop"

[[bin]]
name = "server"
path = "src/bin/server.rs"

[dependencies]
anyhow = "1"
serde = { version = "1", features = ["derive"] }
tokio = "1"
"#;

    const THEIRS: &str = r#"[package]
name = "shop"

[[bin]]
name = "server"
path = "src/bin/server.rs"

[[bin]]
name = "worker"
path = "src/bin/worker.rs"

[dependencies]
anyhow = "1"
redis = "1"
serde = { version = "1.0.200", features = ["derive"] }
tokio = "1"
"#;

    #[test]
    fn preserves_comments_order_and_the_users_own_dependencies() {
        let ours = r#"[package]
name = "shop"

[[bin]]
name = "server"
path = "src/bin/server.rs"

[dependencies]
# errors everywhere
anyhow = "1"
serde = { version = "1", features = ["derive"] } # serialisation
tokio = "1"
# ours: money maths
rust_decimal = "1.36"
"#;
        let merged = merge(BASE, ours, THEIRS, &[]).unwrap();
        assert_eq!(
            merged.text,
            r#"[package]
name = "shop"

[[bin]]
name = "server"
path = "src/bin/server.rs"

[[bin]]
name = "worker"
path = "src/bin/worker.rs"

[dependencies]
# errors everywhere
anyhow = "1"
serde = { version = "1.0.200", features = ["derive"] } # serialisation
tokio = "1"
# ours: money maths
rust_decimal = "1.36"
redis = "1"
"#
        );
        assert!(merged.notes.is_empty(), "{:?}", merged.notes);
    }

    #[test]
    fn the_kits_package_keys_follow_the_templates_unless_the_user_changed_them() {
        let base = "[package]\nname = \"shop\"\nedition = \"2024\"\npublish = false\n";
        let theirs = "[package]\nname = \"shop\"\nedition = \"2024\"\nrust-version = \"1.89\"\n";
        let merged = merge(base, base, theirs, &[]).unwrap();
        assert!(
            merged.text.contains("rust-version = \"1.89\""),
            "{}",
            merged.text
        );
        assert!(
            merged.text.contains("publish = false"),
            "the user's key stays"
        );

        let ours = base.replace("edition = \"2024\"", "edition = \"2021\"");
        let theirs = theirs.replace("edition = \"2024\"", "edition = \"2027\"");
        let merged = merge(base, &ours, &theirs, &[]).unwrap();
        assert!(merged.text.contains("edition = \"2021\""));
        assert!(
            merged.notes.contains(
                &"[package] `edition`: you changed it; kept yours (gpkit's is `\"2027\"`)"
                    .to_string()
            ),
            "{:?}",
            merged.notes
        );
    }

    #[test]
    fn a_sorted_table_stays_sorted() {
        let merged = merge(BASE, BASE, THEIRS, &[]).unwrap();
        let deps = merged.text.split("[dependencies]").nth(1).unwrap();
        assert_eq!(
            deps.lines()
                .filter(|l| !l.is_empty())
                .map(|l| l.split(' ').next().unwrap())
                .collect::<Vec<_>>(),
            ["anyhow", "redis", "serde", "tokio"]
        );
    }

    #[test]
    fn a_dependency_the_user_changed_is_kept_and_reported() {
        let ours = BASE.replace(
            r#"serde = { version = "1", features = ["derive"] }"#,
            r#"serde = { version = "1", features = ["derive", "rc"] }"#,
        );
        let merged = merge(BASE, &ours, THEIRS, &[]).unwrap();
        assert!(merged.text.contains(r#"features = ["derive", "rc"]"#));
        assert!(
            merged.notes[0].contains("`serde`: you changed it; kept yours"),
            "{:?}",
            merged.notes
        );
    }

    #[test]
    fn a_dependency_the_user_removed_stays_removed() {
        let ours = BASE.replace("tokio = \"1\"\n", "");
        let merged = merge(BASE, &ours, THEIRS, &[]).unwrap();
        assert!(!merged.text.contains("tokio"));
        assert!(
            merged.notes[0].contains("`tokio`: you removed it"),
            "{:?}",
            merged.notes
        );
    }

    #[test]
    fn dependencies_the_kit_dropped_are_removed_when_unchanged() {
        let merged = merge(THEIRS, THEIRS, BASE, &[]).unwrap();
        assert!(!merged.text.contains("redis"));
        assert!(!merged.text.contains("worker"));
        assert_eq!(merged.text.matches("[[bin]]").count(), 1);
    }

    #[test]
    fn new_binaries_follow_the_last_binary_not_the_dependencies() {
        let theirs = THEIRS.replace(
            "[dependencies]",
            "[[bin]]\nname = \"outbox\"\npath = \"src/bin/outbox.rs\"\n\n[dependencies]",
        );
        let merged = merge(BASE, BASE, &theirs, &[]).unwrap();
        let bins: Vec<&str> = merged
            .text
            .lines()
            .filter_map(|l| l.strip_prefix("name = "))
            .collect();
        assert_eq!(bins, ["\"shop\"", "\"server\"", "\"worker\"", "\"outbox\""]);
        assert!(
            merged.text.find("outbox").unwrap() < merged.text.find("[dependencies]").unwrap(),
            "{}",
            merged.text
        );
    }

    #[test]
    fn the_kits_workspace_is_added_or_joined() {
        let theirs = "[package]\nname = \"shop\"\n\n[workspace]\nmembers = [\"kit\"]\n\n\
                      [dependencies]\nanyhow = \"1\"\n";
        let ours = "[package]\nname = \"shop\"\n\n[dependencies]\nanyhow = \"1\"\n";
        let merged = merge(ours, ours, theirs, &[]).unwrap();
        assert_eq!(
            merged.text,
            "[package]\nname = \"shop\"\n\n[workspace]\nmembers = [\"kit\"]\n\n\
             [dependencies]\nanyhow = \"1\"\n"
        );
        let ours = "[package]\nname = \"shop\"\n\n[workspace]\nmembers = [\"tools\"]\n\n\
                    [dependencies]\nanyhow = \"1\"\n";
        let merged = merge(ours, ours, theirs, &[]).unwrap();
        assert!(
            merged.text.contains("members = [\"tools\", \"kit\"]"),
            "{}",
            merged.text
        );
        assert_eq!(
            merge(ours, &merged.text, theirs, &[]).unwrap().text,
            merged.text
        );
    }

    fn code(files: &[(&str, &str)]) -> Vec<(String, String)> {
        files
            .iter()
            .map(|(p, t)| (p.to_string(), t.to_string()))
            .collect()
    }

    #[test]
    fn a_dropped_dependency_the_code_uses_is_kept_and_reported() {
        let code = code(&[
            ("src/lib.rs", "pub mod jobs;\n"),
            (
                "src/jobs.rs",
                "use std::fmt;\n\nuse redis::AsyncCommands;\n",
            ),
        ]);
        let merged = merge(THEIRS, THEIRS, BASE, &code).unwrap();
        assert!(merged.text.contains("redis = \"1\""), "{}", merged.text);
        assert_eq!(
            merged.notes,
            [
                "[dependencies] `redis`: kept, now yours: src/jobs.rs line 3 uses it (gpkit no \
              longer lists it)"
            ]
        );
        // Kept, it is the user's: the next upgrade leaves it alone.
        assert_eq!(
            merge(BASE, &merged.text, BASE, &[]).unwrap().text,
            merged.text
        );
    }

    #[test]
    fn a_dropped_dependency_no_code_uses_is_removed_and_reported() {
        let code = code(&[(
            "src/lib.rs",
            "// redis::Client, once\nlet url = \"redis://x\";\n",
        )]);
        let merged = merge(THEIRS, THEIRS, BASE, &code).unwrap();
        assert!(!merged.text.contains("redis"), "{}", merged.text);
        assert_eq!(
            merged.notes,
            [
                "[dependencies] `redis`: removed: no code of yours uses it (the kit's dependencies \
              are in kit/Cargo.toml)"
            ]
        );
    }

    #[test]
    fn a_dependency_of_the_users_own_is_never_removed() {
        // Not in the old template: the user's, whatever the code names.
        let ours = THEIRS.replace("tokio = \"1\"\n", "tokio = \"1\"\nrust_decimal = \"1\"\n");
        let merged = merge(THEIRS, &ours, BASE, &[]).unwrap();
        assert!(
            merged.text.contains("rust_decimal = \"1\""),
            "{}",
            merged.text
        );
        assert!(
            !merged.notes.iter().any(|n| n.contains("rust_decimal")),
            "{:?}",
            merged.notes
        );
        // A dropped one the user changed is kept as before, whatever the code.
        let ours = THEIRS.replace("redis = \"1\"", "redis = \"1.2\"");
        let merged = merge(THEIRS, &ours, BASE, &[]).unwrap();
        assert!(merged.text.contains("redis = \"1.2\""));
        assert_eq!(
            merged.notes,
            ["[dependencies] `redis`: no longer needed by the kit; kept your version"]
        );
    }

    #[test]
    fn a_dropped_table_keeps_the_dependencies_the_code_uses() {
        let base = "[package]\nname = \"shop\"\n\n[dependencies]\nanyhow = \"1\"\n\n\
                    [dev-dependencies]\nfake = \"2\"\npretty_assertions = \"1\"\n";
        let theirs = "[package]\nname = \"shop\"\n\n[dependencies]\nanyhow = \"1\"\n";
        let code = code(&[("tests/a.rs", "use pretty_assertions::assert_eq;\n")]);
        let merged = merge(base, base, theirs, &code).unwrap();
        assert!(merged.text.contains("pretty_assertions"), "{}", merged.text);
        assert!(!merged.text.contains("fake"), "{}", merged.text);
        let notes: Vec<&String> = merged
            .notes
            .iter()
            .filter(|n| n.starts_with("[dev-dependencies]"))
            .collect();
        assert_eq!(notes.len(), 2, "{:?}", merged.notes);
    }

    #[test]
    fn merging_twice_changes_nothing() {
        let once = merge(BASE, BASE, THEIRS, &[]).unwrap().text;
        assert_eq!(merge(THEIRS, &once, THEIRS, &[]).unwrap().text, once);
    }
}
