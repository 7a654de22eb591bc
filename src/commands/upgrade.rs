//! `gpkit upgrade templates`: the kit's files brought up to the current
//! templates by 3-way merges, with a report of what happened to each file.

use std::path::Path;
use std::process::{Command, ExitCode};

use anyhow::{Result, bail};
use serde::Serialize;

use super::Context;
use crate::cli::{ReportFormat, UpgradeArgs};
use crate::engine::blueprint::{self, TEMPLATE_SET_VERSION};
use crate::engine::manifest::Owner;
use crate::engine::plan::{Action, Plan};
use crate::engine::reconcile::{FileChange, Options, Outcome};
use crate::engine::{reconcile, update};

/// Exit code of `--check` when an upgrade is available.
const EXIT_AVAILABLE: u8 = 2;
/// Exit code when conflicts were left in files.
const EXIT_CONFLICTS: u8 = 3;

/// The report, also printed as JSON with `--format json`.
#[derive(Debug, Serialize)]
struct Report {
    /// `up to date`, `available` (with `--check` or `--dry-run`),
    /// `upgraded` or `conflicts`.
    status: &'static str,
    from_template_set: u32,
    to_template_set: u32,
    files: Vec<FileReport>,
}

#[derive(Debug, Serialize)]
struct FileReport {
    path: String,
    owner: Owner,
    outcome: &'static str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    notes: Vec<String>,
}

pub(crate) fn run(ctx: &Context, args: UpgradeArgs) -> Result<ExitCode> {
    let (project, _lock) = ctx.open_project("gpkit upgrade templates", args.check)?;
    let options = Options {
        restore_deleted: args.restore_deleted,
        ..Options::default()
    };
    let changes = reconcile::for_components(&project, &project.manifest.components, &options)?;
    let plan = update::plan(&project, &changes, project.manifest.components.clone())?;
    let conflicts = changes.iter().any(|c| c.outcome.is_conflict());

    let writes = !plan.is_empty() && !args.check && !ctx.dry_run;
    let status = match (plan.is_empty(), writes, conflicts) {
        (true, _, true) => "conflicts",
        (true, _, false) => "up to date",
        (false, false, _) => "available",
        (false, true, true) => "conflicts",
        (false, true, false) => "upgraded",
    };
    let report = Report {
        status,
        from_template_set: project.manifest.gpkit.template_set,
        to_template_set: TEMPLATE_SET_VERSION,
        files: changes.iter().map(file_report).collect(),
    };

    if writes {
        if !args.allow_dirty {
            refuse_uncommitted_changes(&project.root, &plan)?;
        }
        plan.apply_in_place(&project.root)?;
    }
    match args.format {
        ReportFormat::Json => super::print_out(&(serde_json::to_string_pretty(&report)? + "\n"))?,
        ReportFormat::Text => {
            if ctx.dry_run || ctx.diff {
                super::print_out(&format!(
                    "Plan for `gpkit upgrade templates`:
{}",
                    plan.render(ctx.diff)
                ))?;
            }
            super::print_out(&text_report(&report, &changes))?;
        }
    }

    Ok(ExitCode::from(match status {
        "available" if args.check => EXIT_AVAILABLE,
        "conflicts" => EXIT_CONFLICTS,
        _ => 0,
    }))
}

fn file_report(change: &FileChange) -> FileReport {
    let mut notes = change.notes.clone();
    if let Outcome::RegionProblem(explained) = &change.outcome {
        notes.push(explained.clone());
    }
    FileReport {
        path: change.path.clone(),
        owner: change.owner,
        outcome: change.outcome.label(),
        notes,
    }
}

