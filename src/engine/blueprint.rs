//! The blueprint of a generated project: which files it has for a given set
//! of answers and components, who owns each, and their rendered content.
//!
//! Every command that writes kit files (`new project`, `add worker`,
//! `upgrade templates`) asks the blueprint for the desired tree and then
//! reconciles the disk with it, so there is exactly one definition of what a
//! project contains.

use std::collections::BTreeMap;

use anyhow::Result;
use minijinja::context;

use crate::domain::code_uses;
use crate::domain::events::{EventNames, EventView};
use crate::domain::names::PackageName;
use crate::domain::schedule::ScheduleView;
use crate::engine::manifest::{Answers, Components, DataLayer, Manifest, Owner};
use crate::engine::templates::{Renderer, TemplateFile, template_set};

/// The version of the template set. Bump it whenever any rendered output
/// changes; a test compares the rendered snapshots against this number.
pub const TEMPLATE_SET_VERSION: u32 = 27;

/// The oldest Rust the generated projects build with: their Cargo.toml's
/// `rust-version`, the newest that any of their dependencies declares.
pub(crate) const GENERATED_RUST_VERSION: &str = "1.89";

/// The outbox migration, which the relay cannot work without.
pub(crate) const OUTBOX_MIGRATION: &str = "migrations/20200101000100_outbox.sql";

/// Files outside `src/` and `tests/` that are the user's from the moment
/// they are written. Every file under `src/` and `tests/` (the service's
/// tests) is the user's too; gpkit never rewrites them, it only edits
/// managed regions and dependency tables. Every other file (the kit under
/// `kit/`, its tests in `kit/src/tests/` and `kit/tests/` included, and the
/// migrations) is kit-owned.
const USER_OWNED: &[&str] = &["Cargo.toml", "README.md", ".gitignore"];

/// The folder of the kit crate in a generated project, and its template set.
pub(crate) const KIT_DIR: &str = "kit";

/// The kit's package name in gpkit's own workspace; a project's kit is named
/// after the project (`shop-kit`), so that services can share a workspace.
const KIT_PACKAGE: &str = "gpkit-kit";

/// The template set of files that new projects no longer get, rendered
/// only for a project that records them: `tests/support/mod.rs`, gpkit's
/// own test database of sets 1-5 (a kit file then, the user's since), which
/// the service's tests of those sets declare. New projects' tests use
/// `kit::testing` instead.
const LEGACY_DIR: &str = "legacy";

/// Kit files that template set 5 dropped but that a user's file of an older
/// project still declares (`mod health_check;` in `src/routes/mod.rs`): an
/// upgrade keeps them, as the user's, instead of deleting them.
pub(crate) const NOW_USERS: &[&str] = &["src/routes/health_check.rs"];

/// Who owns the file at `path` of a generated project.
pub(crate) fn owner_of(path: &str) -> Owner {
    if path.starts_with("src/") || path.starts_with("tests/") || USER_OWNED.contains(&path) {
        Owner::User
    } else {
        Owner::Kit
    }
}

/// Which of the tests that gpkit writes with a listener or a schedule
/// (`tests/listeners/`, `tests/schedules/`) the blueprint has. A test is
/// written with what it tests, never later: an upgrade adds none for the
/// listeners and schedules a project had before (a listener filled in may
/// fail on the default event such a test dispatches), and a test the user
/// deleted stays deleted.
#[derive(Debug, Clone, Copy)]
pub enum Tests<'a> {
    /// A new project: every listener and schedule is new.
    All,
    /// An existing project with this manifest: the tests it records, and
    /// those of the listeners and schedules it does not have yet.
    Since(&'a Manifest),
}

impl Tests<'_> {
    /// Whether the project records the file at `path`: a file gpkit no
    /// longer writes in new projects, but still renders for a project that
    /// has it.
    fn recorded(&self, path: &str) -> bool {
        matches!(self, Tests::Since(manifest) if manifest.files.contains_key(path))
    }

    /// Whether the blueprint has the test at `path` of the listener
    /// `listener` of the event `module` (`None`: the schedule `schedule`).
    fn has(&self, path: &str, test_of: TestOf<'_>) -> bool {
        let Tests::Since(manifest) = self else {
            return true;
        };
        let components = &manifest.components;
        let existed = match test_of {
            TestOf::Listener { module, listener } => components.events.iter().any(|e| {
                EventNames::recorded(&e.name).is_ok_and(|names| names.module == module)
                    && e.listeners.iter().any(|l| l == listener)
            }),
            TestOf::Schedule(name) => components.schedules.iter().any(|s| s.name == name),
        };
        !existed || manifest.files.contains_key(path)
    }
}

