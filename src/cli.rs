//! The command line: clap types only. Each command's arguments are turned
//! into options and handed to `crate::commands`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Scaffold Rust backend services whose events go out through a
/// transactional outbox.
#[derive(Debug, Parser)]
#[command(name = "gpkit", version, arg_required_else_help = true, after_help = EXAMPLES)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

const EXAMPLES: &str = "\
Examples:
  gpkit new project shop
  gpkit --dry-run --diff new project shop
  gpkit -C shop new migration add_orders";

/// Flags every command takes.
#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// Print the plan (every file created or changed, and why); write nothing
    #[arg(long, global = true)]
    pub dry_run: bool,

    /// Show a unified diff of every change in the plan
    #[arg(long, global = true)]
    pub diff: bool,

    /// Never prompt; take defaults and flags only
    ///
    /// A value that has no default and was not given is then an error. gpkit
    /// never prompts when standard input is not a terminal either.
    #[arg(long, global = true)]
    pub no_input: bool,

    /// Run as if gpkit was started in DIR
    #[arg(short = 'C', value_name = "DIR", global = true)]
    pub directory: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a new project, or a new migration in this project
    #[command(subcommand)]
    New(NewCommand),
}

#[derive(Debug, Subcommand)]
pub enum NewCommand {
    /// Create a new service with a transactional outbox
    #[command(after_help = "\
Examples:
  gpkit new project shop
  gpkit -C ~/src new project order-service
  gpkit --dry-run --diff new project shop")]
    Project(NewProjectArgs),
}

#[derive(Debug, Args)]
pub struct NewProjectArgs {
    /// The Cargo package name, also the new directory's name
    ///
    /// Lowercase letters, digits, `-` and `_`, starting with a letter. Asked
    /// for when missing and standard input is a terminal.
    pub name: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_tree_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn global_flags_go_anywhere() {
        let cli = Cli::try_parse_from(["gpkit", "new", "project", "shop", "--dry-run", "-C", "/tmp"])
            .unwrap();
        assert!(cli.global.dry_run);
        assert_eq!(cli.global.directory, Some(PathBuf::from("/tmp")));
    }
}
