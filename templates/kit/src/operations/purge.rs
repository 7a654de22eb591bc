//! `outbox purge --published-before 7d`: deletes published rows older than
//! a time, in bounded batches of short transactions like the cleanup loop,
//! so it never holds many locks or one long transaction. Unpublished rows
//! are never deleted, nor the events a held key keeps (an ordered
//! listener's first run of the key failed for good and holds it: `outbox
//! status`), unless `--include-held`. It asks for confirmation on a
//! terminal, `--yes` otherwise.

use std::process::ExitCode;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::output::{self, Format};
use crate::follow::{Context, rows, time};
use crate::outbox::cleanup::CLEANUP_BATCH;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Delete rows published before this time (7d: seven days ago, or
    /// 2026-11-30T08:00:00Z)
    #[arg(long, value_parser = time::parse_time)]
    pub(crate) published_before: DateTime<Utc>,
    /// Rows deleted per statement
    #[arg(long, default_value_t = CLEANUP_BATCH, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) batch_size: u32,
    /// Delete the events held keys keep too (their ordered listeners'
    /// later runs then have no event left to look at)
    #[arg(long)]
    pub(crate) include_held: bool,
    /// Do not ask for confirmation
    #[arg(long, short)]
    pub(crate) yes: bool,
}

/// What was deleted (`--format json`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Purged {
    pub(crate) published_before: DateTime<Utc>,
    pub(crate) deleted: u64,
    /// Statements run, the last one short.
    pub(crate) batches: u64,
    /// Rows published before the time that held keys keep, left (0 with
    /// `--include-held`).
    pub(crate) kept_held: u64,
}

pub async fn run(context: &Context, args: &Args, format: Format) -> anyhow::Result<ExitCode> {
    let before = args.published_before;
    let (published, held) = rows::count_published_before(&context.pool, before).await?;
    let kept_held = if args.include_held { 0 } else { held };
    let due = published - kept_held;
    let question = format!(
        "delete {due} event(s) published before {}",
        output::time(before)
    );
    if due > 0 && !output::confirm(&question, args.yes)? {
        eprintln!("nothing deleted");
        return Ok(ExitCode::FAILURE);
    }
    let mut purged = Purged {
        published_before: before,
        deleted: 0,
        batches: 0,
        kept_held: u64::try_from(kept_held).unwrap_or(0),
    };
    if due > 0 {
        loop {
            let deleted = rows::delete_published_before(
                &context.pool,
                before,
                args.batch_size,
                args.include_held,
            )
            .await?;
            purged.deleted += deleted;
            purged.batches += 1;
            if deleted < u64::from(args.batch_size) {
                break;
            }
        }
    }
    match format {
        Format::Json => output::print_json(&purged)?,
        Format::Text => {
            println!(
                "deleted {} event(s) published before {} in {} batch(es)",
                purged.deleted,
                output::time(before),
                purged.batches
            );
            if purged.kept_held > 0 {
                println!(
                    "kept {} event(s) that held keys keep (outbox status counts the blocked keys); \
                     --include-held deletes them too",
                    purged.kept_held
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
