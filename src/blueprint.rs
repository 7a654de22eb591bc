//! The blueprint of a generated project: which files it has for a given set
//! of answers and components, who owns each, and their rendered content.
//!
//! Every command that writes kit files (`new project`, `add worker`,
//! `upgrade templates`) asks the blueprint for the desired tree and then
//! reconciles the disk with it, so there is exactly one definition of what a
//! project contains.

use std::collections::BTreeMap;

use anyhow::Result;
use minijinja::context;

use crate::manifest::{Answers, Components, Owner};
use crate::names::PackageName;
use crate::templates::{Renderer, template_set};

/// The version of the template set. Bump it whenever any rendered output
/// changes; a test compares the rendered snapshots against this number.
pub const TEMPLATE_SET_VERSION: u32 = 1;

/// The outbox migration, which the relay cannot work without.
pub const OUTBOX_MIGRATION: &str = "migrations/20200101000100_outbox.sql";

/// Files that are the user's from the moment they are written. gpkit never
/// rewrites them; it only edits managed regions and dependency tables.
/// Every other file of the template set is kit-owned.
const USER_OWNED: &[&str] = &[
    "Cargo.toml",
    "README.md",
    ".gitignore",
    "src/lib.rs",
    "src/startup.rs",
    "src/routes/mod.rs",
    "src/bin/server.rs",
    "src/listeners/mod.rs",
];

/// One file of the desired project tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlueprintFile {
    pub owner: Owner,
    pub contents: Vec<u8>,
    /// One line on what the file is for, shown in plans.
    pub purpose: String,
}

/// The desired tree: output path to file, sorted by path.
pub type Tree = BTreeMap<String, BlueprintFile>;

/// Renders the files that a project with `answers` and `components` has:
/// the `project` template set, plus the `worker` set when the worker is on.
/// Files shared by both (configuration, `lib.rs`, `Cargo.toml`) switch on
/// the `worker` variable.
pub fn render(answers: &Answers, components: &Components) -> Result<Tree> {
    let name = PackageName::parse(&answers.name)?;
    let ctx = context! {
        name => name.as_str(),
        crate_name => name.crate_name(),
        gpkit_version => env!("CARGO_PKG_VERSION"),
        worker => components.worker,
    };
    let renderer = Renderer::new();
    let mut tree = Tree::new();
    let mut sets = vec!["project"];
    if components.worker {
        sets.push("worker");
    }
    for set in sets {
        for file in template_set(set)? {
            let contents = renderer.render(&file, &ctx)?;
            let owner = if USER_OWNED.contains(&file.output) {
                Owner::User
            } else {
                Owner::Kit
            };
            let purpose = purpose(file.output, &contents);
            let previous = tree.insert(
                file.output.to_string(),
                BlueprintFile {
                    owner,
                    contents,
                    purpose,
                },
            );
            anyhow::ensure!(
                previous.is_none(),
                "template sets overlap at `{}` (this is a bug in gpkit)",
                file.output
            );
        }
    }
    Ok(tree)
}

/// A Rust file's purpose is the first line of its `//!` doc comment; other
/// files are described here.
fn purpose(path: &str, contents: &[u8]) -> String {
    if path.ends_with(".rs") {
        let text = String::from_utf8_lossy(contents);
        if let Some(line) = text.lines().find_map(|l| l.strip_prefix("//!")) {
            return line.trim().trim_end_matches('.').to_string();
        }
    }
    let known = match path {
        "Cargo.toml" => "the package manifest: binaries and dependencies",
        "README.md" => "how to configure, migrate and run the service",
        ".gitignore" => "keeps build output and local secrets out of git",
        ".env.example" => "every environment variable the service reads, with defaults",
        p if p.starts_with("migrations/") => "goose migration",
        _ => "project file",
    };
    known.to_string()
}