/// What a test written once tests.
#[derive(Debug, Clone, Copy)]
enum TestOf<'a> {
    Listener { module: &'a str, listener: &'a str },
    Schedule(&'a str),
}

/// One file of the desired project tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlueprintFile {
    pub owner: Owner,
    pub contents: Vec<u8>,
    /// One line on what the file is for, shown in plans.
    pub(crate) purpose: String,
}

/// The desired tree: output path to file, sorted by path.
pub(crate) type Tree = BTreeMap<String, BlueprintFile>;

/// Renders the files that a project with `answers` and `components` has:
/// the kit crate (`kit/`, the same for every project, its parts switched
/// on by Cargo features), the `project` template set, plus the `worker` set
/// when the worker is on and the `deploy` set (container files) when deploy
/// is on. Files shared by several (`lib.rs`, `Cargo.toml`, the container
/// files) switch on the `worker`, `deploy` and `seaorm` variables; the
/// SeaORM data layer is the kit's `seaorm` feature, and its tests are the
/// kit's (`kit/src/tests/`). `tests` says which listeners' and schedules' tests
/// it has, and which files of the `legacy` set an existing project keeps. `src/lib.rs` re-exports the kit's modules of `reexports` under
/// their old paths (`crate::outbox`): none in a new project; in an older
/// one, those its code uses (`user_code::kept_compat_modules`), of
/// [`code_uses::REEXPORTABLE_KIT_MODULES`] only.
pub fn render(
    answers: &Answers,
    components: &Components,
    tests: Tests<'_>,
    reexports: &[&str],
) -> Result<Tree> {
    let name = PackageName::parse(&answers.name)?;
    let seaorm = answers.db == DataLayer::SeaOrm;
    let events = components
        .events
        .iter()
        .map(EventView::new)
        .collect::<Result<Vec<_>>>()?;
    let schedules = components
        .schedules
        .iter()
        .map(|s| ScheduleView::new(s, &events))
        .collect::<Result<Vec<_>>>()?;
    let reexports = code_uses::reexported(reexports, components.worker, seaorm);
    let ctx = context! {
        name => name.as_str(),
        crate_name => name.crate_name(),
        gpkit_version => env!("CARGO_PKG_VERSION"),
        rust_version => GENERATED_RUST_VERSION,
        worker => components.worker,
        deploy => components.deploy,
        seaorm => seaorm,
        events => &events,
        schedules => &schedules,
        kit_reexports => code_uses::reexport_lines(&reexports),
        event_crates => event_crates(&events),
    };
    let renderer = Renderer::new();
    let mut tree = Tree::new();
    let mut sets = vec!["project"];
    if components.worker {
        sets.push("worker");
    }
    if components.deploy {
        sets.push("deploy");
    }
    for set in sets {
        for file in template_set(set)? {
            let contents = renderer.render(&file, &ctx)?;
            let owner = owner_of(file.output);
            let purpose = purpose(file.output, &contents);
            let previous = tree.insert(
                file.output.to_string(),
                BlueprintFile {
                    owner,
                    contents,
                    purpose,
                },
            );
            anyhow::ensure!(
                previous.is_none(),
                "template sets overlap at `{}` (this is a bug in gpkit)",
                file.output
            );
        }
    }
    for file in template_set(LEGACY_DIR)? {
        if tests.recorded(file.output) {
            let contents = renderer.render(&file, &ctx)?;
            let purpose = purpose(file.output, &contents);
            tree.insert(
                file.output.to_string(),
                BlueprintFile {
                    owner: owner_of(file.output),
                    contents,
                    purpose,
                },
            );
        }
    }
    render_kit(&renderer, name.as_str(), &mut tree)?;
    for event in &events {
        render_event(&renderer, &ctx, event, components.worker, &mut tree)?;
    }
    if components.worker {
        for schedule in &schedules {
            render_schedule(&renderer, &ctx, schedule, &mut tree)?;
        }
        render_tests(&renderer, &ctx, &events, &schedules, tests, &mut tree)?;
    }
    Ok(tree)
}

