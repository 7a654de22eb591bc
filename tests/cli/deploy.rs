//! `gpkit add deploy` and `new project --deploy`: the container files. No
//! Docker engine runs here, so what can be checked without one is: the
//! same files either way, idempotence, `compose.yaml` parses and refers
//! only to services and images it has and to binaries the project builds,
//! the Dockerfile's shape, and its build stage run as a script against a
//! generated project.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpkit::engine::manifest::{Manifest, Owner};
use predicates::str::contains;
use serde_yaml_ng::Value;

use crate::e2e::{built_from, built_project, cargo_lock, shared_target};
use crate::support::{copy_tree, disk_state, gpkit, new_project, read_tree};

const FILES: [&str; 7] = [
    "Dockerfile",
    ".dockerignore",
    "compose.yaml",
    "deploy/prometheus.yml",
    "deploy/grafana/outbox.json",
    "deploy/grafana/provisioning/datasources/prometheus.yaml",
    "deploy/grafana/provisioning/dashboards/outbox.yaml",
];

/// The services of `compose.yaml` for local observability: no service
/// waits for them, and they are not built here.
const OBSERVABILITY: [&str; 3] = ["prometheus", "jaeger", "grafana"];

#[test]
fn adding_deploy_gives_exactly_what_new_project_deploy_gives() {
    for worker in ["--worker", "--no-worker"] {
        let with = tempfile::tempdir().unwrap();
        let without = tempfile::tempdir().unwrap();
        let expected = new_project(with.path(), &[worker, "--deploy"]);
        let project = new_project(without.path(), &[worker]);
        assert!(!project.join("Dockerfile").exists());

        gpkit(&project)
            .args(["add", "deploy"])
            .assert()
            .success()
            .stderr(contains("The container files are added"));

        assert_eq!(
            read_tree(&project, &[]),
            read_tree(&expected, &[]),
            "{worker}"
        );
        let manifest =
            Manifest::parse(&std::fs::read_to_string(project.join("gpkit.toml")).unwrap()).unwrap();
        assert!(manifest.components.deploy);
        for file in FILES {
            assert_eq!(manifest.files[file].owner, Owner::Kit, "{file}");
        }
    }
}

#[test]
fn a_project_without_deploy_records_nothing_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let project = new_project(dir.path(), &[]);
    let manifest = std::fs::read_to_string(project.join("gpkit.toml")).unwrap();
    assert!(!manifest.contains("deploy"), "{manifest}");
}

#[test]
fn a_second_run_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let project = new_project(dir.path(), &["--deploy"]);
    let before = disk_state(&project, &[]);

    gpkit(&project)
        .args(["add", "deploy"])
        .assert()
        .success()
        .stderr(contains(
            "The container files are already there; nothing to do.",
        ));

    assert_eq!(disk_state(&project, &[]), before);
}

#[test]
fn dry_run_shows_the_plan_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let project = new_project(dir.path(), &[]);
    let before = disk_state(&project, &[]);

    let output = gpkit(&project)
        .args(["--dry-run", "add", "deploy"])
        .output()
        .unwrap();

    let text = String::from_utf8(output.stdout).unwrap();
    assert!(output.status.success());
    for file in FILES {
        assert!(text.contains(&format!("  create  {file} ")), "{text}");
    }
    assert_eq!(disk_state(&project, &[]), before);
}

#[test]
fn a_file_of_the_users_in_the_way_stops_it_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let project = new_project(dir.path(), &[]);
    std::fs::write(project.join("Dockerfile"), "FROM scratch\n").unwrap();
    let before = disk_state(&project, &[]);

    gpkit(&project)
        .args(["add", "deploy"])
        .assert()
        .code(1)
        .stderr(contains(
            "`Dockerfile` already exists and gpkit did not write it",
        ));

    assert_eq!(disk_state(&project, &[]), before);
}

