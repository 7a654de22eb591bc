//! `gpkit add worker`: the worker component in an existing project.

use std::process::ExitCode;

use anyhow::{Result, bail};

use super::Context;
use crate::blueprint::{self, OUTBOX_MIGRATION};
use crate::project::Project;
use crate::reconcile::{self, Options};
use crate::update;

pub fn run(ctx: &Context) -> Result<ExitCode> {
    let project = Project::open(&ctx.dir)?;
    if project.manifest.components.worker {
        eprintln!("The worker is already there; nothing to do.");
        return Ok(ExitCode::SUCCESS);
    }
    let mut components = project.manifest.components.clone();
    components.worker = true;
    let desired = blueprint::render(&project.manifest.answers, &components)?;
    let options = Options {
        required: vec![OUTBOX_MIGRATION.to_string()],
        ..Options::default()
    };
    let changes = reconcile::reconcile(&project, &desired, &options)?;

    let conflicts: Vec<String> = changes
        .iter()
        .filter(|c| c.outcome.is_conflict())
        .map(|c| match &c.outcome {
            reconcile::Outcome::RegionProblem(explained) => explained.clone(),
            other => format!("`{}`: {other}", c.path),
        })
        .collect();
    if !conflicts.is_empty() {
        bail!(
            "cannot add the worker without overwriting your changes; nothing was written:\n{}\n\
             help: resolve the files above (or move them away), then run `gpkit add worker` again",
            conflicts.join("\n")
        );
    }

    let plan = update::plan(&project, &changes, components)?;
    if ctx.preview(&plan, "Plan for `gpkit add worker`") {
        return Ok(ExitCode::SUCCESS);
    }
    plan.apply_in_place(&project.root)?;
    for change in changes.iter().filter(|c| c.write.is_some()) {
        eprintln!(
            "{:>12} {}",
            capitalised(change.outcome.label()),
            change.path
        );
    }
    for note in changes.iter().flat_map(|c| &c.notes) {
        eprintln!("note: {note}");
    }
    eprintln!("\nThe worker is added. Run it with `cargo run --bin worker`.");
    Ok(ExitCode::SUCCESS)
}

fn capitalised(word: &str) -> String {
    let mut chars = word.chars();
    chars
        .next()
        .map(|c| c.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}
