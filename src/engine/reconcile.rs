//! Bringing an existing project to a desired blueprint tree, file by file,
//! without losing a user's edit.
//!
//! For each file, with base = what gpkit last wrote, ours = the file on
//! disk and theirs = what the templates render now:
//! - kit-owned: ours = base → take theirs; theirs = base → keep ours; both
//!   changed → 3-way merge (conflict markers where the changes overlap);
//! - user-owned: only managed regions and `Cargo.toml`'s kit entries change;
//! - a kit file the user deleted stays deleted unless restoring is asked for;
//! - a file the templates dropped is deleted only if the user never changed it;
//! - a new template file never overwrites a file the user already has;
//! - a kit file that moved into the kit crate (`src/queue/x.rs` to
//!   `kit/src/queue/x.rs`, template set 5) is reconciled from its old place
//!   and written to its new one, the user's edits merged in;
//! - a kit file that the kit dropped but the user's code still declares
//!   (`blueprint::NOW_USERS`) becomes the user's, kept as it is.

use std::collections::BTreeMap;
use std::fmt;

use anyhow::Result;
use diffy::{ConflictStyle, MergeOptions};

use crate::domain::{api_changes, kit_api};
use crate::engine::blueprint::{self, KIT_DIR, NOW_USERS, TEMPLATE_SET_VERSION, Tests, Tree};
use crate::engine::manifest::{Components, Owner};
use crate::engine::project::Project;
use crate::engine::{cargo_toml, line_endings, project_path, regions, user_code};

/// What happened, or will happen, to one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Already as the templates want it.
    UpToDate,
    /// New in the templates; created.
    Created,
    /// Unchanged by the user; replaced by the templates' version.
    Updated,
    /// Changed by both; merged without conflict.
    Merged,
    /// Changed by the user only; kept.
    Kept,
    /// Changed by both where the changes overlap; written with conflict markers.
    Conflicted,
    /// Still holds the conflict markers of an earlier run; left alone.
    Unresolved,
    /// Dropped by the templates and unchanged by the user; deleted.
    Deleted,
    /// Deleted by the user; left deleted.
    DeletedByUser,
    /// Dropped by the templates but changed by the user; kept.
    KeptRemoved,
    /// A file the user already has stands where the templates want a new file.
    Blocked,
    /// A managed region is gone or was edited by hand; nothing written.
    RegionProblem(String),
    /// Moved into the kit crate as it was, from the old place it names.
    Moved(String),
    /// The old place of a file moved into the kit crate; reported at the new.
    MovedAway,
    /// A kit file that the kit dropped but the user's code declares: now
    /// the user's, kept.
    NowYours,
}

impl Outcome {
    /// Whether the file needs the user's attention before (or after) the
    /// change can be called done.
    pub(crate) fn is_conflict(&self) -> bool {
        matches!(
            self,
            Outcome::Conflicted
                | Outcome::Unresolved
                | Outcome::Blocked
                | Outcome::RegionProblem(_)
        )
    }

    /// The report's word for this outcome.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            Outcome::UpToDate => "up to date",
            Outcome::Created => "created",
            Outcome::Updated => "updated",
            Outcome::Merged => "merged",
            Outcome::Kept => "kept",
            Outcome::Conflicted => "conflicted",
            Outcome::Unresolved => "conflicted (markers remain)",
            Outcome::Deleted => "deleted",
            Outcome::DeletedByUser => "deleted by you",
            Outcome::KeptRemoved => "kept (no longer in the kit)",
            Outcome::Blocked => "conflicted (file exists)",
            Outcome::RegionProblem(_) => "conflicted (region)",
            Outcome::Moved(_) => "moved",
            Outcome::MovedAway => "moved away",
            Outcome::NowYours => "kept (now yours)",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// The decision for one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileChange {
    pub(crate) path: String,
    pub(crate) owner: Owner,
    pub(crate) outcome: Outcome,
    /// The file as it was read when deciding; `None` when it is missing.
    pub(crate) current: Option<Vec<u8>>,
    /// gpkit's base copy under `.gpkit/base/` (LF) as it was read when
    /// deciding; `None` when there is none (the base is regenerated from the
    /// released kits, or missing).
    pub(crate) old_base: Option<Vec<u8>>,
    /// The file's new content; `None` when the file is left as it is or deleted.
    pub(crate) write: Option<Vec<u8>>,
    /// Whether the file is deleted from disk.
    pub(crate) delete: bool,
    /// The new base (what the templates render now); `None` drops the record.
    /// It is kept as a copy unless gpkit can regenerate it.
    pub(crate) base: Option<Vec<u8>>,
    /// Why a user-owned file was not changed as the templates wanted.
    pub(crate) notes: Vec<String>,
}

