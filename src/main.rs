//! The `gpkit` binary: parses the command line, runs it, and turns errors
//! into messages and exit codes (0 success, 1 error, 2 usage error).

use std::process::ExitCode;

use clap::Parser;
use gpkit::cli::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match gpkit::run(cli) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(1)
        }
    }
}
