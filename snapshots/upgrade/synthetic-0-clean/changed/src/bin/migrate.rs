//! `migrate`: applies the goose-format SQL migrations in `migrations/` to the
//! database in `DATABASE_URL`. Run `migrate --help` for the commands.

use std::process::ExitCode;

use kit::migrate::cli;

fn main() -> ExitCode {
    // The command line is read after `.env`: `DATABASE_URL` may come from it.
    kit::binary::run_command(async || Ok(cli::main().await))
}