/// Options of a reconciliation.
#[derive(Debug, Clone, Default)]
pub(crate) struct Options {
    /// Recreate kit files the user deleted.
    pub(crate) restore_deleted: bool,
    /// Kit files to recreate even without `restore_deleted` (a component's
    /// essentials, such as the outbox migration for the worker).
    pub(crate) required: Vec<String>,
}

/// The kit files of `desired` that the project has at an old place: new
/// path to old path. A kit file moves when the kit became a crate
/// (`src/queue/broker.rs` to `kit/src/queue/broker.rs`), and when a module
/// of the kit becomes a folder (`kit/src/queue/consumer.rs` to
/// `kit/src/queue/consumer/mod.rs`) and the user edited the module file:
/// the edits are merged into the folder's `mod.rs` (with conflict markers
/// where the code went to another file of the folder) instead of staying
/// beside it, where the crate would not build with the module in two
/// places. An unedited module file is deleted like any file the kit no
/// longer has.
fn moves(project: &Project, desired: &Tree) -> Result<BTreeMap<String, String>> {
    let mut moves = BTreeMap::new();
    for path in desired.iter().filter_map(|(path, file)| {
        (file.owner == Owner::Kit && !project.manifest.files.contains_key(path)).then_some(path)
    }) {
        for old in old_places(path) {
            let recorded = project
                .manifest
                .files
                .get(&old)
                .is_some_and(|record| record.owner == Owner::Kit);
            if !recorded || desired.contains_key(&old) {
                continue;
            }
            // Into the crate (`src/` to `kit/src/`) always; within it, only
            // to carry the user's edits.
            if !old.starts_with(&format!("{KIT_DIR}/")) || edited(project, &old)? {
                moves.insert(path.clone(), old);
            }
            break;
        }
    }
    Ok(moves)
}

/// Whether the user changed the kit file at `path` since gpkit wrote it
/// (a file with no known base counts as changed).
fn edited(project: &Project, path: &str) -> Result<bool> {
    let Some(current) = project.current(path)? else {
        return Ok(false);
    };
    let base = Bases::read(project, path)?.base;
    Ok(base.as_deref() != Some(line_endings::to_lf(current).as_slice()))
}

/// Where the kit file at `path` may have been before, most recent first:
/// the module file of a folder's `mod.rs` (in the crate, then in the
/// service's `src/` of the sets before the crate), and the same path in
/// the service's `src/`.
fn old_places(path: &str) -> Vec<String> {
    let Some(rest) = path.strip_prefix(&format!("{KIT_DIR}/src/")) else {
        return Vec::new();
    };
    let mut places = Vec::new();
    if let Some(module) = rest.strip_suffix("/mod.rs") {
        places.push(format!("{KIT_DIR}/src/{module}.rs"));
        places.push(format!("src/{module}.rs"));
    }
    places.push(format!("src/{rest}"));
    places
}

/// What `gpkit add` and `gpkit upgrade templates` do to `project` to give
/// it `components`: the decision for every file
/// ([`reconcile`]) against the blueprint whose `src/lib.rs`
/// keeps the compatibility re-exports that the project's code uses once
/// those decisions are applied.
pub(crate) fn for_components(
    project: &Project,
    components: &Components,
    options: &Options,
) -> Result<Vec<FileChange>> {
    let answers = &project.manifest.answers;
    let tests = Tests::Since(&project.manifest);
    // The re-exports change `src/lib.rs` only, which names none of them:
    // the other files come out the same with or without them.
    let plain = blueprint::render(answers, components, tests, &[])?;
    let changes = reconcile(project, &plain, options)?;
    let code = user_code::sources_after(project, &plain, &edits(&changes))?;
    let kept = user_code::kept_compat_modules(project, &code, components.worker)?;
    if kept.is_empty() {
        return Ok(changes);
    }
    let desired = blueprint::render(answers, components, tests, &kept)?;
    reconcile(project, &desired, options)
}

