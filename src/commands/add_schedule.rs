//! `gpkit add schedule <name>`: an event dispatched, or a job run, on every
//! tick of a timing spec, by the worker's scheduler.

use std::process::ExitCode;

use anyhow::{Result, bail};

use super::Context;
use crate::cli::AddScheduleArgs;
use crate::domain::events::EventNames;
use crate::domain::schedule::{self, ScheduleRecord};
use crate::engine::reconcile::Options;

pub(crate) fn run(ctx: &Context, args: AddScheduleArgs) -> Result<ExitCode> {
    let (project, _lock) = ctx.open_project("gpkit add schedule", false)?;
    schedule::check_name(&args.name)?;
    if let Some(zone) = &args.tz {
        schedule::parse_zone(zone)?;
    }
    if !project.manifest.components.worker {
        bail!(
            "schedules run in the worker, and this project has none; nothing was changed\n\
             help: run `gpkit add worker` first"
        );
    }
    let mut components = project.manifest.components.clone();
    if components.schedules.iter().any(|s| s.name == args.name) {
        bail!(
            "the schedule `{}` already exists (`src/schedules/{}.rs`); nothing was changed\n\
             help: choose another name, or change its timing in that file",
            args.name,
            args.name
        );
    }
    let event = match &args.event {
        None => None,
        Some(raw) => {
            let known = EventNames::recorded(raw).ok().and_then(|names| {
                components
                    .events
                    .iter()
                    .find(|e| EventNames::recorded(&e.name).is_ok_and(|n| n.module == names.module))
            });
            let Some(known) = known else {
                let existing: Vec<&str> =
                    components.events.iter().map(|e| e.name.as_str()).collect();
                let help = if existing.is_empty() {
                    format!("add it first with `gpkit add event {raw}`")
                } else {
                    format!(
                        "add it first with `gpkit add event {raw}`, or use one of: {}",
                        existing.join(", ")
                    )
                };
                bail!("this project has no event `{raw}`; nothing was changed\nhelp: {help}");
            };
            Some(known.name.clone())
        }
    };
    components.schedules.push(ScheduleRecord {
        name: args.name.clone(),
        cron: args.cron.as_str().to_string(),
        event: event.clone(),
        tz: args.tz.clone(),
        catch_up: args.catch_up,
    });

    let command = format!("gpkit add schedule {}", args.name);
    if !super::add_components(ctx, &project, components, &Options::default(), &command)? {
        return Ok(ExitCode::SUCCESS);
    }
    let what = match &event {
        Some(event) => format!("dispatches `{event}`"),
        None => format!("runs the job `job:{}`", args.name),
    };
    eprintln!(
        "\nAdded the schedule `{}`: it {what} on `{}`{}.",
        args.name,
        args.cron,
        args.tz
            .as_ref()
            .map(|zone| format!(" ({zone} time)"))
            .unwrap_or_default()
    );
    eprintln!(
        "Fill in `src/schedules/{}.rs`; the worker runs it (SCHEDULER_ENABLED).",
        args.name
    );
    Ok(ExitCode::SUCCESS)
}
