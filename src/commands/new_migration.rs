//! `gpkit new migration <name>`: a goose-style migration file.

use std::process::ExitCode;

use anyhow::{Result, bail};
use time::OffsetDateTime;

use super::Context;
use crate::cli::NewMigrationArgs;
use crate::domain::migration::{self, Numbering, SQL_TEMPLATE};
use crate::engine::plan::Plan;

/// Where migrations live in a generated project.
const MIGRATIONS_DIR: &str = "migrations";

pub(crate) fn run(ctx: &Context, args: NewMigrationArgs) -> Result<ExitCode> {
    let (project, _lock) = ctx.open_project("gpkit new migration", false)?;
    crate::engine::project_path::refuse_links(&project.root, MIGRATIONS_DIR)?;
    let dir = project.root.join(MIGRATIONS_DIR);
    let existing = migration::existing_versions(&dir)?;
    let numbering = if args.sequential {
        Numbering::Sequential
    } else {
        Numbering::Timestamp
    };
    let version = migration::next_version(&existing, numbering, now()?)?;
    let file_name = migration::file_name(&version, &args.name)?;
    if let Some((_, clash)) = existing
        .iter()
        .find(|(v, _)| v.to_string() == version.trim_start_matches('0'))
    {
        bail!(
            "version {version} is taken by `{MIGRATIONS_DIR}/{clash}`; nothing was written\n\
             help: rename that file, or run the command again"
        );
    }
    let path = format!("{MIGRATIONS_DIR}/{file_name}");
    let mut plan = Plan::new();
    plan.create(
        &path,
        SQL_TEMPLATE.as_bytes().to_vec(),
        "goose migration (yours to edit)",
    );
    if ctx.preview(&plan, "Plan for `gpkit new migration`")? {
        return Ok(ExitCode::SUCCESS);
    }
    plan.apply_in_place(&project.root)?;
    eprintln!("     Created {path}");
    Ok(ExitCode::SUCCESS)
}

/// The current time, or `SOURCE_DATE_EPOCH` when set (for reproducible output).
pub(crate) fn now() -> Result<OffsetDateTime> {
    match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(raw) => {
            let seconds: i64 = raw.trim().parse().map_err(|_| {
                anyhow::anyhow!("SOURCE_DATE_EPOCH is `{raw}`; expected seconds since 1970")
            })?;
            Ok(OffsetDateTime::from_unix_timestamp(seconds)?)
        }
        Err(_) => Ok(OffsetDateTime::now_utc()),
    }
}
