//! Command dispatch and what every command shares: where it runs, whether it
//! may write, and how a plan is shown or applied.

mod add_deploy;
mod add_event;
mod add_schedule;
mod add_worker;
mod completions;
#[cfg(unix)]
mod dev;
mod doctor;
mod new_migration;
mod new_project;
mod upgrade;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Result, bail};

use crate::engine::journal::{self, JOURNAL_FILE};
use crate::engine::lock::ProjectLock;
use crate::engine::manifest::Components;
use crate::engine::project::Project;
use crate::engine::project_path;
use crate::engine::reconcile::{FileChange, Options, Outcome};
use crate::engine::{reconcile, update};

use crate::cli::{AddCommand, Cli, Command, GlobalArgs, NewCommand, UpgradeCommand};
use crate::engine::plan::Plan;

/// The resolved global flags.
#[derive(Debug, Clone)]
pub(crate) struct Context {
    /// The directory gpkit acts in (`-C`, or the current directory).
    pub(crate) dir: PathBuf,
    pub(crate) dry_run: bool,
    pub(crate) diff: bool,
    pub(crate) no_input: bool,
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

    /// Opens the project gpkit acts in for `command` and, unless this is a
    /// dry run or `read_only`, locks it against other gpkit runs until the
    /// returned lock is dropped. The manifest is read (again) under the lock.
    fn open_project(
        &self,
        command: &str,
        read_only: bool,
    ) -> Result<(Project, Option<ProjectLock>)> {
        let project = Project::open(&self.dir)?;
        if self.dry_run || read_only {
            if project_path::read(&project.root, JOURNAL_FILE)?.is_some() {
                bail!(
                    "an earlier gpkit run was interrupted and left `{JOURNAL_FILE}`, so the \
                     project may be half-changed; nothing was changed\n\
                     help: run the command without `--dry-run`/`--check` to complete or undo \
                     that run first"
                );
            }
            return Ok((project, None));
        }
        let lock = ProjectLock::acquire(&project.root, command)?;
        if let Some(done) = journal::recover(&project.root)? {
            eprintln!("note: {done}");
        }
        Ok((Project::open(&self.dir)?, Some(lock)))
    }

    /// Prints the plan for a dry run and returns true, or returns false when
    /// the plan is to be applied. `title` names the command and its target.
    fn preview(&self, plan: &Plan, title: &str) -> Result<bool> {
        if self.dry_run || self.diff {
            print_out(&format!("{title}:\n{}", plan.render(self.diff)))?;
        }
        if self.dry_run {
            print_out(&format!(
                "{}. Nothing was written (--dry-run).\n",
                plan.summary()
            ))?;
        }
        Ok(self.dry_run)
    }
}

/// Writes `text` to standard output. A closed pipe (`gpkit ... | head`) is
/// an error that `main` recognises and ends quietly on.
fn print_out(text: &str) -> Result<()> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()?;
    Ok(())
}

/// Runs the parsed command line.
pub(crate) fn run(cli: Cli) -> Result<ExitCode> {
    let ctx = Context::new(&cli.global)?;
    match cli.command {
        Command::New(NewCommand::Project(args)) => new_project::run(&ctx, args),
        Command::New(NewCommand::Migration(args)) => new_migration::run(&ctx, args),
        Command::Add(AddCommand::Worker) => add_worker::run(&ctx),
        Command::Add(AddCommand::Deploy) => add_deploy::run(&ctx),
        Command::Add(AddCommand::Event(args)) => add_event::run(&ctx, args),
        Command::Add(AddCommand::Schedule(args)) => add_schedule::run(&ctx, args),
        Command::Upgrade(UpgradeCommand::Templates(args)) | Command::UpgradeTemplates(args) => {
            upgrade::run(&ctx, args)
        }
        Command::Completions(args) => completions::completions(args.shell),
        Command::Man => completions::man(),
        Command::Doctor(args) => doctor::run(&ctx, args),
        #[cfg(unix)]
        Command::Dev(args) => dev::run(&ctx, args),
        #[cfg(not(unix))]
        Command::Dev(_) => bail!("`gpkit dev` runs on Linux and macOS only"),
    }
}

/// What every `add` command does once it knows the components it wants:
/// render them, reconcile the project with them, refuse to overwrite the
/// user's changes, then preview or apply the plan and report each file.
/// `command` is the command line, for messages. Returns false on a dry run.
fn add_components(
    ctx: &Context,
    project: &Project,
    components: Components,
    options: &Options,
    command: &str,
) -> Result<bool> {
    let changes = reconcile::for_components(project, &components, options)?;
    refuse_conflicts(&changes, command)?;
    let plan = update::plan(project, &changes, components)?;
    if ctx.preview(&plan, &format!("Plan for `{command}`"))? {
        return Ok(false);
    }
    plan.apply_in_place(&project.root)?;
    report_applied(&changes);
    Ok(true)
}

/// Stops an `add` command before anything is written when applying it would
/// overwrite something of the user's: a file in the way, a kit file whose
/// edits overlap, or a managed region that is gone or edited.
fn refuse_conflicts(changes: &[FileChange], command: &str) -> Result<()> {
    let conflicts: Vec<String> = changes
        .iter()
        .filter(|c| c.outcome.is_conflict())
        .map(|c| match &c.outcome {
            Outcome::RegionProblem(explained) => explained.clone(),
            Outcome::Unresolved => format!(
                "`{}` still has the conflict markers of an earlier upgrade",
                c.path
            ),
            Outcome::Blocked => format!(
                "`{}` already exists and gpkit did not write it, so it cannot create it",
                c.path
            ),
            other => format!("`{}`: {other}: your edits overlap the kit's change", c.path),
        })
        .collect();
    if conflicts.is_empty() {
        return Ok(());
    }
    bail!(
        "`{command}` would overwrite your changes; nothing was written:\n{}\n\
         help: resolve the files above (or move them away), then run `{command}` again",
        conflicts.join("\n")
    )
}

/// Prints what an `add` command did to each file, and the notes on entries
/// it left as the user had them.
fn report_applied(changes: &[FileChange]) {
    for change in changes.iter().filter(|c| c.write.is_some() || c.delete) {
        let label = change.outcome.label();
        let mut chars = label.chars();
        let label: String = chars
            .next()
            .map(|c| c.to_uppercase().chain(chars).collect())
            .unwrap_or_default();
        eprintln!("{label:>12} {}", change.path);
    }
    for note in changes.iter().flat_map(|c| &c.notes) {
        eprintln!("note: {note}");
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