/// What `changes` do to each file, as [`user_code`] reads them.
fn edits(changes: &[FileChange]) -> Vec<user_code::Edit<'_>> {
    changes
        .iter()
        .map(|change| user_code::Edit {
            path: &change.path,
            write: change.write.as_deref(),
            delete: change.delete,
        })
        .collect()
}

/// Decides, for every file of the project and of `desired`, what to do.
pub(crate) fn reconcile(
    project: &Project,
    desired: &Tree,
    options: &Options,
) -> Result<Vec<FileChange>> {
    let moves = moves(project, desired)?;
    let carry = ApiCarry::new(project)?;
    // `Cargo.toml` is merged last, with the service's code as the other
    // changes leave it: where it is in `changes`, and its inputs.
    let mut manifest_merge = None;
    let mut changes = Vec::new();
    for (path, file) in desired {
        // A moved file is read, and its base found, at its old place.
        let from = moves.get(path).map(String::as_str).unwrap_or(path);
        // Compared and merged with LF line endings; a CRLF file stays CRLF.
        let current = project.current(from)?;
        let crlf = current.as_deref().is_some_and(line_endings::is_crlf);
        let ours = current.clone().map(line_endings::to_lf);
        let bases = Bases::read(project, from)?;
        let recorded = project.manifest.files.contains_key(from);
        let theirs = file.contents.clone();
        if let Some(from) = moves.get(path) {
            changes.extend(move_into_kit(
                from, path, current, ours, bases, theirs, crlf,
            ));
            continue;
        }
        let Bases { copy, base } = bases;
        let mut change = FileChange {
            path: path.clone(),
            owner: file.owner,
            outcome: Outcome::UpToDate,
            current,
            old_base: copy,
            write: None,
            delete: false,
            base: Some(theirs.clone()),
            notes: Vec::new(),
        };
        match (ours, recorded) {
            (None, false) => {
                change.outcome = Outcome::Created;
                change.write = Some(theirs);
            }
            (None, true) => {
                if options.restore_deleted || options.required.contains(path) {
                    change.outcome = Outcome::Created;
                    change.write = Some(theirs);
                } else {
                    change.outcome = Outcome::DeletedByUser;
                }
            }
            (Some(ours), false) => {
                change.outcome = if ours == theirs {
                    Outcome::UpToDate
                } else {
                    Outcome::Blocked
                };
                if ours != theirs {
                    change.base = None;
                }
            }
            (Some(ours), true) => match file.owner {
                Owner::Kit => merge_kit_file(&mut change, base, ours, theirs),
                // A kit file that is now the user's (the binaries, set 5;
                // the service's tests, set 6) gets the kit's changes one last
                // time, merged as a kit file.
                Owner::User if project.manifest.files[path].owner == Owner::Kit => {
                    merge_kit_file(&mut change, base, ours, theirs)
                }
                Owner::User if path == CARGO_TOML => {
                    manifest_merge = Some((changes.len(), base, ours, theirs, crlf));
                }
                Owner::User => merge_user_file(&mut change, base, ours, theirs, &[])?,
            },
        }
        if file.owner == Owner::User && carry.applies() {
            carry.apply(&mut change);
        }
        if crlf {
            change.write = change.write.map(|text| line_endings::to_crlf(&text));
        }
        changes.push(change);
    }
    let moved_from: Vec<&String> = moves.values().collect();
    for path in project
        .manifest
        .files
        .keys()
        .filter(|p| !desired.contains_key(*p) && !moved_from.contains(p))
    {
        let owner = project.manifest.files[path].owner;
        let ours = project.current(path)?;
        let Bases { copy, base } = Bases::read(project, path)?;
        let (outcome, delete) = match &ours.clone().map(line_endings::to_lf) {
            None => (Outcome::Deleted, false),
            Some(_) if owner == Owner::Kit && NOW_USERS.contains(&path.as_str()) => {
                (Outcome::NowYours, false)
            }
            Some(ours) if Some(ours) == base.as_ref() && owner == Owner::Kit => {
                (Outcome::Deleted, true)
            }
            Some(_) => (Outcome::KeptRemoved, false),
        };
        changes.push(FileChange {
            path: path.clone(),
            owner,
            outcome,
            current: ours,
            old_base: copy,
            write: None,
            delete,
            base: None,
            notes: Vec::new(),
        });
    }
    if carry.applies() {
        changes.extend(carry_users_own_sources(project, desired, &carry)?);
    }
    if let Some((at, base, ours, theirs, crlf)) = manifest_merge {
        let code = user_code::sources_after(project, desired, &edits(&changes))?;
        let change = &mut changes[at];
        merge_user_file(change, base, ours, theirs, &code)?;
        if crlf {
            change.write = change.write.take().map(|text| line_endings::to_crlf(&text));
        }
    }
    Ok(changes)
}