/// The crates that the code of `events` names (`src/events/*.rs`), which
/// the service's `Cargo.toml` lists: serde for the derives, and those of
/// the fields' types (`uuid::Uuid`, `chrono::DateTime`, `serde_json::Value`).
fn event_crates(events: &[EventView]) -> Vec<&'static str> {
    let mut crates = Vec::new();
    if !events.is_empty() {
        crates.push("serde");
    }
    for krate in ["chrono", "serde_json", "uuid"] {
        let prefix = format!("{krate}::");
        if events
            .iter()
            .flat_map(|e| &e.fields)
            .any(|f| f.rust_type.contains(&prefix))
        {
            crates.push(krate);
        }
    }
    crates
}

/// The kit crate, `kit/`: copied from gpkit's own kit crate as it is, but
/// for its package name. Cargo features (`worker`, `seaorm`), chosen by the
/// service's dependency on it, switch its parts on.
fn render_kit(renderer: &Renderer, name: &str, tree: &mut Tree) -> Result<()> {
    for file in template_set(KIT_DIR)? {
        let mut contents = renderer.render(&file, &minijinja::Value::UNDEFINED)?;
        if file.output == "Cargo.toml" {
            contents = kit_manifest(&contents, name)?;
        }
        let path = format!("{KIT_DIR}/{}", file.output);
        let purpose = purpose(&path, &contents);
        tree.insert(
            path,
            BlueprintFile {
                owner: Owner::Kit,
                contents,
                purpose,
            },
        );
    }
    Ok(())
}

/// The kit's `Cargo.toml` for the project `name`: gpkit's own kit manifest
/// `template` (package `gpkit-kit`) with the package named `<name>-kit`.
pub(crate) fn kit_manifest(template: &[u8], name: &str) -> Result<Vec<u8>> {
    let text = std::str::from_utf8(template)?;
    let from = format!("name = \"{KIT_PACKAGE}\"");
    anyhow::ensure!(
        text.contains(&from),
        "the kit's Cargo.toml does not name its package `{KIT_PACKAGE}` (this is a bug in gpkit)"
    );
    Ok(text
        .replacen(&from, &format!("name = \"{name}-kit\""), 1)
        .into_bytes())
}

/// The file of one schedule, `src/schedules/<name>.rs`: the user's, written
/// once, never rewritten.
fn render_schedule(
    renderer: &Renderer,
    ctx: &minijinja::Value,
    schedule: &ScheduleView,
    tree: &mut Tree,
) -> Result<()> {
    let template = template_set("schedule")?
        .into_iter()
        .find(|t| t.output == "schedule.rs")
        .ok_or_else(|| {
            anyhow::anyhow!("gpkit has no template `schedule.rs` (this is a bug in gpkit)")
        })?;
    let path = format!("src/schedules/{}.rs", schedule.name);
    let contents = renderer.render(&template, &context! { schedule => schedule, ..ctx.clone() })?;
    let purpose = purpose(&path, &contents);
    tree.insert(
        path,
        BlueprintFile {
            owner: Owner::User,
            contents,
            purpose,
        },
    );
    Ok(())
}

/// The files of one event: its type, and with the worker its listeners.
/// All are the user's: written once, never rewritten.
fn render_event(
    renderer: &Renderer,
    ctx: &minijinja::Value,
    event: &EventView,
    worker: bool,
    tree: &mut Tree,
) -> Result<()> {
    let templates = template_set("event")?;
    let template = |name: &str| {
        templates
            .iter()
            .find(|t| t.output == name)
            .copied()
            .ok_or_else(|| {
                anyhow::anyhow!("gpkit has no event template `{name}` (this is a bug in gpkit)")
            })
    };
    let mut add = |path: String, file: TemplateFile, ctx: minijinja::Value| -> Result<()> {
        let contents = renderer.render(&file, &ctx)?;
        let purpose = purpose(&path, &contents);
        tree.insert(
            path,
            BlueprintFile {
                owner: Owner::User,
                contents,
                purpose,
            },
        );
        Ok(())
    };
    let event_ctx = context! { event => event, ..ctx.clone() };
    add(
        format!("src/events/{}.rs", event.names.module),
        template("event.rs")?,
        event_ctx.clone(),
    )?;
    if worker && !event.listeners.is_empty() {
        add(
            format!("src/listeners/{}/mod.rs", event.names.module),
            template("listeners_mod.rs")?,
            event_ctx.clone(),
        )?;
        for listener in &event.listeners {
            add(
                format!("src/listeners/{}/{listener}.rs", event.names.module),
                template("listener.rs")?,
                context! { listener => listener, ..event_ctx.clone() },
            )?;
        }
    }
    Ok(())
}

