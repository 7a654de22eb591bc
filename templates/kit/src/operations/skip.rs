//! `outbox skip <task id>`: releases a key that an ordered listener holds
//! because its first run failed for good (archived, recorded in
//! `listener_failures`): the run leaves its key's order and the key's next
//! run goes to the queue. The archived task and its failure record stay (no
//! longer holding the key), so the event can still be looked at; sent back
//! (`outbox retry-archived`), the run joins its key's order at the end and
//! runs after the runs that wait then. Nothing else releases a held key: no
//! timeout does. A run that has not failed for good (waiting, running,
//! retried) is refused: skipping it would start the next run beside it.

use std::process::ExitCode;

use serde::Serialize;

use super::output::{self, Format};
use crate::follow::Context;
use crate::worker::failures;
use crate::worker::ordering::{End, Moved};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The id of the listener task to move past (`outbox show <event id>`
    /// and `outbox status` name it)
    pub(crate) task_id: String,
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
    if let Some(runs @ 1..) = ordering
        .position(&run.queue, &run.listener, &run.key, &args.task_id)
        .await?
    {
        anyhow::bail!(
            "task {} is not the first of key `{}`: {runs} earlier run(s) come before it; nothing was changed\n\
             help: skip the first one, which holds the key",
            args.task_id,
            run.key
        );
    }
    let failed: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM listener_failures WHERE task_id = $1)")
            .bind(&args.task_id)
            .fetch_one(&context.pool)
            .await?;
    if !failed {
        anyhow::bail!(
            "task {} has not failed for good (it waits, runs or is retried): skipping it would start \
             key `{}`'s next run beside it; nothing was changed\n\
             help: `outbox show <event id>` says where it stands",
            args.task_id,
            run.key
        );
    }
    let moved = ordering
        .move_on(
            &run.queue,
            &run.listener,
            &run.key,
            &args.task_id,
            None,
            End::Skip,
            None,
        )
        .await
        .map_err(|err| anyhow::anyhow!("{err}"))?;
    match moved {
        Moved::On => {}
        Moved::Superseded => anyhow::bail!(
            "task {} is no longer the first of key `{}` (it moved on meanwhile); nothing was changed",
            args.task_id,
            run.key
        ),
        Moved::NotFailed => anyhow::bail!(
            "task {} has not failed for good (it was sent back: it waits, runs or is retried): \
             skipping it would start key `{}`'s next run beside it; nothing was changed",
            args.task_id,
            run.key
        ),
    }
    failures::release(&context.pool, &[&args.task_id]).await?;
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