/// The `[[bin]]` names of the project's Cargo.toml.
fn cargo_binaries(project: &Path) -> BTreeSet<String> {
    let manifest = std::fs::read_to_string(project.join("Cargo.toml")).unwrap();
    let mut lines = manifest.lines();
    let mut names = BTreeSet::new();
    while let Some(line) = lines.next() {
        if line.trim() == "[[bin]]" {
            let name = lines
                .next()
                .and_then(|line| line.strip_prefix("name = \""))
                .and_then(|rest| rest.strip_suffix('"'))
                .expect("a [[bin]] starts with its name");
            names.insert(name.to_string());
        }
    }
    names
}

fn string_list(value: &Value) -> Vec<String> {
    value
        .as_sequence()
        .unwrap_or_else(|| panic!("not a list: {value:?}"))
        .iter()
        .map(|item| item.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn compose_refers_only_to_its_own_services_and_images_and_the_projects_binaries() {
    for (flag, servers, app_services) in [
        (
            "--worker",
            &["postgres", "valkey"][..],
            &["migrate", "server", "worker"][..],
        ),
        ("--no-worker", &["postgres"][..], &["migrate", "server"][..]),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let project = new_project(dir.path(), &[flag, "--deploy"]);
        let binaries = cargo_binaries(&project);
        let text = std::fs::read_to_string(project.join("compose.yaml")).unwrap();
        let mut compose: Value = serde_yaml_ng::from_str(&text).unwrap();
        // `<<: *environment`, as compose reads it: the anchor's keys under
        // the service's own.
        compose.apply_merge().unwrap();
        let services = compose["services"].as_mapping().unwrap();
        let names: BTreeSet<String> = services
            .keys()
            .map(|key| key.as_str().unwrap().to_string())
            .collect();
        let expected: BTreeSet<String> = servers
            .iter()
            .chain(app_services)
            .chain(&OBSERVABILITY)
            .map(|s| s.to_string())
            .collect();
        assert_eq!(names, expected, "{flag}");

        // The image built from the Dockerfile, and the servers' images.
        let built: BTreeSet<&str> = services
            .values()
            .filter(|service| service.get("build").is_some())
            .map(|service| service["image"].as_str().unwrap())
            .collect();
        assert_eq!(built, BTreeSet::from(["shop:latest"]), "{flag}");
        for (name, service) in services {
            let name = name.as_str().unwrap();
            let image = service["image"].as_str().unwrap();
            if !app_services.contains(&name) {
                // A third-party image, on a tag of its own: not `latest`.
                let tag = image.rsplit('/').next().unwrap().split_once(':');
                assert!(
                    tag.is_some_and(|(_, tag)| !tag.is_empty() && tag != "latest"),
                    "{name}: `{image}` is not pinned"
                );
            }
            if app_services.contains(&name) {
                assert!(service.get("build").is_some(), "{name} is not built here");
                assert_eq!(image, "shop:latest", "{name}");
                let command = string_list(&service["command"]);
                assert!(
                    binaries.contains(&command[0]),
                    "{name} runs `{}`, which the project does not build ({binaries:?})",
                    command[0]
                );
                let environment = service["environment"].as_mapping().unwrap();
                let url = environment["DATABASE_URL"].as_str().unwrap();
                assert!(url.contains("@postgres:5432/"), "{url}");
                // Valkey only where something uses it: the worker.
                let valkey = (flag == "--worker").then_some("valkey:6379");
                assert_eq!(
                    environment.get("VALKEY_ADDR").and_then(Value::as_str),
                    valkey
                );
                // Spans to the jaeger service, each under a name of its own.
                assert_eq!(
                    environment["OTEL_EXPORTER_OTLP_ENDPOINT"].as_str(),
                    Some("http://jaeger:4318"),
                    "{name}"
                );
                assert_eq!(
                    environment["OTEL_SERVICE_NAME"].as_str(),
                    Some(format!("shop-{name}").as_str())
                );
            } else if servers.contains(&name) {
                assert!(service["healthcheck"]["test"].is_sequence(), "{name}");
                // `gpkit dev --compose` starts only these: nothing else
                // may come up with them.
                assert!(service.get("depends_on").is_none(), "{name} waits");
            }
            if let Some(depends_on) = service.get("depends_on") {
                for (other, condition) in depends_on.as_mapping().unwrap() {
                    let other = other.as_str().unwrap();
                    assert!(
                        names.contains(other),
                        "{name} waits for `{other}`: no such service"
                    );
                    assert!(
                        !OBSERVABILITY.contains(&other),
                        "{name} waits for `{other}`, which the service runs without"
                    );
                    let condition = condition["condition"].as_str().unwrap();
                    let wanted = if other == "migrate" {
                        "service_completed_successfully"
                    } else {
                        "service_healthy"
                    };
                    assert_eq!(condition, wanted, "{name} on {other}");
                }
            }
        }
        assert_eq!(
            string_list(&services["migrate"]["command"]),
            ["migrate", "up"],
            "{flag}"
        );
        for name in app_services.iter().filter(|n| **n != "migrate") {
            assert!(
                services[*name]["depends_on"].get("migrate").is_some(),
                "{name} does not wait for the migrations"
            );
        }
        // No two services publish the same port of the host.
        let mut published = BTreeSet::new();
        for (name, service) in services {
            let name = name.as_str().unwrap();
            for port in service.get("ports").map(string_list).unwrap_or_default() {
                let host = port.split(':').next().unwrap().to_string();
                assert!(published.insert(host), "{name} publishes {port} again");
            }
        }
        // Every named volume a service mounts is declared, and no other
        // (one per server); every file mounted from the project is one
        // that gpkit writes.
        let volumes = compose["volumes"].as_mapping().unwrap();
        assert_eq!(
            volumes.len(),
            servers.len(),
            "{flag}: one volume per server"
        );
        let mut mounted = BTreeSet::new();
        for (name, service) in services {
            let name = name.as_str().unwrap();
            for mount in service.get("volumes").map(string_list).unwrap_or_default() {
                let source = mount.split(':').next().unwrap();
                match source.strip_prefix("./") {
                    Some(path) => {
                        assert!(path.starts_with("deploy/"), "{name} mounts `{source}`");
                        assert!(
                            project.join(path).exists(),
                            "{name} mounts `{source}`, which is not in the project"
                        );
                        assert!(mount.ends_with(":ro"), "{name} may write `{source}`");
                        mounted.insert((name.to_string(), mount.clone()));
                    }
                    None => assert!(
                        volumes.contains_key(source),
                        "volume `{source}` is not declared"
                    ),
                }
            }
        }
        observability(&project, services, app_services, &mounted, flag);

        // The Dockerfile: a build stage, and a runtime stage that copies
        // exactly the project's binaries and runs as a non-root user.
        let dockerfile = std::fs::read_to_string(project.join("Dockerfile")).unwrap();
        let instructions = instructions(&dockerfile);
        let stages: Vec<&str> = instructions
            .iter()
            .filter(|(keyword, _)| keyword == "FROM")
            .map(|(_, args)| args.rsplit(' ').next().unwrap())
            .collect();
        assert_eq!(stages, ["build", "runtime"]);
        let runtime = stage(&instructions, "runtime");
        let copied: BTreeSet<String> = runtime
            .iter()
            .filter(|(keyword, args)| keyword == "COPY" && args.starts_with("--from=build"))
            .flat_map(|(_, args)| {
                let words: Vec<&str> = args.split_whitespace().collect();
                words[1..words.len() - 1]
                    .iter()
                    .map(|path| {
                        path.strip_prefix("/app/target/release/")
                            .unwrap()
                            .to_string()
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(copied, binaries, "{flag}");
        let user = runtime
            .iter()
            .find(|(keyword, _)| keyword == "USER")
            .map(|(_, user)| user.as_str());
        assert!(
            user.is_some_and(|user| user != "root" && user != "0"),
            "{user:?}"
        );
        for (_, run) in stage(&instructions, "build")
            .iter()
            .filter(|(keyword, _)| keyword == "RUN")
            .filter(|(_, run)| run.contains("cargo build"))
        {
            assert!(run.contains("--locked"), "{run}");
        }
    }
}

/// The container port of each port `service` publishes (`host:container`).
fn container_ports(service: &Value) -> Vec<String> {
    service
        .get("ports")
        .map(string_list)
        .unwrap_or_default()
        .iter()
        .map(|port| port.rsplit(':').next().unwrap().to_string())
        .collect()
}

fn yaml_file(project: &Path, path: &str) -> Value {
    serde_yaml_ng::from_str(&std::fs::read_to_string(project.join(path)).unwrap()).unwrap()
}

/// Prometheus, Jaeger and Grafana of `compose.yaml` (`mounted`: each
/// service's mounts from the project): Prometheus scrapes exactly the app
/// services that publish a port (their `/metrics`), Grafana's data source
/// is that Prometheus, and the dashboard's panels use that data source.
fn observability(
    project: &Path,
    services: &serde_yaml_ng::Mapping,
    app_services: &[&str],
    mounted: &BTreeSet<(String, String)>,
    flag: &str,
) {
    let mounts = |name: &str, mount: &str| {
        assert!(
            mounted.contains(&(name.to_string(), mount.to_string())),
            "{name} does not mount `{mount}`: {mounted:?}"
        );
    };

    // Prometheus: every 5 s, `/metrics` of the server (and the worker), on
    // the ports they listen on.
    mounts(
        "prometheus",
        "./deploy/prometheus.yml:/etc/prometheus/prometheus.yml:ro",
    );
    let prometheus = yaml_file(project, "deploy/prometheus.yml");
    assert_eq!(prometheus["global"]["scrape_interval"].as_str(), Some("5s"));
    let mut targets = BTreeSet::new();
    for job in prometheus["scrape_configs"].as_sequence().unwrap() {
        assert_eq!(job["metrics_path"].as_str(), Some("/metrics"), "{job:?}");
        for config in job["static_configs"].as_sequence().unwrap() {
            targets.extend(string_list(&config["targets"]));
        }
    }
    let exporters: BTreeSet<String> = app_services
        .iter()
        .flat_map(|name| {
            container_ports(&services[*name])
                .into_iter()
                .map(move |port| format!("{name}:{port}"))
        })
        .collect();
    assert_eq!(targets, exporters, "{flag}");
    let expected: &[&str] = if flag == "--worker" {
        &["server:8080", "worker:9090"]
    } else {
        &["server:8080"]
    };
    assert_eq!(
        targets,
        expected.iter().map(|t| t.to_string()).collect(),
        "{flag}"
    );
    // On the host, beside the worker's 9090.
    assert_eq!(string_list(&services["prometheus"]["ports"]), ["9092:9090"]);

    // Jaeger: the app services' OTLP endpoint, and its UI.
    assert_eq!(string_list(&services["jaeger"]["ports"]), ["16686:16686"]);

    // Grafana: the data source is the Prometheus above, and the dashboard
    // the provider loads is deploy/grafana/outbox.json.
    for folder in ["datasources", "dashboards"] {
        mounts(
            "grafana",
            &format!(
                "./deploy/grafana/provisioning/{folder}:/etc/grafana/provisioning/{folder}:ro"
            ),
        );
    }
    let dashboards = "/var/lib/grafana/dashboards";
    mounts(
        "grafana",
        &format!("./deploy/grafana/outbox.json:{dashboards}/outbox.json:ro"),
    );
    let sources = yaml_file(
        project,
        "deploy/grafana/provisioning/datasources/prometheus.yaml",
    );
    let sources = sources["datasources"].as_sequence().unwrap();
    assert_eq!(sources.len(), 1);
    let source = &sources[0];
    assert_eq!(source["type"].as_str(), Some("prometheus"));
    let port = container_ports(&services["prometheus"]);
    assert_eq!(
        source["url"].as_str(),
        Some(format!("http://prometheus:{}", port[0]).as_str())
    );
    let uid = source["uid"].as_str().unwrap();
    let providers = yaml_file(
        project,
        "deploy/grafana/provisioning/dashboards/outbox.yaml",
    );
    let providers = providers["providers"].as_sequence().unwrap();
    assert_eq!(providers.len(), 1);
    assert_eq!(providers[0]["type"].as_str(), Some("file"));
    assert_eq!(providers[0]["options"]["path"].as_str(), Some(dashboards));
    assert!(container_ports(&services["grafana"]).contains(&"3000".to_string()));

    // Each panel's and query's data source is that uid, or the dashboard's
    // data source variable when it is set to that uid.
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(project.join("deploy/grafana/outbox.json")).unwrap(),
    )
    .unwrap();
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    let resolve = |reference: &str| -> String {
        match reference
            .strip_prefix("${")
            .and_then(|rest| rest.strip_suffix('}'))
        {
            Some(variable) => {
                let variable = variables
                    .iter()
                    .find(|v| v["name"] == variable)
                    .unwrap_or_else(|| panic!("no variable `{variable}`"));
                assert_eq!(variable["type"], "datasource");
                assert_eq!(variable["query"], "prometheus");
                variable["current"]["value"].as_str().unwrap().to_string()
            }
            None => reference.to_string(),
        }
    };
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(!panels.is_empty());
    for panel in panels {
        let targets = panel["targets"].as_array().unwrap();
        for datasource in std::iter::once(&panel["datasource"])
            .chain(targets.iter().map(|target| &target["datasource"]))
        {
            assert_eq!(datasource["type"], "prometheus", "{}", panel["title"]);
            let reference = datasource["uid"].as_str().unwrap();
            assert_eq!(resolve(reference), uid, "{}", panel["title"]);
        }
    }
}

/// The Dockerfile's instructions (keyword, arguments), continuation lines
/// joined and comments dropped.
fn instructions(dockerfile: &str) -> Vec<(String, String)> {
    let mut joined = Vec::new();
    let mut current = String::new();
    for line in dockerfile.lines() {
        let trimmed = line.trim();
        if current.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => {
                current.push_str(part);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                joined.push(std::mem::take(&mut current));
            }
        }
    }
    joined
        .into_iter()
        .map(|line| {
            let (keyword, args) = line.split_once(' ').unwrap();
            (keyword.to_string(), args.trim().to_string())
        })
        .collect()
}

/// The instructions of the stage named `name`, after its `FROM`.
fn stage<'a>(instructions: &'a [(String, String)], name: &str) -> &'a [(String, String)] {
    let start = instructions
        .iter()
        .position(|(keyword, args)| keyword == "FROM" && args.ends_with(&format!(" AS {name}")))
        .unwrap()
        + 1;
    let end = instructions[start..]
        .iter()
        .position(|(keyword, _)| keyword == "FROM")
        .map_or(instructions.len(), |offset| start + offset);
    &instructions[start..end]
}

/// Whether `.dockerignore` (`patterns`, top-level names, `*` at the end,
/// `!` to re-include) keeps `name` out of the build context.
fn ignored(patterns: &[String], name: &str) -> bool {
    let matches = |pattern: &str| {
        let pattern = pattern.trim_end_matches('/');
        match pattern.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == pattern,
        }
    };
    let mut ignored = false;
    for pattern in patterns {
        match pattern.strip_prefix('!') {
            Some(pattern) if matches(pattern) => ignored = false,
            None if matches(pattern) => ignored = true,
            _ => {}
        }
    }
    ignored
}

/// Copies the build context `context` into `dest`, as `COPY . .` does.
fn copy_context(context: &Path, dest: &Path) {
    let patterns: Vec<String> = std::fs::read_to_string(context.join(".dockerignore"))
        .unwrap()
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_string)
        .collect();
    for entry in std::fs::read_dir(context).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if ignored(&patterns, &name) {
            continue;
        }
        let to = dest.join(&name);
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &to);
        } else {
            std::fs::copy(entry.path(), &to).unwrap();
        }
    }
}