/// The service's manifest, merged entry by entry ([`cargo_toml`]).
const CARGO_TOML: &str = "Cargo.toml";

/// The user's own Rust files (under `src/` and `tests/`, written by the
/// user or by `--example`, not recorded by gpkit), carried across the
/// kit's API changes of set 6; only those it changes or has a note for.
fn carry_users_own_sources(
    project: &Project,
    desired: &Tree,
    carry: &ApiCarry,
) -> Result<Vec<FileChange>> {
    let mut changes = Vec::new();
    for dir in ["src", "tests"] {
        for path in project_path::rust_sources(&project.root, dir)? {
            if desired.contains_key(&path) || project.manifest.files.contains_key(&path) {
                continue;
            }
            let Some(current) = project.current(&path)? else {
                continue;
            };
            let crlf = line_endings::is_crlf(&current);
            let mut change = FileChange {
                path,
                owner: Owner::User,
                outcome: Outcome::Kept,
                current: Some(current),
                old_base: None,
                write: None,
                delete: false,
                base: None,
                notes: Vec::new(),
            };
            carry.apply(&mut change);
            if change.notes.is_empty() {
                continue;
            }
            if crlf {
                change.write = change.write.map(|text| line_endings::to_crlf(&text));
            }
            changes.push(change);
        }
    }
    Ok(changes)
}

/// What gpkit last wrote to one file, both with LF line endings.
struct Bases {
    /// Its base copy on disk, under `.gpkit/base/`.
    copy: Option<Vec<u8>>,
    /// The base to compare and merge with: that copy, or else the bytes
    /// gpkit regenerates from the manifest's hash.
    base: Option<Vec<u8>>,
}

impl Bases {
    fn read(project: &Project, path: &str) -> Result<Self> {
        let copy = project.base_copy(path)?.map(line_endings::to_lf);
        let base = match &copy {
            Some(copy) => Some(copy.clone()),
            None => project.regenerated_base(path),
        };
        Ok(Self { copy, base })
    }
}

/// A kit file read at its old place `from` and written to `to`: the old
/// place goes, the file (the user's edits merged with the kit's changes)
/// is written at the new one. A file the user had deleted comes back, since
/// the kit crate does not build without it.
fn move_into_kit(
    from: &str,
    to: &str,
    current: Option<Vec<u8>>,
    ours: Option<Vec<u8>>,
    Bases { copy, base }: Bases,
    theirs: Vec<u8>,
    crlf: bool,
) -> [FileChange; 2] {
    let mut change = FileChange {
        path: to.to_string(),
        owner: Owner::Kit,
        outcome: Outcome::Created,
        current: None,
        old_base: None,
        write: None,
        delete: false,
        base: Some(theirs.clone()),
        notes: vec![format!("moved from {from}")],
    };
    match ours {
        None => {
            change.notes = vec![format!("you had deleted {from}; the kit crate needs it")];
            change.write = Some(theirs);
        }
        Some(ours) => {
            merge_kit_file(&mut change, base.clone(), ours.clone(), theirs);
            if change.outcome == Outcome::UpToDate {
                change.outcome = Outcome::Moved(from.to_string());
            }
            if change.write.is_none() {
                change.write = Some(ours);
            }
        }
    }
    if crlf {
        change.write = change.write.map(|text| line_endings::to_crlf(&text));
    }
    let old = FileChange {
        path: from.to_string(),
        owner: Owner::Kit,
        outcome: Outcome::MovedAway,
        delete: current.is_some(),
        current,
        old_base: copy,
        write: None,
        base: None,
        notes: vec![format!("now {to}")],
    };
    [change, old]
}

