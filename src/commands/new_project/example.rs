//! `gpkit new project --example`: a working slice, made only of what the
//! other commands make. The events and their listeners are what `gpkit add
//! event orderPlaced --field order_id:uuid --field sku:string --field
//! quantity:i32 --listener confirm` and `gpkit add event orderReminderDue
//! --field order_id:uuid --listener remind` record and render; the
//! migration is named as `gpkit new migration orders` names it; the rest
//! are a user's edits: the listeners' bodies and their tests (which insert
//! the order each event is about; the reminder's drains "as of" a day
//! later), `src/routes/orders.rs` (which dispatches the reminder for 24
//! hours later) and two routes, the slice's test, `tests/orders.rs`, and
//! `serde_json` (and chrono, for the tests) in `Cargo.toml`. The manifest
//! records the events, and the bases hold the files as the commands
//! rendered them, so the project upgrades like any other.

use std::collections::BTreeMap;

use anyhow::{Context as _, Result, ensure};

use crate::domain::events;
use crate::domain::migration::{self, Numbering};
use crate::engine::blueprint::Tree;
use crate::engine::manifest::{DataLayer, EventSpec};
use crate::engine::templates::{Renderer, template_set};

/// The dependencies the example's code adds to the service's `Cargo.toml`,
/// as a user would, each at the kit's version and features (the tests
/// below check them), and after the lines it follows: `serde_json`
/// (`serde_json::json!` in its route and its test) after serde, and chrono
/// (the reminder's test drains "as of" a day later) after the testing kit,
/// for the tests only.
const ADDED_DEPENDENCIES: [(&[&str], &str); 2] = [
    (&["\nserde = "], "serde_json = \"1\"\n"),
    (
        &["\n[dev-dependencies]\n", "\nkit = "],
        "chrono = { version = \"0.4\", default-features = false, features = [\"clock\", \"serde\", \"std\"] }\n",
    ),
];

/// How to try the example once the next steps run.
pub(crate) const TRY_IT: &str = "\nTry the example (the worker confirms each order; its reminder runs a day later):
  curl -si localhost:8080/orders -H 'content-type: application/json' -d '{\"sku\": \"tea\", \"quantity\": 2}'
  curl -s localhost:8080/orders/<id from the answer>
";

/// The example's events, as `gpkit add event` records them: the order
/// placed, confirmed by `confirm`, and its reminder, dispatched for a day
/// later and run by `remind`.
pub(crate) fn events() -> Result<Vec<EventSpec>> {
    [
        (
            "orderPlaced",
            &["order_id:uuid", "sku:string", "quantity:i32"][..],
            "confirm",
        ),
        ("orderReminderDue", &["order_id:uuid"][..], "remind"),
    ]
    .into_iter()
    .map(|(name, fields, listener)| {
        Ok(EventSpec {
            name: name.to_string(),
            fields: fields
                .iter()
                .copied()
                .map(events::parse_field)
                .collect::<Result<_>>()?,
            listeners: vec![listener.to_string()],
            ordered_by: None,
            listener_options: Default::default(),
        })
    })
    .collect()
}

