//! `gpkit add event <name>`: a typed event, its listeners, and the first
//! time the `Transactor` in the server's state.

use std::process::ExitCode;

use std::collections::BTreeMap;

use anyhow::{Result, bail};

use super::Context;
use crate::cli::AddEventArgs;
use crate::domain::events::{self, EventNames};
use crate::domain::listener_options::{ListenerRun, RunFlags};
use crate::engine::manifest::{DataLayer, EventSpec, FieldSpec};
use crate::engine::reconcile::Options;

pub(crate) fn run(ctx: &Context, args: AddEventArgs) -> Result<ExitCode> {
    let (project, _lock) = ctx.open_project("gpkit add event", false)?;
    let names = EventNames::parse(&args.name)?;
    let fields = parse_fields(&args.fields)?;
    let listeners = parse_listeners(&args.listeners)?;
    let run = ListenerRun::from_flags(RunFlags {
        ordered: args.ordered_by.is_some(),
        concurrency: args.concurrency,
        rate: args.rate.as_deref(),
        burst: args.burst,
        retries: args.retries,
        timeout: args.timeout.as_deref(),
        backoff: args.backoff.as_deref(),
    })?;
    if run.is_some() && listeners.is_empty() {
        bail!(
            "`--ordered-by`, `--concurrency`, `--rate`, `--burst`, `--retries`, `--timeout` and \
             `--backoff` say how the listeners given with them run, and none is given; nothing \
             was changed\n\
             help: add `--listener <name>`"
        );
    }
    let options = |listeners: &[String]| -> BTreeMap<String, ListenerRun> {
        run.iter()
            .flat_map(|run| listeners.iter().map(|l| (l.clone(), run.clone())))
            .collect()
    };
    if !listeners.is_empty() && !project.manifest.components.worker {
        bail!(
            "listeners run in the worker, and this project has none; nothing was changed\n\
             help: run `gpkit add worker` first, or leave out `--listener`"
        );
    }

    let mut components = project.manifest.components.clone();
    let existing = components
        .events
        .iter_mut()
        .find(|e| EventNames::recorded(&e.name).is_ok_and(|n| n.module == names.module));
    let new_event = existing.is_none();
    let what = match existing {
        Some(event) => {
            let path = format!("src/events/{}.rs", names.module);
            if listeners.is_empty() {
                bail!(
                    "the event `{}` already exists (`{path}`); nothing was changed\n\
                     help: to add listeners to it, pass `--listener <name>`",
                    event.name
                );
            }
            if !fields.is_empty() {
                bail!(
                    "the event `{}` already exists; its fields are yours to edit in `{path}`; \
                     nothing was changed\nhelp: leave out `--field` to add only the listeners",
                    event.name
                );
            }
            if let Some(taken) = listeners.iter().find(|l| event.listeners.contains(l)) {
                bail!(
                    "`{}` already has a listener `{taken}`; nothing was changed\n\
                     help: choose another listener name",
                    event.name
                );
            }
            if let Some(field) = &args.ordered_by
                && event.ordered_by.as_ref() != Some(field)
            {
                let now = match &event.ordered_by {
                    Some(key) => format!("its order is keyed by `{key}`"),
                    None => "it has no order key".to_string(),
                };
                bail!(
                    "`{}` cannot order listeners by `{field}`: {now}; nothing was changed\n\
                     help: an event has one order key, given when it is added; its file \
                     `{path}` is yours: write its `order_key` there and register the \
                     listener with `ListenerOptions::new().ordered()` yourself",
                    event.name
                );
            }
            event.listener_options.extend(options(&listeners));
            event.listeners.extend(listeners.iter().cloned());
            format!(
                "listener{} of `{}`",
                if listeners.len() == 1 { "" } else { "s" },
                event.name
            )
        }
        None => {
            if let Some(field) = &args.ordered_by {
                events::check_ordered_by(field, &fields)?;
            }
            components.events.push(EventSpec {
                name: names.wire.clone(),
                fields,
                listeners: listeners.clone(),
                ordered_by: args.ordered_by.clone(),
                listener_options: options(&listeners),
            });
            format!("event `{}`", names.wire)
        }
    };

    let command = format!("gpkit add event {}", args.name);
    if !super::add_components(ctx, &project, components, &Options::default(), &command)? {
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!("\nAdded the {what}.");
    if new_event {
        eprint!("{}", dispatch_hint(&names, project.manifest.answers.db));
    }
    for listener in &listeners {
        eprintln!("Fill in `src/listeners/{}/{listener}.rs`.", names.module);
    }
    Ok(ExitCode::SUCCESS)
}

/// How to dispatch a new event: a complete handler that compiles as it is
/// in any module of the project (tests build it, for each data layer),
/// printed after the event is added.
fn dispatch_hint(names: &EventNames, db: DataLayer) -> String {
    // SeaORM's transaction is a shared reference, passed on as it is.
    let (writes, tx) = match db {
        DataLayer::Sqlx => (
            "// Your writes go here, through `&mut *tx`: they commit with the event.",
            "&mut *tx",
        ),
        DataLayer::SeaOrm => (
            "// Your entity writes go here, on `tx`: they commit with the event.",
            "tx",
        ),
    };
    let code = format!(
        r#"use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;

use crate::events::{module}::{ty};
use crate::startup::AppState;

/// Stores `{wire}` in the outbox, in one transaction with your writes.
pub async fn publish_{module}(
    State(state): State<AppState>,
    Json(event): Json<{ty}>,
) -> StatusCode {{
    let stored = state
        .transactor
        .run(async |tx| {{
            {writes}
            kit::dispatch({tx}, &event).await?;
            Ok(())
        }})
        .await;
    match stored {{
        Ok(()) => StatusCode::ACCEPTED,
        Err(err) => {{
            tracing::error!(error = format!("{{err:#}}"), "failed to store {wire}");
            StatusCode::INTERNAL_SERVER_ERROR
        }}
    }}
}}
"#,
        module = names.module,
        ty = names.type_name,
        wire = names.wire,
    );
    let indented: String = code
        .lines()
        .map(|line| {
            if line.is_empty() {
                "\n".to_string()
            } else {
                format!("    {line}\n")
            }
        })
        .collect();
    format!(
        "Dispatch it in the transaction that makes the change it announces, as this \
         handler does\n(put it in a module under `src/routes/` and route it in \
         `src/routes/mod.rs`):\n\n{indented}\n"
    )
}

fn parse_fields(raw: &[String]) -> Result<Vec<FieldSpec>> {
    let mut fields: Vec<FieldSpec> = Vec::new();
    for field in raw {
        let field = events::parse_field(field)?;
        if fields.iter().any(|f| f.name == field.name) {
            bail!(
                "the field `{}` is given twice\nhelp: give each field once",
                field.name
            );
        }
        fields.push(field);
    }
    Ok(fields)
}

fn parse_listeners(raw: &[String]) -> Result<Vec<String>> {
    let mut listeners: Vec<String> = Vec::new();
    for listener in raw {
        events::check_listener(listener)?;
        if listeners.contains(listener) {
            bail!("the listener `{listener}` is given twice\nhelp: give each listener once");
        }
        listeners.push(listener.clone());
    }
    Ok(listeners)
}