fn merge_kit_file(change: &mut FileChange, base: Option<Vec<u8>>, ours: Vec<u8>, theirs: Vec<u8>) {
    if has_conflict_markers(&ours) {
        // Merging again would bury the markers: the user resolves them first.
        change.outcome = Outcome::Unresolved;
        change.base = base.or(Some(theirs));
        return;
    }
    if ours == theirs {
        change.outcome = Outcome::UpToDate;
    } else if base.as_ref() == Some(&ours) {
        change.outcome = Outcome::Updated;
        change.write = Some(theirs);
    } else if base.as_ref() == Some(&theirs) {
        change.outcome = Outcome::Kept;
    } else {
        let base = base.unwrap_or_default();
        let (merged, clean) = merge3(&base, &ours, &theirs);
        change.outcome = if clean {
            Outcome::Merged
        } else {
            Outcome::Conflicted
        };
        change.write = Some(merged);
    }
}

fn merge_user_file(
    change: &mut FileChange,
    base: Option<Vec<u8>>,
    ours: Vec<u8>,
    theirs: Vec<u8>,
    // The service's code, for `Cargo.toml`: which dependencies it names.
    code: &[(String, String)],
) -> Result<()> {
    let base = String::from_utf8_lossy(&base.unwrap_or_default()).into_owned();
    let ours_text = String::from_utf8_lossy(&ours).into_owned();
    let theirs_text = String::from_utf8_lossy(&theirs).into_owned();
    let merged = if change.path == CARGO_TOML {
        let merged = cargo_toml::merge(&base, &ours_text, &theirs_text, code)?;
        change.notes = merged.notes;
        merged.text
    } else if regions::has_regions(&theirs_text) {
        match regions::merge(&base, &ours_text, &theirs_text)? {
            Ok(text) => text,
            Err(problems) => {
                let explained: Vec<String> =
                    problems.iter().map(|p| p.explain(&change.path)).collect();
                change.outcome = Outcome::RegionProblem(explained.join("\n"));
                // Keep the old base: the region still holds gpkit's old lines.
                change.base = Some(base.into_bytes());
                return Ok(());
            }
        }
    } else {
        ours_text.clone()
    };
    if merged == ours_text {
        change.outcome = if ours == theirs {
            Outcome::UpToDate
        } else {
            Outcome::Kept
        };
    } else {
        change.outcome = Outcome::Merged;
        change.write = Some(merged.into_bytes());
    }
    Ok(())
}

/// What carries the service's own code across the kit's API changes from
/// the project's template set to this gpkit's: set 6's and set 15's
/// rewrites ([`api_changes`]) and the changes `kit_api_changes.toml` declares
/// ([`kit_api`]), seen through the kit modules the project's `src/lib.rs`
/// re-exports.
struct ApiCarry {
    from: u32,
    declared: Vec<kit_api::Change>,
    roots: kit_api::Roots,
}

impl ApiCarry {
    fn new(project: &Project) -> Result<Self> {
        let from = project.manifest.gpkit.template_set;
        let lib_rs = project.current("src/lib.rs")?.unwrap_or_default();
        Ok(Self {
            from,
            declared: kit_api::between(from, TEMPLATE_SET_VERSION),
            roots: kit_api::Roots {
                crate_name: project.manifest.answers.name.replace('-', "_"),
                reexported: kit_api::reexported_modules(&String::from_utf8_lossy(&lib_rs)),
            },
        })
    }

    /// Whether the project meets any change.
    fn applies(&self) -> bool {
        self.from < api_changes::SET_15 || !self.declared.is_empty()
    }