/// The tests of listeners and schedules that `tests` selects, the user's:
/// `tests/listeners/<event>_<listener>.rs` and `tests/schedules/<name>.rs`,
/// each set one test binary (`main.rs`, which declares them in a managed
/// region), written only when it has a test.
fn render_tests(
    renderer: &Renderer,
    ctx: &minijinja::Value,
    events: &[EventView],
    schedules: &[ScheduleView],
    tests: Tests<'_>,
    tree: &mut Tree,
) -> Result<()> {
    let templates = template_set("tests")?;
    let template = |name: &str| {
        templates
            .iter()
            .find(|t| t.output == name)
            .copied()
            .ok_or_else(|| {
                anyhow::anyhow!("gpkit has no test template `{name}` (this is a bug in gpkit)")
            })
    };
    let mut add = |path: String, file: TemplateFile, ctx: minijinja::Value| -> Result<()> {
        let contents = renderer.render(&file, &ctx)?;
        let purpose = purpose(&path, &contents);
        tree.insert(
            path,
            BlueprintFile {
                owner: Owner::User,
                contents,
                purpose,
            },
        );
        Ok(())
    };

    let mut modules = Vec::new();
    for event in events {
        for listener in &event.listeners {
            let module = format!("{}_{listener}", event.names.module);
            let path = format!("tests/listeners/{module}.rs");
            let of = TestOf::Listener {
                module: &event.names.module,
                listener,
            };
            if tests.has(&path, of) {
                add(
                    path,
                    template("listener.rs")?,
                    context! { event => event, listener => listener, ..ctx.clone() },
                )?;
                modules.push(module);
            }
        }
    }
    if !modules.is_empty() {
        add(
            "tests/listeners/main.rs".to_string(),
            template("listeners_main.rs")?,
            context! { modules => modules, ..ctx.clone() },
        )?;
    }

    let mut modules = Vec::new();
    for schedule in schedules {
        let path = format!("tests/schedules/{}.rs", schedule.name);
        if tests.has(&path, TestOf::Schedule(&schedule.name)) {
            add(
                path,
                template("schedule.rs")?,
                context! { schedule => schedule, ..ctx.clone() },
            )?;
            modules.push(schedule.name.clone());
        }
    }
    if !modules.is_empty() {
        add(
            "tests/schedules/main.rs".to_string(),
            template("schedules_main.rs")?,
            context! { modules => modules, ..ctx.clone() },
        )?;
    }
    Ok(())
}

/// A Rust file's purpose is the first line of its `//!` doc comment; other
/// files are described here.
fn purpose(path: &str, contents: &[u8]) -> String {
    if path.ends_with(".rs") {
        let text = String::from_utf8_lossy(contents);
        if let Some(line) = text.lines().find_map(|l| l.strip_prefix("//!")) {
            return line.trim().trim_end_matches('.').to_string();
        }
    }
    let known = match path {
        "Cargo.toml" => "the package manifest: binaries and dependencies",
        "kit/Cargo.toml" => "the kit's package manifest: its features and dependencies",
        "kit/README.md" => {
            "the kit's reference: configuration, the outbox, migrations, traces, tests"
        }
        p if p.starts_with("kit/docs/") => "the kit's reference: the worker's parts",
        "README.md" => "how to configure, migrate and run the service",
        ".gitignore" => "keeps build output and local secrets out of git",
        ".env.example" => "every environment variable the service reads, with defaults",
        "Dockerfile" => "the container image: server, worker and migrate, as a non-root user",
        ".dockerignore" => "keeps build output and secrets out of the image's build context",
        "compose.yaml" => {
            "Postgres, Valkey, migrate, server and worker, with Prometheus, Jaeger and Grafana, for docker compose"
        }
        "deploy/prometheus.yml" => {
            "Prometheus's scrape of the server's and worker's /metrics, for compose"
        }
        "deploy/grafana/outbox.json" => "a Grafana dashboard on the outbox, queue and HTTP metrics",
        p if p.starts_with("deploy/grafana/provisioning/") => {
            "Grafana's data source and dashboards, for compose"
        }
        p if p.starts_with("migrations/") => "goose migration",
        _ => "project file",
    };
    known.to_string()
}

#[cfg(test)]
mod tests {
    use toml_edit::{DocumentMut, Item};

    use super::*;
    use crate::domain::events::{EventSpec, parse_field};

    /// The kit's manifest, which every dependency the service shares with
    /// the kit follows.
    const KIT_MANIFEST: &str = include_str!("../../templates/kit/Cargo.toml");

