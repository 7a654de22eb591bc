//! gpkit scaffolds Rust backend services in which a transactional outbox is
//! the default way to publish events.
//!
//! [`run`] is the one entry point: it takes the parsed command line and
//! executes it. Each command plans its changes ([`plan`]) from the project's
//! [`blueprint`] and [`manifest`] before it writes anything.

pub mod blueprint;
pub mod cargo_toml;
pub mod cli;
pub mod commands;
pub mod events;
pub mod journal;
pub mod line_endings;
pub mod lock;
pub mod manifest;
pub mod migration;
pub mod names;
pub mod plan;
pub mod project;
pub mod project_path;
pub mod prompt;
pub mod reconcile;
pub mod regions;
pub mod templates;
pub mod update;

use std::process::ExitCode;

/// Runs one command line.
pub fn run(cli: cli::Cli) -> anyhow::Result<ExitCode> {
    commands::run(cli)
}
