//! Command dispatch and what every command shares: where it runs, whether it
//! may write, and how a plan is shown or applied.

mod add_worker;
mod new_migration;
mod new_project;
mod upgrade;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Result, bail};

use crate::cli::{AddCommand, Cli, Command, GlobalArgs, NewCommand, UpgradeCommand};
use crate::plan::Plan;

/// The resolved global flags.
#[derive(Debug, Clone)]
pub struct Context {
    /// The directory gpkit acts in (`-C`, or the current directory).
    pub dir: PathBuf,
    pub dry_run: bool,
    pub diff: bool,
    pub no_input: bool,
}

impl Context {
    fn new(global: &GlobalArgs) -> Result<Self> {
        let dir = match &global.directory {
            None => PathBuf::from("."),
            Some(dir) if dir.is_dir() => dir.clone(),
            Some(dir) if dir.exists() => bail!(
                "`-C {}` is not a directory\nhelp: give `-C` the directory to act in",
                dir.display()
            ),
            Some(dir) => bail!(
                "`-C {}`: no such directory\nhelp: create it first, or correct the path",
                dir.display()
            ),
        };
        Ok(Self {
            dir,
            dry_run: global.dry_run,
            diff: global.diff,
            no_input: global.no_input,
        })
    }

    /// Prints the plan for a dry run and returns true, or returns false when
    /// the plan is to be applied. `title` names the command and its target.
    fn preview(&self, plan: &Plan, title: &str) -> bool {
        if self.dry_run || self.diff {
            print!("{title}:\n{}", plan.render(self.diff));
        }
        if self.dry_run {
            println!("{}. Nothing was written (--dry-run).", plan.summary());
        }
        self.dry_run
    }
}

/// Runs the parsed command line.
pub fn run(cli: Cli) -> Result<ExitCode> {
    let ctx = Context::new(&cli.global)?;
    match cli.command {
        Command::New(NewCommand::Project(args)) => new_project::run(&ctx, args),
        Command::New(NewCommand::Migration(args)) => new_migration::run(&ctx, args),
        Command::Add(AddCommand::Worker) => add_worker::run(&ctx),
        Command::Upgrade(UpgradeCommand::Templates(args)) | Command::UpgradeTemplates(args) => {
            upgrade::run(&ctx, args)
        }
    }
}

/// `path` for messages: relative paths as given, without a leading `./`.
fn display(path: &Path) -> String {
    let shown = path.display().to_string();
    shown
        .strip_prefix("./")
        .map(str::to_string)
        .unwrap_or(shown)
}