/// The build stage of the generated Dockerfile, run as a script outside
/// Docker against a generated project with its Cargo.lock: `WORKDIR` is a
/// directory of the test's, `COPY` copies from the project (the build
/// context, less what `.dockerignore` names), and each `RUN` runs with
/// `sh -c` there. Two departures, to reuse the compiled dependencies of
/// the shared target: `CARGO_TARGET_DIR` is that target, and `--release`
/// is dropped (the profile changes how the code is optimised, not whether
/// the commands work).
#[test]
#[ignore = "builds a generated project"]
fn the_dockerfiles_build_stage_succeeds_as_a_script() {
    let dir = tempfile::tempdir().unwrap();
    let context = dir.path().join("context");
    copy_tree(built_project(), &context);
    std::fs::remove_dir_all(context.join(".bin")).unwrap();
    gpkit(&context).args(["add", "deploy"]).assert().success();
    assert!(
        context.join("Cargo.lock").is_file(),
        "the project has no Cargo.lock"
    );
    let binaries = cargo_binaries(&context);

    let dockerfile = std::fs::read_to_string(context.join("Dockerfile")).unwrap();
    let instructions = instructions(&dockerfile);
    let root = dir.path().join("image");
    let mut workdir: PathBuf = root.clone();
    // The image's tree is copied in under the lock, newer than any build.
    let _one_at_a_time = cargo_lock(&root);
    let mut builds = 0;
    for (keyword, args) in stage(&instructions, "build") {
        match keyword.as_str() {
            "WORKDIR" => {
                workdir = root.join(args.trim_start_matches('/'));
                std::fs::create_dir_all(&workdir).unwrap();
            }
            "COPY" if args == ". ." => copy_context(&context, &workdir),
            "COPY" => {
                let words: Vec<&str> = args.split_whitespace().collect();
                let (sources, dest) = words.split_at(words.len() - 1);
                let dest = workdir.join(dest[0]);
                std::fs::create_dir_all(&dest).unwrap();
                // As docker does: into the destination folder, by file name.
                for source in sources {
                    let name = Path::new(source).file_name().unwrap();
                    std::fs::copy(context.join(source), dest.join(name)).unwrap();
                }
            }
            "RUN" => {
                let script = args.replace(" --release", "");
                let output = crate::e2e::shared_build(&mut Command::new("sh"))
                    .args(["-c", &script])
                    .current_dir(&workdir)
                    .output()
                    .unwrap();
                assert!(
                    output.status.success(),
                    "`RUN {args}` failed:\n{}",
                    String::from_utf8_lossy(&output.stderr)
                );
                builds += usize::from(script.contains("cargo build"));
            }
            other => panic!("the build stage has `{other}`, which this test does not run"),
        }
    }

    assert_eq!(builds, 2, "a dependency layer and the service");
    let empty = tempfile::tempdir().unwrap();
    for binary in &binaries {
        let built = shared_target().join("debug").join(binary);
        assert!(
            built_from(&built, &workdir),
            "{binary} was not built from the Dockerfile's sources"
        );
        // The stub of the dependency layer exits 0 and says nothing; the
        // service without configuration explains what is missing.
        let output = Command::new(&built)
            .env_clear()
            .current_dir(empty.path())
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success() && !said.trim().is_empty(),
            "{binary} is the stub, not the service: {output:?}"
        );
    }
    // The runtime stage copies the migrations from the build context.
    assert!(
        stage(&instructions, "runtime")
            .iter()
            .any(|(keyword, args)| keyword == "COPY" && args == "migrations ./migrations")
    );
    assert!(context.join("migrations").is_dir());
}
