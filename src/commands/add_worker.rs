//! `gpkit add worker`: the worker component in an existing project.

use std::process::ExitCode;

use anyhow::Result;

use super::Context;
use crate::engine::blueprint::OUTBOX_MIGRATION;
use crate::engine::reconcile::Options;

pub(crate) fn run(ctx: &Context) -> Result<ExitCode> {
    let (project, _lock) = ctx.open_project("gpkit add worker", false)?;
    if project.manifest.components.worker {
        eprintln!("The worker is already there; nothing to do.");
        return Ok(ExitCode::SUCCESS);
    }
    let mut components = project.manifest.components.clone();
    components.worker = true;
    let options = Options {
        required: vec![OUTBOX_MIGRATION.to_string()],
        ..Options::default()
    };
    if !super::add_components(ctx, &project, components, &options, "gpkit add worker")? {
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!("\nThe worker is added. Run it with `cargo run --bin worker`.");
    Ok(ExitCode::SUCCESS)
}
