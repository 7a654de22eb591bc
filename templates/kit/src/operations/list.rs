//! `outbox list`: events, newest first, filtered by name, published or
//! not, and creation time.

use std::process::ExitCode;

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use super::output::{self, Format};
use crate::follow::rows::{self, Filter};
use crate::follow::{Context, time};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Only events with this name, such as orderPlaced
    #[arg(long)]
    pub(crate) name: Option<String>,
    /// Only events the relay has not published yet
    #[arg(long, conflicts_with = "published")]
    pub(crate) unpublished: bool,
    /// Only events the relay has published
    #[arg(long)]
    pub(crate) published: bool,
    /// Only events created at or after this time (2h: two hours ago, or
    /// 2026-11-30T08:00:00Z)
    #[arg(long, value_parser = time::parse_time)]
    pub(crate) since: Option<DateTime<Utc>>,
    /// Only events created before this time
    #[arg(long, value_parser = time::parse_time)]
    pub(crate) until: Option<DateTime<Utc>>,
    /// At most this many events
    #[arg(long, default_value_t = 50)]
    pub(crate) limit: u32,
}

/// One listed event (`--format json`: `{"events": [...]}`).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Listed {
    pub(crate) id: Uuid,
    pub(crate) name: String,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) published_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Serialize)]
struct List {
    events: Vec<Listed>,
}

pub async fn run(context: &Context, args: &Args, format: Format) -> anyhow::Result<ExitCode> {
    let published = match (args.published, args.unpublished) {
        (true, _) => Some(true),
        (_, true) => Some(false),
        _ => None,
    };
    let filter = Filter {
        name: args.name.clone(),
        published,
        since: args.since,
        until: args.until,
        limit: Some(args.limit),
        newest_first: true,
    };
    let events: Vec<Listed> = rows::list(&context.pool, &filter)
        .await?
        .into_iter()
        .map(|row| Listed {
            id: row.id,
            name: row.name,
            created_at: row.created_at,
            published_at: row.published_at,
        })
        .collect();
    match format {
        Format::Json => output::print_json(&List { events })?,
        Format::Text => {
            println!(
                "{:<36}  {:<24}  {:<27}  published",
                "event id", "name", "created"
            );
            for event in &events {
                println!(
                    "{:<36}  {:<24}  {:<27}  {}",
                    event.id,
                    event.name,
                    output::time(event.created_at),
                    output::maybe_time(event.published_at)
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
