//! `migrate`: applies the goose-format SQL migrations in `migrations/` to the
//! database in `DATABASE_URL`. Run `migrate --help` for the commands.

use std::process::ExitCode;

use kit::env_file;
use kit::migrate::cli;

fn main() -> ExitCode {
    // First, while the process has one thread: `.env` sets variables.
    if let Err(err) = env_file::load() {
        eprintln!("migrate: {err}");
        return ExitCode::FAILURE;
    }
    run()
}

#[tokio::main]
async fn run() -> ExitCode {
    cli::main().await
}
