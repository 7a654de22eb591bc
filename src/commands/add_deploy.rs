//! `gpkit add deploy`: the container files in an existing project.

use std::process::ExitCode;

use anyhow::Result;

use super::Context;
use crate::engine::reconcile::Options;

pub(crate) fn run(ctx: &Context) -> Result<ExitCode> {
    let (project, _lock) = ctx.open_project("gpkit add deploy", false)?;
    if project.manifest.components.deploy {
        eprintln!("The container files are already there; nothing to do.");
        return Ok(ExitCode::SUCCESS);
    }
    let mut components = project.manifest.components.clone();
    components.deploy = true;
    if !super::add_components(
        ctx,
        &project,
        components,
        &Options::default(),
        "gpkit add deploy",
    )? {
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
        "\nThe container files are added. Build and run everything with `docker compose up --build`."
    );
    Ok(ExitCode::SUCCESS)
}
