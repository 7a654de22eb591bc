//! `gpkit add worker`: the worker component in an existing project.

use std::process::ExitCode;

use anyhow::Result;

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

    super::refuse_conflicts(&changes, "gpkit add worker")?;

    let plan = update::plan(&project, &changes, components)?;
    if ctx.preview(&plan, "Plan for `gpkit add worker`")? {
        return Ok(ExitCode::SUCCESS);
    }
    plan.apply_in_place(&project.root)?;
    super::report_applied(&changes);
    eprintln!("\nThe worker is added. Run it with `cargo run --bin worker`.");
    Ok(ExitCode::SUCCESS)
}