    /// Carries a user's Rust file across the changes: the lines rewritten
    /// and those to change by hand are the change's notes.
    fn apply(&self, change: &mut FileChange) {
        if !change.path.ends_with(".rs") || change.outcome.is_conflict() {
            return;
        }
        let Some(text) = change.write.clone().or_else(|| change.current.clone()) else {
            return;
        };
        let text = String::from_utf8_lossy(&line_endings::to_lf(text)).into_owned();
        let mut carried = text.clone();
        if self.from < api_changes::SET_6 {
            let to_6 = api_changes::carry_to_set_6(&carried);
            push_notes(change, &to_6.notes, api_changes::SET_6);
            carried = to_6.text;
        }
        if self.from < api_changes::SET_15 {
            let to_15 = api_changes::carry_to_set_15(&carried);
            push_notes(change, &to_15.notes, api_changes::SET_15);
            carried = to_15.text;
        }
        // Set by set, oldest first, so that each note names the set that
        // made its change.
        let mut sets: Vec<u32> = self.declared.iter().map(|c| c.set).collect();
        sets.sort_unstable();
        sets.dedup();
        for set in sets {
            let of_set: Vec<_> = self
                .declared
                .iter()
                .filter(|c| c.set == set)
                .cloned()
                .collect();
            let declared = kit_api::carry(&carried, &of_set, &self.roots);
            push_notes(change, &declared.notes, set);
            carried = declared.text;
        }
        if carried != text {
            change.write = Some(carried.into_bytes());
            change.outcome = Outcome::Merged;
        }
    }
}

/// `notes` as lines of the change's report, under the API of template set
/// `set`.
fn push_notes(change: &mut FileChange, notes: &[api_changes::LineNote], set: u32) {
    for note in notes {
        let what = if note.rewritten {
            "rewritten"
        } else {
            "to change"
        };
        change.notes.push(format!(
            "line {} {what} (API of template set {set}): {}",
            note.line, note.text
        ));
    }
}

/// Whether `text` holds the conflict markers [`merge3`] writes.
pub(crate) fn has_conflict_markers(text: &[u8]) -> bool {
    let text = String::from_utf8_lossy(text);
    let mut lines = text.lines();
    lines.any(|l| l == "<<<<<<< ours")
        && lines.any(|l| l == "=======")
        && lines.any(|l| l == ">>>>>>> theirs")
}

/// A line-based 3-way merge; overlapping changes get standard conflict
/// markers. Returns the text and whether it merged cleanly.
pub(crate) fn merge3(base: &[u8], ours: &[u8], theirs: &[u8]) -> (Vec<u8>, bool) {
    let mut options = MergeOptions::new();
    options.set_conflict_style(ConflictStyle::Merge);
    match options.merge_bytes(base, ours, theirs) {
        Ok(merged) => (merged, true),
        Err(conflicted) => (conflicted, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_changes_to_different_lines() {
        let base = b"a\nb\nc\nd\ne\n";
        let ours = b"a\nB\nc\nd\ne\n";
        let theirs = b"a\nb\nc\nd\nE\n";
        assert_eq!(
            merge3(base, ours, theirs),
            (b"a\nB\nc\nd\nE\n".to_vec(), true)
        );
    }

    #[test]
    fn overlapping_changes_get_conflict_markers() {
        let (text, clean) = merge3(b"a\nb\nc\n", b"a\nours\nc\n", b"a\ntheirs\nc\n");
        assert!(!clean);
        assert!(has_conflict_markers(&text));
        assert!(!has_conflict_markers(b"a\n=======\nb\n"));
        assert_eq!(
            String::from_utf8(text).unwrap(),
            "a\n<<<<<<< ours\nours\n=======\ntheirs\n>>>>>>> theirs\nc\n"
        );
    }

    #[test]
    fn a_folders_mod_rs_was_its_module_file_before() {
        assert_eq!(
            old_places("kit/src/queue/consumer/mod.rs"),
            [
                "kit/src/queue/consumer.rs",
                "src/queue/consumer.rs",
                "src/queue/consumer/mod.rs"
            ]
        );
        assert_eq!(old_places("kit/src/telemetry.rs"), ["src/telemetry.rs"]);
        assert!(old_places("migrations/20200101000100_outbox.sql").is_empty());
    }
}
