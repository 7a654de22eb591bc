//! gpkit scaffolds Rust backend services in which a transactional outbox is
//! the default way to publish events.
//!
//! [`run`] is the one entry point: it takes the parsed command line
//! ([`cli`]) and executes it ([`commands`]). The layers, top down:
//! - [`commands`]: one module per command, from arguments to a plan, asking
//!   what is missing through [`prompt`];
//! - [`engine`]: what every command shares: blueprint → reconcile → plan →
//!   apply, the manifest, managed regions, `Cargo.toml` merges, templates;
//! - [`domain`]: the naming and domain rules (names, events, migrations).
//!
//! Only what the `gpkit` binary, the tests and the fuzz targets use is
//! public; the rest is `pub(crate)`. These module maps name the private
//! modules too: read them with `cargo doc --document-private-items`.
#![allow(rustdoc::private_intra_doc_links)]

pub mod cli;
pub(crate) mod commands;
pub mod domain;
pub mod engine;
pub(crate) mod prompt;

use std::process::ExitCode;

/// Runs one command line.
pub fn run(cli: cli::Cli) -> anyhow::Result<ExitCode> {
    commands::run(cli)
}