/// The example's files by path: edits of files in `tree` (the blueprint
/// with [`events`]) and new files of the user's. With SeaORM, the route and
/// the listeners are written with SeaORM entities (`example-seaorm`, over
/// the `example` set), declared in `src/lib.rs` as `entities`. The tests
/// (`tests/`) name the service's crate, `crate_name`.
pub(crate) fn files(
    tree: &Tree,
    db: DataLayer,
    crate_name: &str,
) -> Result<BTreeMap<String, Vec<u8>>> {
    let mut files = BTreeMap::new();
    let renderer = Renderer::new();
    let mut sets = vec!["example"];
    if db == DataLayer::SeaOrm {
        sets.push("example-seaorm");
    }
    for set in sets {
        for template in template_set(set)? {
            let contents =
                renderer.render(&template, &minijinja::context! { crate_name => crate_name })?;
            let path = match template.output {
                "migrations/orders.sql" => migration_path(tree)?,
                other => other.to_string(),
            };
            files.insert(path, contents);
        }
    }
    if db == DataLayer::SeaOrm {
        let lib = "src/lib.rs";
        let text = blueprint_text(tree, lib)?;
        files.insert(
            lib.to_string(),
            format!("{text}\npub mod entities;\n").into_bytes(),
        );
    }

    let manifest = "Cargo.toml";
    let mut text = blueprint_text(tree, manifest)?;
    for (after, line) in ADDED_DEPENDENCIES {
        let at = after
            .iter()
            .try_fold(0, |from, marker| {
                Some(from + text[from..].find(marker)? + 1)
            })
            .and_then(|at| Some(at + text[at..].find('\n')? + 1))
            .with_context(|| {
                format!(
                    "the example does not fit `{manifest}`: no {after:?} (this is a bug in gpkit)"
                )
            })?;
        text.insert_str(at, line);
    }
    files.insert(manifest.to_string(), text.into_bytes());

    let routes = "src/routes/mod.rs";
    let mut edited = blueprint_text(tree, routes)?;
    for (anchor, with) in [
        (
            "use axum::Router;\n",
            "use axum::Router;\nuse axum::routing::{get, post};\n",
        ),
        (
            "use crate::startup::AppState;\n",
            "use crate::startup::AppState;\n\nmod orders;\n",
        ),
        (
            "        .merge(health::routes(state.pool.clone()))\n",
            "        .merge(health::routes(state.pool.clone()))\n        \
             .route(\"/orders\", post(orders::place))\n        \
             .route(\"/orders/{id}\", get(orders::show))\n",
        ),
    ] {
        ensure!(
            edited.contains(anchor),
            "the example does not fit `{routes}`: no {anchor:?} (this is a bug in gpkit)"
        );
        edited = edited.replacen(anchor, with, 1);
    }
    files.insert(routes.to_string(), edited.into_bytes());

    for listener in [
        "src/listeners/order_placed/confirm.rs",
        "tests/listeners/order_placed_confirm.rs",
        "src/listeners/order_reminder_due/remind.rs",
        "tests/listeners/order_reminder_due_remind.rs",
    ] {
        ensure!(
            tree.contains_key(listener) && files.contains_key(listener),
            "the example's listener `{listener}` is missing (this is a bug in gpkit)"
        );
    }
    Ok(files)
}

/// The text of the blueprint's file at `path`.
fn blueprint_text(tree: &Tree, path: &str) -> Result<String> {
    tree.get(path)
        .map(|file| String::from_utf8_lossy(&file.contents).into_owned())
        .with_context(|| format!("the blueprint has no `{path}` (this is a bug in gpkit)"))
}

/// Where `gpkit new migration orders` would write, in a project whose only
/// migrations are the kit's: those of the blueprint `tree`.
fn migration_path(tree: &Tree) -> Result<String> {
    let existing = tree
        .keys()
        .filter_map(|path| path.strip_prefix("migrations/"))
        .map(|file| {
            file.split_once('_')
                .and_then(|(version, name)| Some((version.parse::<i64>().ok()?, name.to_string())))
                .with_context(|| {
                    format!("the kit's migration `{file}` has no version (this is a bug in gpkit)")
                })
        })
        .collect::<Result<Vec<_>>>()?;
    ensure!(
        !existing.is_empty(),
        "the blueprint has no migrations (this is a bug in gpkit)"
    );
    let version = migration::next_version(
        &existing,
        Numbering::Timestamp,
        crate::commands::new_migration::now()?,
    )?;
    Ok(format!(
        "migrations/{}",
        migration::file_name(&version, "orders")?
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_examples_dependencies_are_the_kits() {
        let kit: toml_edit::DocumentMut = include_str!("../../../templates/kit/Cargo.toml")
            .parse()
            .unwrap();
        for (_, line) in ADDED_DEPENDENCIES {
            let ours: toml_edit::DocumentMut = line.parse().unwrap();
            let (name, ours) = ours.iter().next().unwrap();
            assert_eq!(
                ours.to_string().trim(),
                kit["dependencies"][name].to_string().trim(),
                "{name}"
            );
        }
    }
}
