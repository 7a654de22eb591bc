//! `gpkit new project <name>`: a new service in a new directory.

use std::process::ExitCode;

use anyhow::{Context as _, Result, bail};

use super::{Context, display};
use crate::cli::NewProjectArgs;
use crate::domain::names::PackageName;
use crate::engine::blueprint::{self, TEMPLATE_SET_VERSION};
use crate::engine::manifest::{
    Answers, BASE_DIR, Components, DataLayer, FileRecord, MANIFEST_FILE, Manifest, Versions,
    sha256_hex,
};
use crate::engine::plan::Plan;
use crate::engine::released::Store;
use crate::prompt;

mod example;

pub(crate) fn run(ctx: &Context, args: NewProjectArgs) -> Result<ExitCode> {
    // The example's listener runs in the worker: `--example` implies it.
    let worker_flag = if args.example {
        Some(true)
    } else {
        args.worker()
    };
    let example_flag = args.example();
    let deploy_flag = args.deploy();
    let name = prompt::value(
        args.name,
        ctx.no_input,
        "Project name",
        "the project name",
        "gpkit new project <name>",
        |raw| {
            let name = PackageName::parse(raw)?;
            check_destination(&ctx.dir.join(name.as_str()))?;
            Ok(name)
        },
    )?;
    let dest = ctx.dir.join(name.as_str());
    let worker = prompt::choice(
        worker_flag,
        ctx.no_input,
        "Include the worker (outbox relay, queue consumer, listeners)?",
        true,
    )?;

    // `--example` alone takes the default data layer, as before it was
    // written for both; `--example --db sea-orm` writes it with SeaORM.
    let db = prompt::select(
        if args.example && args.db.is_none() {
            Some(DataLayer::Sqlx)
        } else {
            args.db
        },
        ctx.no_input,
        "Data layer for your application code?",
        &[
            (DataLayer::Sqlx, "sqlx: SQL queries on sqlx connections"),
            (
                DataLayer::SeaOrm,
                "sea-orm: SeaORM entities, on the same sqlx pool",
            ),
        ],
        DataLayer::Sqlx,
    )?;

    let example = worker
        && prompt::choice(
            example_flag,
            ctx.no_input,
            "Add the example (orders: POST /orders, GET /orders/{id}, two events and their listeners)?",
            false,
        )?;
    let deploy = prompt::choice(
        deploy_flag,
        ctx.no_input,
        "Add container files (Dockerfile, compose.yaml)?",
        false,
    )?;

    let answers = Answers {
        name: name.as_str().to_string(),
        db,
    };
    let components = Components {
        events: if example {
            example::events()?
        } else {
            Vec::new()
        },
        worker,
        deploy,
        schedules: Vec::new(),
    };
    let plan = plan(answers, components, example)?;

    let title = format!(
        "Plan for `gpkit new project {}` in `{}`",
        name.as_str(),
        display(&dest)
    );
    if ctx.preview(&plan, &title)? {
        return Ok(ExitCode::SUCCESS);
    }
    if let Err(err) = plan.apply_to_new_dir(&dest) {
        bail!(
            "failed to generate `{}` at `{}`: {err:#}; nothing was written
             help: check that you can write to the parent directory, or choose another with `-C <dir>`",
            name.as_str(),
            display(&dest)
        );
    }
    eprintln!(
        "     Created project `{}` at `{}`",
        name.as_str(),
        display(&dest)
    );
    eprint!("{}", next_steps(&display(&dest), worker));
    if example {
        eprint!("{}", example::TRY_IT);
    }
    Ok(ExitCode::SUCCESS)
}

