//! `gpkit new project <name>`: a new service in a new directory.

use std::process::ExitCode;

use anyhow::{Context as _, Result, bail};

use super::{Context, display};
use crate::blueprint::{self, TEMPLATE_SET_VERSION};
use crate::cli::NewProjectArgs;
use crate::manifest::{
    Answers, BASE_DIR, Components, FileRecord, MANIFEST_FILE, Manifest, Versions, sha256_hex,
};
use crate::names::PackageName;
use crate::plan::Plan;
use crate::prompt;

pub fn run(ctx: &Context, args: NewProjectArgs) -> Result<ExitCode> {
    let worker_flag = args.worker();
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

    let answers = Answers {
        name: name.as_str().to_string(),
    };
    let components = Components {
        events: Vec::new(),
        worker,
    };
    let plan = plan(answers, components)?;

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
    eprintln!(
        "\nNext steps:\n  cd {}\n  export DATABASE_URL=postgres://postgres@localhost:5432/{}\n  \
         cargo run --bin migrate -- up\n  cargo run --bin server",
        display(&dest),
        name.crate_name()
    );
    Ok(ExitCode::SUCCESS)
}

/// The plan of a whole new project: every blueprint file, its base copy and
/// the manifest that records them.
fn plan(answers: Answers, components: Components) -> Result<Plan> {
    let tree = blueprint::render(&answers, &components)?;
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
        plan.create(path.clone(), file.contents.clone(), file.purpose.clone());
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
    for (path, file) in tree {
        plan.create(format!("{BASE_DIR}/{path}"), file.contents, "base copy");
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
