//! `migrate`: applies the goose-format SQL migrations in `migrations/` to the
//! database in `DATABASE_URL`. Run `migrate --help` for the commands.

use std::process::ExitCode;

use shop::migrate::cli;

#[tokio::main]
async fn main() -> ExitCode {
    cli::main().await
}