/// What to run after `gpkit new project`: `gpkit dev`, or, with Postgres
/// and Valkey of the user's own on their default ports, the binaries one
/// by one; each line works when typed or pasted as it is (a test runs
/// them). `.env` holds the settings; a variable set in the environment wins.
fn next_steps(dir: &str, worker: bool) -> String {
    let (own, servers) = if worker {
        (
            "a Postgres and a Valkey",
            "Postgres on localhost:5432 and Valkey on localhost:6379",
        )
    } else {
        ("a Postgres", "Postgres on localhost:5432")
    };
    let dir = shell_quote(dir);
    let mut steps = format!(
        "\nRun it, with {own} of the project's own (Ctrl-C stops it all):\n  \
         cd {dir} && gpkit dev\n\
         \nNext steps, with your own {servers}:\n  \
         cd {dir}\n  \
         cp .env.example .env                             # settings: check DATABASE_URL\n  \
         cargo run --bin migrate -- up --create-database  # create the database and the schema\n  \
         cargo run --bin server                           # GET /healthz and /readyz on :8080\n",
    );
    if worker {
        steps.push_str(
            "  cargo run --bin worker                           # in a 2nd terminal, same directory\n",
        );
    }
    steps.push_str("If a step fails, `gpkit doctor` in the project says what to fix.\n");
    steps
}

/// `word` as one shell word: as it is when that is safe, else in single quotes.
fn shell_quote(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./:@%+=,".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// The plan of a whole new project: every blueprint file, its base copy
/// (unless gpkit regenerates it: the kit's files) and the manifest that
/// records them; with `example`, the example's edits on top, as a user's
/// edits after `gpkit add event` and `gpkit new migration`.
fn plan(answers: Answers, components: Components, example: bool) -> Result<Plan> {
    let tree = blueprint::render(&answers, &components, blueprint::Tests::All, &[])?;
    let mut edits = if example {
        example::files(
            &tree,
            answers.db,
            &PackageName::parse(&answers.name)?.crate_name(),
        )?
    } else {
        Default::default()
    };
    let mut manifest = Manifest {
        gpkit: Versions {
            version: env!("CARGO_PKG_VERSION").to_string(),
            template_set: TEMPLATE_SET_VERSION,
        },
        answers,
        components,
        files: Default::default(),
    };
    let mut plan = Plan::new();
    for (path, file) in &tree {
        match edits.remove(path) {
            Some(edited) => plan.create(path.clone(), edited, "the example, filled in"),
            None => plan.create(path.clone(), file.contents.clone(), file.purpose.clone()),
        }
        manifest.files.insert(
            path.clone(),
            FileRecord {
                owner: file.owner,
                sha256: sha256_hex(&file.contents),
            },
        );
    }
    plan.create(
        MANIFEST_FILE,
        manifest.to_toml().into_bytes(),
        "what gpkit generated, and who owns each file",
    );
    for (path, contents) in edits {
        plan.create(path, contents, "the example (yours)");
    }
    // A base that gpkit regenerates from its released kits needs no copy.
    let (store, name) = (Store::embedded(), &manifest.answers.name);
    for (path, file) in tree {
        if store
            .find(&path, &sha256_hex(&file.contents), name)
            .is_none()
        {
            plan.create(format!("{BASE_DIR}/{path}"), file.contents, "base copy");
        }
    }
    Ok(plan)
}

/// The destination must not exist, or be an empty directory.
fn check_destination(dest: &std::path::Path) -> Result<()> {
    if !dest.exists() {
        return Ok(());
    }
    if !dest.is_dir() {
        bail!(
            "`{}` already exists and is not a directory; nothing was written\n\
             help: choose another name, or move the file away",
            display(dest)
        );
    }
    let mut entries: Vec<String> = std::fs::read_dir(dest)
        .with_context(|| format!("failed to read `{}`", display(dest)))?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    if entries.is_empty() {
        return Ok(());
    }
    entries.sort();
    let shown = entries
        .iter()
        .take(10)
        .map(|e| format!("  {e}"))
        .collect::<Vec<_>>()
        .join("\n");
    let more = if entries.len() > 10 {
        format!("\n  ... and {} more", entries.len() - 10)
    } else {
        String::new()
    };
    bail!(
        "`{}` already exists and is not empty; nothing was written. It contains:\n{shown}{more}\n\
         help: choose another name, or remove the directory first",
        display(dest)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_quoted_only_when_the_shell_needs_it() {
        assert_eq!(shell_quote("shop"), "shop");
        assert_eq!(
            shell_quote("/home/me/src/order-service"),
            "/home/me/src/order-service"
        );
        assert_eq!(
            shell_quote("/home/me/my projects/shop"),
            "'/home/me/my projects/shop'"
        );
        assert_eq!(shell_quote("/tmp/it's/shop"), r"'/tmp/it'\''s/shop'");
    }
}