    /// Dependencies whose features in the service's `Cargo.toml` differ
    /// from the kit's, each with why. Empty: the service names each shared
    /// dependency with the kit's features, so that reading one manifest
    /// tells what the other enables (Cargo unifies them anyway).
    const FEATURE_DIFFERENCES: &[(&str, &str)] = &[];

    /// The service's `Cargo.toml` of every variant: with and without the
    /// worker and SeaORM, with no event and with events whose fields name
    /// every crate an event's type can (`uuid`, `chrono`, `serde_json`).
    fn service_manifests() -> Vec<(String, DocumentMut)> {
        let event = |name: &str, fields: &[&str]| EventSpec {
            name: name.to_string(),
            fields: fields.iter().map(|f| parse_field(f).unwrap()).collect(),
            listeners: vec!["notify".to_string()],
            ordered_by: None,
            listener_options: Default::default(),
        };
        let event_sets = [
            Vec::new(),
            vec![event("orderPlaced", &["order_id:uuid", "sku:string"])],
            vec![
                event("orderPlaced", &["at:datetime"]),
                event("orderShipped", &["payload:Option<json>"]),
            ],
        ];
        let mut manifests = Vec::new();
        for db in [DataLayer::Sqlx, DataLayer::SeaOrm] {
            for worker in [false, true] {
                for events in &event_sets {
                    let answers = Answers {
                        name: "shop".into(),
                        db,
                    };
                    let components = Components {
                        worker,
                        deploy: false,
                        events: events.clone(),
                        schedules: Vec::new(),
                    };
                    let tree = render(&answers, &components, Tests::All, &[]).unwrap();
                    let text = String::from_utf8(tree["Cargo.toml"].contents.clone()).unwrap();
                    let variant = format!("{db:?} worker={worker} events={}", events.len());
                    manifests.push((variant, text.parse().unwrap()));
                }
            }
        }
        manifests
    }

    fn version(item: &Item) -> Option<String> {
        match item.as_str() {
            Some(version) => Some(version.to_string()),
            None => item.get("version")?.as_str().map(str::to_string),
        }
    }

    fn features(item: &Item) -> Vec<String> {
        let mut features: Vec<String> = item
            .get("features")
            .and_then(Item::as_array)
            .into_iter()
            .flatten()
            .filter_map(|f| f.as_str().map(str::to_string))
            .collect();
        features.sort();
        features
    }

    #[test]
    fn the_services_dependencies_follow_the_kits_versions() {
        let kit: DocumentMut = KIT_MANIFEST.parse().unwrap();
        let kit_deps = kit["dependencies"].as_table().unwrap();
        let mut shared = 0;
        for (variant, manifest) in service_manifests() {
            for (name, item) in manifest["dependencies"].as_table().unwrap() {
                let Some(kits) = kit_deps.get(name) else {
                    continue;
                };
                shared += 1;
                assert_eq!(
                    version(item),
                    version(kits),
                    "{variant}: `{name}` has another version than in templates/kit/Cargo.toml"
                );
                let why = FEATURE_DIFFERENCES.iter().find(|(n, _)| *n == name);
                if why.is_none() {
                    assert_eq!(
                        features(item),
                        features(kits),
                        "{variant}: `{name}` has other features than in the kit's Cargo.toml: \
                         make them the same, or say why in FEATURE_DIFFERENCES"
                    );
                }
                assert_eq!(
                    item.get("default-features").and_then(Item::as_bool),
                    kits.get("default-features").and_then(Item::as_bool),
                    "{variant}: `{name}`'s default-features differ from the kit's"
                );
            }
        }
        assert!(shared > 0);
    }

    #[test]
    fn the_service_lists_only_what_its_code_names() {
        for (variant, manifest) in service_manifests() {
            let names: Vec<&str> = manifest["dependencies"]
                .as_table()
                .unwrap()
                .iter()
                .map(|(name, _)| name)
                .collect();
            let mut wanted = vec![
                "anyhow", "axum", "confique", "kit", "sqlx", "tokio", "tracing",
            ];
            if variant.starts_with("SeaOrm") {
                wanted.push("sea-orm");
            }
            if !variant.ends_with("events=0") {
                wanted.push("serde");
            }
            if variant.ends_with("events=1") {
                wanted.push("uuid");
            }
            if variant.ends_with("events=2") {
                wanted.extend(["chrono", "serde_json"]);
            }
            wanted.sort_unstable();
            assert_eq!(names, wanted, "{variant}");
        }
    }
}