fn text_report(report: &Report, changes: &[FileChange]) -> String {
    let mut out = String::new();
    let heading = match report.status {
        "up to date" => format!("Up to date with template set {}.\n", report.to_template_set),
        "available" => format!(
            "An upgrade from template set {} to {} is available; nothing was written.\n",
            report.from_template_set, report.to_template_set
        ),
        "conflicts" if !changes.iter().any(|c| c.write.is_some() || c.delete) => {
            "Nothing new to upgrade, but conflicts remain to resolve:\n".to_string()
        }
        "conflicts" => "Upgraded, with conflicts to resolve:\n".to_string(),
        _ => format!(
            "Upgraded from template set {} to {}.\n",
            report.from_template_set, report.to_template_set
        ),
    };
    out.push_str(&heading);
    let kit_replaced = unmodified_kit_replaced(changes);
    let listed: Vec<&FileChange> = changes
        .iter()
        .filter(|c| !matches!(c.outcome, Outcome::UpToDate | Outcome::MovedAway))
        .filter(|c| kit_replaced.is_none() || !in_kit(c))
        .collect();
    let width = listed
        .iter()
        .map(|c| c.outcome.label().len())
        .chain(kit_replaced.as_ref().map(|_| REPLACED.len()))
        .max()
        .unwrap_or(0);
    if let Some(summary) = &kit_replaced {
        out.push_str(&format!(
            "  {REPLACED:<width$}  {}/ ({summary})\n",
            blueprint::KIT_DIR
        ));
    }
    for change in &listed {
        let hint = match change.outcome {
            Outcome::Conflicted => " (resolve the <<<<<<< markers)",
            Outcome::DeletedByUser => " (left deleted; --restore-deleted brings it back)",
            Outcome::Blocked => " (a file of yours is where a new kit file goes; move it away)",
            Outcome::KeptRemoved => " (you changed it, so it was kept)",
            _ => "",
        };
        // A file moved as it was is one line: where from, where to.
        if let Outcome::Moved(from) = &change.outcome {
            out.push_str(&format!(
                "  {:<width$}  {from} -> {}\n",
                change.outcome.label(),
                change.path
            ));
            continue;
        }
        out.push_str(&format!(
            "  {:<width$}  {}{hint}\n",
            change.outcome.label(),
            change.path
        ));
        for note in &change.notes {
            out.push_str(&format!("  {:<width$}    note: {note}\n", ""));
        }
        if let Outcome::RegionProblem(explained) = &change.outcome {
            for line in explained.lines() {
                out.push_str(&format!("  {:<width$}    {line}\n", ""));
            }
        }
    }
    let current = changes
        .iter()
        .filter(|c| c.outcome == Outcome::UpToDate)
        .count();
    if !listed.is_empty() && current > 0 {
        out.push_str(&format!("  ({current} other files up to date)\n"));
    }
    out
}

/// Whether the change is to a file of the kit crate, `kit/`.
fn in_kit(change: &FileChange) -> bool {
    change
        .path
        .strip_prefix(blueprint::KIT_DIR)
        .is_some_and(|rest| rest.starts_with('/'))
}

/// The report's word for a kit replaced as a whole.
const REPLACED: &str = "replaced";

/// When the user changed nothing in `kit/` and the upgrade changes it, the
/// kit is replaced as a unit, reported in one line: how many of its files
/// were updated, created and deleted. `None` for a patched kit (each file
/// is reported) or one with nothing new.
fn unmodified_kit_replaced(changes: &[FileChange]) -> Option<String> {
    let kit: Vec<&FileChange> = changes.iter().filter(|c| in_kit(c)).collect();
    let unmodified = kit.iter().all(|c| {
        matches!(
            c.outcome,
            Outcome::UpToDate | Outcome::Updated | Outcome::Created | Outcome::Deleted
        )
    });
    let count = |outcome: Outcome| kit.iter().filter(|c| c.outcome == outcome).count();
    let (updated, created, deleted) = (
        count(Outcome::Updated),
        count(Outcome::Created),
        count(Outcome::Deleted),
    );
    (unmodified && updated + created + deleted > 0)
        .then(|| format!("unmodified: {updated} updated, {created} created, {deleted} deleted"))
}

/// Inside a git work tree, refuses to touch files with uncommitted changes:
/// the user could not tell gpkit's changes from their own.
fn refuse_uncommitted_changes(root: &Path, plan: &Plan) -> Result<()> {
    let inside = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["rev-parse", "--is-inside-work-tree"])
        .output();
    let Ok(inside) = inside else {
        return Ok(()); // no git on this machine
    };
    if !inside.status.success() {
        return Ok(());
    }
    let paths: Vec<&str> = plan
        .changes
        .iter()
        .filter(|c| !matches!(c.action, Action::Create { .. }))
        .map(|c| c.path.as_str())
        .collect();
    if paths.is_empty() {
        return Ok(());
    }
    let status = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["status", "--porcelain", "--"])
        .args(&paths)
        .output()?;
    let dirty = String::from_utf8_lossy(&status.stdout);
    if !dirty.trim().is_empty() {
        bail!(
            "these files have uncommitted changes, and the upgrade would change them; nothing was written:\n{}\
             help: commit or stash them first (so the upgrade's changes can be reviewed on their own), \
             or pass --allow-dirty",
            dirty
                .lines()
                .map(|l| format!("  {l}\n"))
                .collect::<String>()
        );
    }
    Ok(())
}
