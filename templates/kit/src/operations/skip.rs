//! `outbox skip <task id>`: releases a key that an ordered listener holds
//! because its first run failed for good (archived, recorded in
//! `listener_failures`): the run leaves its key's order and the key's next
//! run goes to the queue. The archived task and its failure record stay, so
//! the event can still be looked at, or run again by hand (out of order).
//! Nothing else releases a held key: no timeout does.

use std::process::ExitCode;

use serde::Serialize;

use super::output::{self, Format};
use crate::follow::Context;
use crate::worker::ordering::Turn;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The id of the listener task to move past (`outbox show <event id>`
    /// and `outbox status` name it)
    pub task_id: String,
}

/// What was done (`--format json`).
#[derive(Debug, Clone, Serialize)]
struct Skipped {
    task_id: String,
    listener: String,
    key: String,
}

pub async fn run(context: &Context, args: &Args, format: Format) -> anyhow::Result<ExitCode> {
    let ordering = context.ordering().await?;
    let Some(run) = ordering.run_of(&args.task_id).await? else {
        anyhow::bail!(
            "task {} is not a run of an ordered listener waiting in its key's order; nothing was changed\n\
             help: `outbox show <event id>` lists an event's ordered runs",
            args.task_id
        );
    };
    if let Turn::After(runs) = ordering
        .turn(&run.listener, &run.key, &args.task_id)
        .await?
    {
        anyhow::bail!(
            "task {} is not the first of key `{}`: {runs} earlier run(s) come before it; nothing was changed\n\
             help: skip the first one, which holds the key",
            args.task_id,
            run.key
        );
    }
    ordering
        .advance(&run.listener, &run.key, &args.task_id)
        .await
        .map_err(|err| anyhow::anyhow!("{err}"))?;
    let skipped = Skipped {
        task_id: args.task_id.clone(),
        listener: run.listener,
        key: run.key,
    };
    match format {
        Format::Json => output::print_json(&skipped)?,
        Format::Text => println!(
            "skipped task {} of listener {}: key {} moves on to its next run",
            skipped.task_id, skipped.listener, skipped.key
        ),
    }
    Ok(ExitCode::SUCCESS)
}
