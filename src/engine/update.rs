//! Turning reconciled file changes into a plan: the files to write or
//! delete, their new base copies, and the manifest that records them.
//! A base that gpkit regenerates from its released kits gets no copy, and
//! a run that changes the project deletes the copies that became redundant.

use anyhow::Result;

use crate::engine::blueprint::TEMPLATE_SET_VERSION;
use crate::engine::line_endings;
use crate::engine::manifest::{BASE_DIR, Components, FileRecord, MANIFEST_FILE, sha256_hex};
use crate::engine::plan::Plan;
use crate::engine::project::Project;
use crate::engine::reconcile::{FileChange, Outcome};

/// Why a base copy is deleted though the file is still recorded.
const REGENERATED: &str = "base copy no longer kept: gpkit regenerates it from its released kits";

/// The plan that applies `changes` to `project` and records `components`
/// and the current template set in the manifest.
pub(crate) fn plan(
    project: &Project,
    changes: &[FileChange],
    components: Components,
) -> Result<Plan> {
    let mut plan = Plan::new();
    let mut manifest = project.manifest.clone();
    // Base copies of bytes gpkit regenerates, deleted only along with a
    // change: they alone are no upgrade to report (or to fail `--check` on).
    let mut redundant = Vec::new();
    manifest.components = components;
    manifest.gpkit.version = env!("CARGO_PKG_VERSION").to_string();
    manifest.gpkit.template_set = TEMPLATE_SET_VERSION;

    for change in changes {
        let reason = reason(change);
        match (&change.write, &change.current) {
            (Some(new), Some(old)) => plan.update(&change.path, old.clone(), new.clone(), reason),
            (Some(new), None) => plan.create(&change.path, new.clone(), reason),
            (None, Some(old)) if change.delete => plan.delete(&change.path, old.clone(), reason),
            _ => {}
        }
        let base_path = format!("{BASE_DIR}/{}", change.path);
        let copy = change.old_base.clone();
        match &change.base {
            Some(base) => {
                manifest.files.insert(
                    change.path.clone(),
                    FileRecord {
                        owner: change.owner,
                        sha256: sha256_hex(base),
                    },
                );
                match copy {
                    // gpkit regenerates this base: a copy of other bytes
                    // goes now (it would be taken for the base), one of
                    // the same bytes with the rest of the change, if any.
                    Some(old) if project.regenerates(&change.path, base) => {
                        if &old == base {
                            redundant.push((base_path, old));
                        } else {
                            plan.delete(base_path, old, REGENERATED);
                        }
                    }
                    None if project.regenerates(&change.path, base) => {}
                    Some(old) => plan.update(base_path, old, base.clone(), "base copy"),
                    None => plan.create(base_path, base.clone(), "base copy"),
                }
            }
            None => {
                manifest.files.remove(&change.path);
                if let Some(old) = copy {
                    plan.delete(base_path, old, "base copy");
                }
            }
        }
    }

    // A project whose files are all current keeps its manifest as it is,
    // even when this gpkit's version string differs.
    let nothing_new = plan.is_empty()
        && manifest.components == project.manifest.components
        && manifest.files == project.manifest.files
        && manifest.gpkit.template_set == project.manifest.gpkit.template_set;
    if nothing_new {
        return Ok(plan);
    }
    for (path, old) in redundant {
        plan.delete(path, old, REGENERATED);
    }
    let old_manifest = project.current(MANIFEST_FILE)?.unwrap_or_default();
    let mut new_manifest = manifest.to_toml().into_bytes();
    if line_endings::is_crlf(&old_manifest) {
        new_manifest = line_endings::to_crlf(&new_manifest);
    }
    plan.update(
        MANIFEST_FILE,
        old_manifest,
        new_manifest,
        "records the components, template set and file bases",
    );
    Ok(plan)
}

fn reason(change: &FileChange) -> String {
    match &change.outcome {
        Outcome::Created if change.owner == crate::engine::manifest::Owner::User => {
            "new file, yours to edit (gpkit will not rewrite it)".into()
        }
        Outcome::Created => "new kit file".into(),
        Outcome::Updated => "kit file, unchanged by you: replaced with the current template".into(),
        Outcome::Merged if change.owner == crate::engine::manifest::Owner::User => {
            "your file: gpkit's managed entries updated, the rest kept".into()
        }
        Outcome::Merged => "kit file you edited: merged, your edits kept".into(),
        Outcome::Conflicted => "CONFLICT: overlapping edits, resolve the markers".into(),
        Outcome::Deleted => "no longer part of the kit, and unchanged by you".into(),
        Outcome::Moved(_) => "kit file moved into the kit crate, as it was".into(),
        Outcome::MovedAway => "moved into the kit crate (`kit/`)".into(),
        Outcome::NowYours => "no longer part of the kit: now yours, kept as it is".into(),
        other => other.label().into(),
    }
}
