//! The service's own Rust code, read for what it names
//! ([`crate::domain::code_uses`] has the rules): which compatibility
//! re-exports of the kit's modules its `src/lib.rs` keeps, and which
//! dependencies of its `Cargo.toml` an upgrade may drop.
//!
//! The code is every `.rs` file of the service package: under `src/`,
//! `tests/`, `benches/` and `examples/`, and `build.rs`; never the kit's
//! (`kit/`), which has a manifest of its own, nor a kit file of template
//! sets 1-4 still under `src/` (the upgrade moves it into `kit/`). It is
//! read as the upgrade leaves it: a file of the user's that gets gpkit's
//! changes one last time (the binaries of sets 1-4) or is carried to a new
//! API is read at its new text.

use std::collections::BTreeMap;

use anyhow::Result;

use crate::domain::code_uses;
use crate::domain::names::PackageName;
use crate::engine::blueprint::{NOW_USERS, Tree};
use crate::engine::manifest::{DataLayer, Owner};
use crate::engine::project::Project;
use crate::engine::{line_endings, project_path};

/// The folders whose Rust files are the service's code.
const SOURCE_DIRS: &[&str] = &["src", "tests", "benches", "examples"];

/// The service's build script, also its code.
const BUILD_SCRIPT: &str = "build.rs";

/// Whether `path` is where the service's code lives (not whether it is the
/// user's: see [`is_kits`]).
fn is_code_path(path: &str) -> bool {
    path == BUILD_SCRIPT
        || path.ends_with(".rs")
            && SOURCE_DIRS
                .iter()
                .any(|dir| path.strip_prefix(dir).is_some_and(|p| p.starts_with('/')))
}

/// Whether the file at `path` is the kit's, not the service's code: the
/// manifest records it as the kit's, and `desired` (the blueprint the
/// project is brought to) does not make it the user's (as it does the
/// binaries and tests of older sets), nor does the user's code still
/// declare it ([`NOW_USERS`]). A kit file of sets 1-4 under `src/` is one.
fn is_kits(project: &Project, desired: &Tree, path: &str) -> bool {
    project
        .manifest
        .files
        .get(path)
        .is_some_and(|record| record.owner == Owner::Kit)
        && !NOW_USERS.contains(&path)
        && desired
            .get(path)
            .is_none_or(|file| file.owner != Owner::User)
}

/// The service's Rust files as they are on disk: path and text (LF),
/// sorted by path; the kit's left out ([`is_kits`]).
pub(crate) fn sources(project: &Project, desired: &Tree) -> Result<Vec<(String, String)>> {
    let mut paths = Vec::new();
    for dir in SOURCE_DIRS {
        paths.extend(project_path::rust_sources(&project.root, dir)?);
    }
    paths.push(BUILD_SCRIPT.to_string());
    let mut sources = Vec::new();
    for path in paths {
        if is_kits(project, desired, &path) {
            continue;
        }
        let Some(bytes) = project.current(&path)? else {
            continue;
        };
        let text = String::from_utf8_lossy(&line_endings::to_lf(bytes)).into_owned();
        sources.push((path, text));
    }
    sources.sort();
    Ok(sources)
}

/// What a planned change does to one file: the bytes it writes, or that it
/// deletes the file (neither: the file stays as it is).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Edit<'a> {
    pub(crate) path: &'a str,
    pub(crate) write: Option<&'a [u8]>,
    pub(crate) delete: bool,
}

/// The service's Rust files as `edits` leave them: [`sources`], with each
/// file an edit writes at its new text, and without those it deletes.
pub(crate) fn sources_after(
    project: &Project,
    desired: &Tree,
    edits: &[Edit<'_>],
) -> Result<Vec<(String, String)>> {
    let mut files: BTreeMap<String, String> = sources(project, desired)?.into_iter().collect();
    for edit in edits {
        if !is_code_path(edit.path) || is_kits(project, desired, edit.path) {
            continue;
        }
        if edit.delete {
            files.remove(edit.path);
        } else if let Some(text) = edit.write {
            let text = String::from_utf8_lossy(&line_endings::to_lf(text.to_vec())).into_owned();
            files.insert(edit.path.to_string(), text);
        }
    }
    Ok(files.into_iter().collect())
}

/// The compatibility modules that `code` (path, text) of `project` uses
/// through its `src/lib.rs` (`crate::outbox`, `shop::config`) and that
/// `src/lib.rs` may keep re-exporting with the kit's features of `worker`
/// and the answers' data layer. (The lines that name a module it cannot
/// keep are reported by the upgrade's API carry, `domain::kit_api`.)
pub(crate) fn kept_compat_modules(
    project: &Project,
    code: &[(String, String)],
    worker: bool,
) -> Result<Vec<&'static str>> {
    let crate_name = PackageName::parse(&project.manifest.answers.name)?.crate_name();
    let used = code_uses::compat_modules_named(code, &crate_name);
    let names: Vec<&str> = used.keys().copied().collect();
    let seaorm = project.manifest.answers.db == DataLayer::SeaOrm;
    Ok(code_uses::reexported(&names, worker, seaorm))
}
