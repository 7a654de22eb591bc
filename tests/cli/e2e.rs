//! End to end: generate a project, build it, run its checks and its own
//! tests (the service's: the kit's tests are run once, in gpkit's
//! workspace, by `scripts/test`), and run its `migrate` binary against a
//! real Postgres.
//!
//! Generated projects share one cargo target directory
//! (`target/generated`), so dependencies compile once per machine. Postgres
//! comes from `DATABASE_URL`, by default the local server.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::SystemTime;

use crate::kit_migrations::{KIT, file_name, kit_files, kit_versions, newest_kit_version};
use crate::support::{gpkit, repo};

/// The Postgres server the tests use (any database on it; tests create their own).
pub fn server_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_string())
}

/// `server_url()` with its database replaced by `database`.
pub fn database_url(database: &str) -> String {
    let server = server_url();
    let base = server.rsplit_once('/').map(|(b, _)| b).unwrap_or(&server);
    format!("{base}/{database}")
}

pub use crate::sql::psql;

/// The shared target directory for generated projects.
pub fn shared_target() -> PathBuf {
    repo().join("target/generated")
}

/// How every build of a generated project in the tests is made, the same
/// everywhere so that they share their dependencies in [`shared_target`]:
/// one-shot builds (incremental state would only fill the disk), with line
/// tables only for debug info (a fifth less build time; the absolute paths
/// that [`built_from`] looks for stay in the binaries).
pub const BUILD_ENV: [(&str, &str); 2] = [
    ("CARGO_INCREMENTAL", "0"),
    ("CARGO_PROFILE_DEV_DEBUG", "line-tables-only"),
];

/// Global arguments of every cargo run in [`cargo`]: the dependencies built
/// without debug info, as the projects of template set 5 and later declare
/// (`[profile.dev.package."*"]`), in every project. A project of an older
/// set (the upgrade fixtures) lacks that table; without this, its build,
/// clippy and tests would compile every dependency again in a profile of
/// their own, about 80 s a project on CI's machine.
const DEPENDENCY_PROFILE: [&str; 2] = ["--config", "profile.dev.package.\"*\".debug=false"];

/// Arguments of a cargo run of gpkit's workspace that builds the kit
/// (`-p gpkit-kit`) in [`shared_target`], as `scripts/test` does: the
/// workspace optimises sha2 for gpkit's own hashing, a generated project
/// does not, and with the default back the kit's dependencies (sqlx and
/// what it depends on included) are the very ones the generated projects
/// build with.
pub const KIT_AS_GENERATED: [&str; 2] = ["--config", "profile.dev.package.sha2.opt-level=0"];

/// Cargo runs one at a time: generated packages share the target directory,
/// where binaries of the same name (`server`, `worker`) overwrite each other.
static CARGO: Mutex<SharedTarget> = Mutex::new(SharedTarget {
    services: BTreeMap::new(),
    kits: BTreeMap::new(),
});

/// What the shared target was last built from: by package name, the
/// project whose service package of that name cargo built last and, by kit
/// package name, the files every build of a kit of that name since the
/// time beside them was made from.
struct SharedTarget {
    services: BTreeMap<String, PathBuf>,
    kits: BTreeMap<String, (KitFiles, SystemTime)>,
}

/// The files of a project's `kit/`, by path, with their bytes.
type KitFiles = BTreeMap<String, Vec<u8>>;

/// Holds the lock that lets one cargo run at a time in the shared target;
/// dropping it ends the hold.
pub struct CargoLock {
    target: MutexGuard<'static, SharedTarget>,
    project: PathBuf,
    /// When the lock was taken, and the suite's cargo time then (see
    /// [`log_lock_hold`]).
    taken: (std::time::Instant, u64),
}

/// Milliseconds spent in cargo runs of the suite so far (see [`run_cargo`]).
static CARGO_MILLIS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Holds the lock that lets one cargo run at a time, for a cargo run in
/// `project`; when cargo last built another project of its package's name
/// (or the name cannot be read), `project`'s files are first made newer
/// than anything in the shared target, except its kit's when they are byte
/// for byte the kit of that name the target was last built from.
///
/// Cargo names a package's outputs by its name and version, not its path,
/// and takes them as up to date when none of the sources they were built
/// from is newer. The tests' projects share names (`shop`): a project made
/// before another one of the same name was built would be taken as built,
/// and its build, tests or clippy would run on the other project's outputs.
/// Projects of other names have outputs of their own (a binary of the same
/// name, `server`, is copied again from them by every build, fresh or not),
/// so a project's builds between theirs compile nothing again.
///
/// Most projects' kits are the same files (the kit does not depend on the
/// project's options), and compiling the kit is most of a project's build.
/// So a kit equal to the one every build of a kit of its name since a time
/// was made from is given that time instead of now: a kit output made
/// since then was made from these very files and is reused, an older one
/// is not. A kit that is not that one is made newer than everything, and
/// becomes it. A kit that changes while the lock is held (made or edited
/// by the holder) leaves none of its name to reuse. Cargo also records the
/// workspace manifest among the kit's sources, by its absolute path
/// (clippy's driver reads it): a kit is reused only while the project it
/// was last built in still exists, so a test that builds several projects
/// in turn keeps their directories until it ends.
pub fn cargo_lock(project: &Path) -> CargoLock {
    assert!(
        std::env::var_os("GPKIT_TEST_QUICK").is_none(),
        "this test builds a generated project, which the quick run leaves out: \
         mark it #[ignore = \"builds a generated project\"] (scripts/test runs it)"
    );
    build_shared_projects_ahead();
    let mut target = CARGO
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let taken = (
        std::time::Instant::now(),
        CARGO_MILLIS.load(std::sync::atomic::Ordering::Relaxed),
    );
    lock_versions_as_the_workspace(project);
    let now = SystemTime::now();
    let service = std::fs::read_to_string(project.join("Cargo.toml"))
        .ok()
        .and_then(|manifest| package_name(&manifest));
    let last_built = service.as_ref().and_then(|name| target.services.get(name));
    if last_built.map(PathBuf::as_path) != Some(project) {
        touch_tree(project, &["kit"], now);
        if let Some(name) = service {
            target.services.insert(name, project.to_path_buf());
        }
    }
    let kit_dir = project.join("kit");
    match read_kit(&kit_dir) {
        Some((Some(name), files)) => match target.kits.get(&name) {
            Some((built, stamp)) if *built == files => {
                touch_tree(&kit_dir, &[], *stamp);
                // Clippy's driver lists the workspace's manifest among the
                // kit's sources (for its lint settings), which are the same
                // in every project here.
                touch(&project.join("Cargo.toml"), *stamp);
            }
            _ => {
                touch_tree(&kit_dir, &[], now);
                target.kits.insert(name, (files, now));
            }
        },
        // A kit of no name we can read could be of any name.
        Some((None, _)) => {
            touch_tree(&kit_dir, &[], now);
            target.kits.clear();
        }
        None => {}
    }
    CargoLock {
        target,
        project: project.to_path_buf(),
        taken,
    }
}

impl Drop for CargoLock {
    fn drop(&mut self) {
        log_lock_hold(self.taken);
        let Some((name, files)) = read_kit(&self.project.join("kit")) else {
            return;
        };
        let Some(name) = name else {
            self.target.kits.clear();
            return;
        };
        let target = &mut *self.target;
        if target
            .kits
            .get(&name)
            .is_some_and(|(built, _)| *built != files)
        {
            target.kits.remove(&name);
        }
    }
}

/// Starts, once, a thread that builds the projects several tests share
/// (`SHARED_PROJECTS` in main.rs), when `GPKIT_TEST_PREBUILD` is set (by
/// scripts/test's full run, not when a few tests are run): their tests then
/// find them built. A build that fails there fails again, with its message,
/// in the first test that asks for it. Called by the first build and by the
/// first Go peer's build ([`crate::go_peers::go_peer`]): the run's first
/// tests build a Go peer first, which on a new machine takes half a minute.
pub(crate) fn build_shared_projects_ahead() {
    static STARTED: std::sync::Once = std::sync::Once::new();
    if std::env::var_os("GPKIT_TEST_PREBUILD").is_none() {
        return;
    }
    STARTED.call_once(|| {
        std::thread::Builder::new()
            .name("(shared projects, built ahead)".into())
            .spawn(|| {
                for build in crate::SHARED_PROJECTS {
                    let _ = std::panic::catch_unwind(build);
                }
            })
            .unwrap();
    });
}

/// Gives `project`, when it is a Cargo project without a `Cargo.lock`, a
/// copy of gpkit's: cargo keeps the versions it names that still fit and
/// resolves the rest, so a project's dependencies are the versions the
/// kit's tests compiled in [`shared_target`] (`scripts/test`), not whatever
/// the registry holds that day, and are built once for both.
fn lock_versions_as_the_workspace(project: &Path) {
    let lock = project.join("Cargo.lock");
    if project.join("Cargo.toml").is_file() && !lock.exists() {
        std::fs::copy(repo().join("Cargo.lock"), &lock).unwrap();
    }
}

/// The package name (when it can be read) and the files of the kit at
/// `kit`; `None` when there is none.
fn read_kit(kit: &Path) -> Option<(Option<String>, KitFiles)> {
    if !kit.is_dir() {
        return None;
    }
    let files = crate::support::read_tree(kit, &["target"]);
    let name = files
        .get("Cargo.toml")
        .and_then(|manifest| package_name(&String::from_utf8_lossy(manifest)));
    Some((name, files))
}

/// The `name` of a manifest's `[package]` table.
fn package_name(manifest: &str) -> Option<String> {
    let table: toml_edit::DocumentMut = manifest.parse().ok()?;
    Some(table.get("package")?.get("name")?.as_str()?.to_string())
}

/// Sets the modification time of every file under `dir` (none when it does
/// not exist) to `now`, leaving out the top-level entries `skip` names and
/// what cargo writes and gpkit keeps.
fn touch_tree(dir: &Path, skip: &[&str], now: SystemTime) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let entry = entry.unwrap();
        let path = entry.path();
        let kind = entry.file_type().unwrap();
        let name = entry.file_name();
        if skip.iter().any(|skipped| name == *skipped) {
            continue;
        }
        if kind.is_dir() {
            if !matches!(name.to_str(), Some("target" | ".bin" | ".git" | ".gpkit")) {
                touch_tree(&path, &[], now);
            }
        } else if kind.is_file() {
            touch(&path, now);
        }
    }
}

/// Sets the modification time of the file at `path` to `time`.
fn touch(path: &Path, time: SystemTime) {
    std::fs::File::open(path)
        .and_then(|file| file.set_modified(time))
        .unwrap_or_else(|err| panic!("cannot touch {}: {err}", path.display()));
}

/// Clippy's driver, the compiler `cargo clippy` runs on a workspace's own
/// packages: from the toolchain's sysroot, next to `rustc`.
fn clippy_driver() -> &'static Path {
    static DRIVER: OnceLock<PathBuf> = OnceLock::new();
    DRIVER.get_or_init(|| {
        let sysroot = Command::new("rustc")
            .args(["--print", "sysroot"])
            .output()
            .expect("rustc runs");
        let driver =
            Path::new(String::from_utf8(sysroot.stdout).unwrap().trim()).join("bin/clippy-driver");
        assert!(
            driver.is_file(),
            "no {}: install clippy (`rustup component add clippy`)",
            driver.display()
        );
        driver
    })
}

/// The arguments clippy's driver takes from `cargo clippy -- -D warnings`.
const CLIPPY_ARGS: &str = "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__";

/// Sets up `command` (cargo, or a process that runs cargo: `gpkit dev`, a
/// shell) to build a generated project as every build of the tests does:
/// in [`shared_target`] with [`BUILD_ENV`], the project's own packages
/// through clippy's driver with `-D warnings` (see [`lint`]), and without
/// what would change the build: RUSTFLAGS, and the RUSTC_BOOTSTRAP that
/// scripts/test gives the test binaries for libtest's times (it allows
/// unstable features, which a user's build does not, and cargo
/// fingerprints it). Nor the variables cargo gave this test binary about
/// gpkit's own package (`CARGO_MANIFEST_DIR`, `CARGO_PKG_NAME`, ...):
/// build scripts that read them (ring's, for one) tell cargo to rebuild
/// when they change, so with them every crate that depends on such a
/// script would be compiled again here rather than shared with the kit's
/// builds in `scripts/test`, which has none.
pub fn shared_build(command: &mut Command) -> &mut Command {
    without_this_packages_cargo_env(command)
        .env("CARGO_TARGET_DIR", shared_target())
        .envs(BUILD_ENV)
        .env("RUSTC_WORKSPACE_WRAPPER", clippy_driver())
        .env("CLIPPY_ARGS", CLIPPY_ARGS)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .env_remove("RUSTC_BOOTSTRAP")
}

/// `command` without the variables cargo set for gpkit's own tests (see
/// [`set_by_cargo_for_this_package`]), which a generated project's build
/// or tests would read as theirs.
fn without_this_packages_cargo_env(command: &mut Command) -> &mut Command {
    for (name, _) in std::env::vars_os() {
        if set_by_cargo_for_this_package(&name.to_string_lossy()) {
            command.env_remove(name);
        }
    }
    command
}

/// Whether `name` is one of the variables cargo sets for a package's
/// build script, test or binary to read about that package (see cargo's
/// "Environment variables Cargo sets for crates").
fn set_by_cargo_for_this_package(name: &str) -> bool {
    ["CARGO_PKG_", "CARGO_MANIFEST_", "CARGO_BIN_"]
        .iter()
        .any(|prefix| name.starts_with(prefix))
        || [
            "CARGO_CRATE_NAME",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_TARGET_TMPDIR",
            "OUT_DIR",
        ]
        .contains(&name)
}

/// `cargo clippy --all-targets -- -D warnings` in `project`, as a build.
///
/// Every cargo run of the tests compiles a project's own packages (the
/// service and its kit, the workspace's members) with clippy's driver and
/// `-D warnings`, as `cargo clippy` does (its `RUSTC_WORKSPACE_WRAPPER`
/// and `CLIPPY_ARGS`), so that any build, test run included, fails on a
/// lint or a warning. Clippy's own run would check every dependency again
/// in a compilation of its own (about 35 s a set of dependencies on CI's
/// machine); this build of all targets lints the same targets and shares
/// its compilation with the binaries and the tests, before or after it.
pub fn lint(project: &Path) {
    cargo(project, &["build", "--all-targets"]);
}

/// `cargo <args>` in `project`, with the shared target directory. A
/// `cargo test` runs its tests after the build lock is released (see
/// [`test_after_the_lock`]).
pub fn cargo(project: &Path, args: &[&str]) -> Output {
    let one_at_a_time = cargo_lock(project);
    if args.first() == Some(&"test") {
        return succeeded(
            project,
            args,
            test_after_the_lock(one_at_a_time, project, args),
        );
    }
    cargo_unlocked(project, args)
}

/// Builds `project` and copies its binaries to `<project>/.bin/`, so that
/// later builds of other projects cannot replace them under a test.
///
/// Another test run sharing `target/generated` (another checkout) may build a
/// project with the same binary names between this build and the copy, and
/// `debug/<name>` is then its binary: a copy that was not built from
/// `project` (see [`built_from`]) is made again after re-running cargo.
pub fn build_binaries(project: &Path) -> PathBuf {
    let _one_at_a_time = cargo_lock(project);
    build_binaries_locked(project)
}

/// Builds `project` (all its targets, linted: see [`lint`]) and copies its
/// binaries as [`build_binaries`] does, checks its formatting and runs its
/// own tests, all in one hold of the build lock: another project of the
/// same name built in between would make cargo compile this one again for
/// its tests. Its binaries' directory and the output of its tests.
pub fn build_and_test(project: &Path) -> (PathBuf, Output) {
    let one_at_a_time = cargo_lock(project);
    let bins = build_binaries_locked(project);
    cargo_unlocked(project, &["fmt", "--check"]);
    let tests = test_after_the_lock(one_at_a_time, project, &["test"]);
    (bins, succeeded(project, &["test"], tests))
}

/// `cargo <args>` (`test` and its options) in `project`, the build lock
/// `one_at_a_time` held for the build and released for the run: the tests
/// are built (`--no-run`) and their binaries copied to `<project>/.bin/tests/`
/// (another project of the same name built next would replace them in the
/// shared target), and the doc tests run, under the lock; then the lock
/// is dropped, and each binary runs as `cargo test` runs it (in the
/// package's directory, with `CARGO_MANIFEST_DIR`), every one of them
/// (`--no-fail-fast`). The chain of builds goes on meanwhile, where it
/// waited for the tests before (about 50 s a run of the suite). Returns
/// the build's output if it failed, else each binary's, one after the
/// other, failed if one failed.
fn test_after_the_lock(one_at_a_time: CargoLock, project: &Path, args: &[&str]) -> Output {
    let options: Vec<&str> = args[1..]
        .iter()
        .copied()
        .filter(|option| *option != "--no-fail-fast")
        .collect();
    let mut build = vec![
        "test",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ];
    build.extend(&options);
    let built = run_cargo(project, &build);
    if !built.status.success() {
        return built;
    }
    let copies = project.join(".bin/tests");
    std::fs::create_dir_all(&copies).unwrap();
    let mut binaries = Vec::new();
    for line in String::from_utf8_lossy(&built.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let Some(executable) = message["executable"].as_str() else {
            continue;
        };
        if message["reason"] != "compiler-artifact" || message["profile"]["test"] != true {
            continue;
        }
        let executable = Path::new(executable);
        let copy = copies.join(executable.file_name().unwrap());
        std::fs::copy(executable, &copy).unwrap();
        binaries.push(copy);
    }
    // Doc tests where cargo would run them: a library, no target named.
    let mut output = if options.is_empty() && project.join("src/lib.rs").is_file() {
        run_cargo(project, &["test", "--doc"])
    } else {
        Output {
            status: built.status,
            stdout: Vec::new(),
            stderr: Vec::new(),
        }
    };
    drop(one_at_a_time);
    for binary in binaries {
        let run = without_this_packages_cargo_env(&mut Command::new(&binary))
            .current_dir(project)
            .env("CARGO_MANIFEST_DIR", project)
            .env("DATABASE_URL", server_url())
            .env_remove("RUSTC_BOOTSTRAP")
            .output()
            .unwrap();
        output
            .stdout
            .extend(format!("     Running {}\n", binary.display()).bytes());
        output.stdout.extend(run.stdout);
        output.stderr.extend(run.stderr);
        if output.status.success() {
            output.status = run.status;
        }
    }
    output
}

/// `output`, of `cargo <args>` in `project`, checked to have succeeded.
fn succeeded(project: &Path, args: &[&str], output: Output) -> Output {
    assert!(
        output.status.success(),
        "`cargo {}` failed in {}:\n{}\n{}",
        args.join(" "),
        project.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// [`build_binaries`], the build lock held by the caller.
fn build_binaries_locked(project: &Path) -> PathBuf {
    let bins = project.join(".bin");
    std::fs::create_dir_all(&bins).unwrap();
    // Every binary of the project: the kit's and any a test added.
    let names: Vec<String> = std::fs::read_dir(project.join("src/bin"))
        .unwrap()
        .filter_map(|entry| {
            let path = entry.unwrap().path();
            (path.extension()? == "rs").then(|| path.file_stem().unwrap().to_string_lossy().into())
        })
        .collect();
    for attempt in 1..=5 {
        let build = cargo_unlocked(project, &["build", "--all-targets"]);
        let stderr = String::from_utf8_lossy(&build.stderr);
        assert!(
            !stderr.contains("warning"),
            "the build has warnings:\n{stderr}"
        );
        let mut all_ours = true;
        for name in &names {
            let copy = bins.join(name);
            std::fs::copy(shared_target().join("debug").join(name), &copy).unwrap();
            all_ours &= built_from(&copy, project);
        }
        if all_ours {
            return bins;
        }
        eprintln!(
            "attempt {attempt}: another project's binary was in the shared target; rebuilding"
        );
    }
    panic!(
        "the binaries in {} kept being replaced by other projects' builds",
        shared_target().display()
    );
}

/// Whether `binary` was built from `project`: a debug build names the
/// directory it was compiled in (the package root) in its debug info.
///
/// grep searches the binary (tens of MB each, four or more a project,
/// while the build lock is held): a byte-by-byte search in this unoptimised
/// test binary took seconds a project.
pub fn built_from(binary: &Path, project: &Path) -> bool {
    let root = project.canonicalize().unwrap();
    let status = Command::new("grep")
        .args(["-q", "-F", "-e"])
        .arg(&root)
        .arg(binary)
        .status()
        .expect("grep runs");
    match status.code() {
        Some(0) => true,
        Some(1) => false,
        _ => panic!("grep could not read {}", binary.display()),
    }
}

/// `cargo <args>` in `project`, with the shared target directory, expected
/// to fail (a test that should): its output, stdout then stderr.
pub fn cargo_failing(project: &Path, args: &[&str]) -> String {
    let output = {
        let one_at_a_time = cargo_lock(project);
        if args.first() == Some(&"test") {
            test_after_the_lock(one_at_a_time, project, args)
        } else {
            run_cargo(project, args)
        }
    };
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        !output.status.success(),
        "`cargo {}` succeeded in {}, but should have failed:\n{text}",
        args.join(" "),
        project.display(),
    );
    text
}

fn cargo_unlocked(project: &Path, args: &[&str]) -> Output {
    succeeded(project, args, run_cargo(project, args))
}

fn run_cargo(project: &Path, args: &[&str]) -> Output {
    let started = std::time::Instant::now();
    let output = shared_build(Command::new(env!("CARGO")).args(DEPENDENCY_PROFILE))
        .args(args)
        .current_dir(project)
        .env("DATABASE_URL", server_url())
        .output()
        .unwrap();
    let took = started.elapsed();
    CARGO_MILLIS.fetch_add(
        took.as_millis() as u64,
        std::sync::atomic::Ordering::Relaxed,
    );
    log_cargo_run(args, took, &output.stderr);
    output
}

/// Appends one line to the cargo log (see [`log_cargo_run`]) for a hold of
/// the lock that is longer than the suite's cargo runs in it: the time the
/// chain of builds waited on a test (its processes, or `gpkit dev`'s own
/// builds, which the suite does not run itself).
fn log_lock_hold((taken, cargo_millis): (std::time::Instant, u64)) {
    let held = taken.elapsed();
    let in_cargo = CARGO_MILLIS.load(std::sync::atomic::Ordering::Relaxed) - cargo_millis;
    let outside = held.as_secs_f64() - in_cargo as f64 / 1000.0;
    if outside >= 1.0 {
        append_to_cargo_log(&format!(
            "{outside:.1}\t{}\t(the lock held outside cargo)\t\t{:.1}\n",
            std::thread::current().name().unwrap_or("?"),
            seconds_since_epoch(),
        ));
    }
}

/// Appends one line (seconds, the test's name, the arguments, the packages
/// compiled or checked, when it ended) to the file `GPKIT_TEST_CARGO_LOG`
/// names, when it names one: where the suite's serialized cargo time goes.
fn log_cargo_run(args: &[&str], took: std::time::Duration, stderr: &[u8]) {
    let thread = std::thread::current();
    let name = thread.name().unwrap_or("?");
    let compiled: Vec<&str> = std::str::from_utf8(stderr)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let rest = line
                .strip_prefix("Compiling ")
                .or_else(|| line.strip_prefix("Checking "))?;
            rest.split(' ').next()
        })
        .collect();
    append_to_cargo_log(&format!(
        "{:.1}\t{name}\t{}\t{}\t{:.1}\n",
        took.as_secs_f64(),
        args.join(" "),
        compiled.join(" "),
        seconds_since_epoch(),
    ));
}

/// Now, in seconds since the Unix epoch: when a line of the cargo log was
/// written (its run's end), for the timeline scripts/test-report draws.
fn seconds_since_epoch() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Appends `line` to the file `GPKIT_TEST_CARGO_LOG` names, if any.
fn append_to_cargo_log(line: &str) {
    use std::io::Write;
    let Some(log) = std::env::var_os("GPKIT_TEST_CARGO_LOG") else {
        return;
    };
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .and_then(|mut file| file.write_all(line.as_bytes()))
        .unwrap();
}

/// A database that is dropped when the value goes out of scope.
pub struct Database {
    pub name: String,
}

impl Database {
    pub fn create(prefix: &str) -> Self {
        let name = format!("{prefix}_{}_{}", std::process::id(), rand_suffix());
        psql(&server_url(), &format!("CREATE DATABASE \"{name}\""));
        Self { name }
    }

    pub fn url(&self) -> String {
        database_url(&self.name)
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        crate::sql::forget(&self.url());
        // Not `psql`: a drop never panics (it may run while a test unwinds).
        let drop = format!("DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)", self.name);
        let _ = crate::sql::query(&server_url(), &drop);
    }
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
        % 1_000_000_000
}

pub fn migrate(project: &Path, db: &Database, args: &[&str]) -> Output {
    let output = Command::new(project.join(".bin/migrate"))
        .args(args)
        .current_dir(project)
        .env("DATABASE_URL", db.url())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "`migrate {}` failed:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Two packages of one name, the second written first: after the first is
/// built, cargo runs in the second build from its own sources, not take
/// the first one's outputs as its own (see [`cargo_lock`]).
#[test]
#[ignore = "builds a generated project"]
fn a_project_written_before_another_of_its_name_was_built_is_built_from_its_own_sources() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str| {
        let root = dir.path().join(name);
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::write(
            root.join("Cargo.toml"),
            "[package]\nname = \"gpkit-same-name\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n\
             [[bin]]\nname = \"gpkit-which-project\"\npath = \"src/main.rs\"\n",
        )
        .unwrap();
        std::fs::write(
            root.join("src/main.rs"),
            format!("fn main() {{\n    print!(\"{name}\");\n}}\n"),
        )
        .unwrap();
        root
    };
    let second = write("second");
    std::thread::sleep(std::time::Duration::from_millis(20));
    let first = write("first");
    let which = || {
        let output = Command::new(shared_target().join("debug/gpkit-which-project"))
            .output()
            .unwrap();
        String::from_utf8(output.stdout).unwrap()
    };
    cargo(&first, &["build"]);
    assert_eq!(which(), "first");
    cargo(&second, &["build"]);
    assert_eq!(which(), "second");
}

/// Projects of one name whose kits (a workspace member of one name too)
/// differ are each built from their own kit, whatever the order; a
/// project whose kit is byte for byte the one of its name built last
/// reuses its outputs, not compiling it again, even after a build of a
/// kit of another name (see [`cargo_lock`]).
#[test]
#[ignore = "builds a generated project"]
fn a_kit_is_rebuilt_when_its_files_differ_and_reused_when_they_are_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let write = |folder: &str, kit: &str, kit_package: &str| {
        let root = dir.path().join(folder);
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::create_dir_all(root.join("kit/src")).unwrap();
        std::fs::write(
            root.join("Cargo.toml"),
            format!(
                "[package]\nname = \"gpkit-same-kit\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n\
                 [workspace]\nmembers = [\"kit\"]\n\n\
                 [[bin]]\nname = \"gpkit-which-kit\"\npath = \"src/main.rs\"\n\n\
                 [dependencies]\nkit = {{ package = \"{kit_package}\", path = \"kit\" }}\n"
            ),
        )
        .unwrap();
        std::fs::write(
            root.join("src/main.rs"),
            "fn main() {\n    print!(\"{}\", kit::NAME);\n}\n",
        )
        .unwrap();
        std::fs::write(
            root.join("kit/Cargo.toml"),
            format!(
                "[package]\nname = \"{kit_package}\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n\
                 [lib]\nname = \"kit\"\n"
            ),
        )
        .unwrap();
        std::fs::write(
            root.join("kit/src/lib.rs"),
            format!("pub const NAME: &str = \"{kit}\";\n"),
        )
        .unwrap();
        root
    };
    let which = || {
        let output = Command::new(shared_target().join("debug/gpkit-which-kit"))
            .output()
            .unwrap();
        String::from_utf8(output.stdout).unwrap()
    };
    let kit_compiled = |build: &Output| {
        String::from_utf8_lossy(&build.stderr).contains("Compiling gpkit-same-kit-kit ")
    };
    // Written before the first build, each with its kit's files older than
    // every output the builds below make.
    let kit = "gpkit-same-kit-kit";
    let (first, second, first_again, second_again, other) = (
        write("first", "first", kit),
        write("second", "second", kit),
        write("first-again", "first", kit),
        write("second-again", "second", kit),
        write("other", "other", "gpkit-same-kit-other-kit"),
    );

    cargo(&first, &["build"]);
    assert_eq!(which(), "first");
    let build = cargo(&second, &["build"]);
    assert_eq!(which(), "second");
    assert!(kit_compiled(&build), "a different kit was taken as built");
    let build = cargo(&first_again, &["build"]);
    assert_eq!(which(), "first");
    assert!(
        kit_compiled(&build),
        "the kit built before the last was reused"
    );
    let build = cargo(&first, &["build"]);
    assert_eq!(which(), "first");
    assert!(!kit_compiled(&build), "the same kit was compiled again");
    cargo(&other, &["build"]);
    assert_eq!(which(), "other");
    let build = cargo(&first_again, &["build"]);
    assert_eq!(which(), "first");
    assert!(
        !kit_compiled(&build),
        "a kit of another name in between made the same kit compile again:\n{}",
        String::from_utf8_lossy(&build.stderr)
    );
    let build = cargo(&second_again, &["build"]);
    assert_eq!(which(), "second");
    assert!(kit_compiled(&build));
}

#[test]
#[ignore = "builds a generated project"]
fn a_project_without_the_worker_builds_cleanly_and_passes_its_tests() {
    let dir = tempfile::tempdir().unwrap();
    gpkit(dir.path())
        .args(["new", "project", "lean", "--no-worker"])
        .assert()
        .success();
    let project = dir.path().join("lean");
    build_and_test(&project);
}

/// The oldest and the three newest release fixtures (one project of a
/// template set each, with the user's edits of
/// `scripts/make-upgrade-fixtures`) upgrade to the current set with exactly
/// the conflicts each declares, keeping every edit it declares
/// (`tests/fixtures/upgrade/expectations.toml`), and then compile: all
/// their targets, linted with `-D warnings` (see [`lint`]), and
/// `fmt --check`. (Their own tests are not run: a `cargo test` compiled the
/// service again, 39 s of the chain; an upgraded project's tests run in
/// [`an_upgraded_project_builds_and_passes_its_tests`].)
/// Every other fixture's upgrade is checked the same way, without a
/// compile, by `upgrade::release_fixtures_upgrade_to_the_current_templates`;
/// `scripts/upgrade-check` compiles every one here, before each release
/// (`GPKIT_COMPILE_RELEASE_FIXTURES=all`, or the names of some): each is a
/// build in CI's chain of builds.
/// A line a fixture, with its time, goes to stderr.
#[test]
#[ignore = "builds a generated project"]
fn the_release_fixtures_upgrade_keep_their_edits_and_the_oldest_and_newest_build() {
    use crate::release_fixtures::{Expectations, release_fixtures};
    let expectations = Expectations::load();
    let mut releases = release_fixtures();
    assert!(releases.len() >= 4, "{releases:?}");
    match std::env::var("GPKIT_COMPILE_RELEASE_FIXTURES").as_deref() {
        Ok("all") => {}
        Ok(names) => {
            let named: Vec<String> = names.split_whitespace().map(String::from).collect();
            for name in &named {
                assert!(releases.contains(name), "{name} is no release fixture");
            }
            releases.retain(|release| named.contains(release));
            assert!(
                !releases.is_empty(),
                "GPKIT_COMPILE_RELEASE_FIXTURES names no fixture: `all` or their names"
            );
        }
        Err(_) => {
            let newest = releases.split_off(releases.len() - 3);
            releases.truncate(1);
            releases.extend(newest);
        }
    }

    // Every fixture's directory lives until the test ends: the kit built
    // from one is reused by the next (the same files, see `cargo_lock`)
    // only while the workspace manifest it was linted with still exists
    // where cargo recorded it.
    let mut dirs = Vec::new();
    let mut failed = Vec::new();
    let started = std::time::Instant::now();
    for release in &releases {
        dirs.push(tempfile::tempdir().unwrap());
        let project = dirs.last().unwrap().path().join("legacy-shop");
        let one = std::time::Instant::now();
        let checked = std::panic::catch_unwind(|| {
            expectations.upgrade_and_check(release, &project);
            lint(&project);
            cargo(&project, &["fmt", "--check"]);
        });
        let took = one.elapsed().as_secs_f64();
        match checked {
            Ok(()) => eprintln!("{release:<12} ok      {took:6.1} s"),
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                let message = if message.starts_with(release.as_str()) {
                    message
                } else {
                    format!("{release}: {message}")
                };
                let first = message.lines().next().unwrap_or("").to_string();
                eprintln!("{release:<12} FAILED  {took:6.1} s  {first}");
                failed.push(message);
            }
        }
    }
    eprintln!(
        "{} release fixtures upgraded, checked and compiled, {} failed, {:.1} s",
        releases.len(),
        failed.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

/// A project of template set 5 whose own code (the example's route, a
/// listener edited by hand) uses the API that set 6 changed: the upgrade
/// rewrites each such line, lists it in its report, and the project then
/// builds with zero warnings, passes clippy and `fmt --check`.
#[test]
#[ignore = "builds a generated project"]
fn an_upgrade_carries_the_users_code_to_the_api_of_set_6() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("shop");
    crate::support::materialise_fixture("v5-example", &project);
    let upgrade = gpkit(&project)
        .args(["upgrade", "templates"])
        .assert()
        .code(0);
    let report = String::from_utf8(upgrade.get_output().stdout.clone()).unwrap();
    for line in [
        "line 62 rewritten (API of template set 6): `state.dispatcher.dispatch(&mut *tx, &event).await?;` -> `kit::dispatch(&mut *tx, &event).await?;`",
        "line 10 rewritten (API of template set 6): `use kit::dispatch::Dispatcher;` -> `` (no longer used)",
        "line 17 rewritten (API of template set 6): `.bind(&ctx.listener)` -> `.bind(ctx.listener())`",
        "line 32 rewritten (API of template set 6): `.fetch_one(&ctx.pool)` -> `.fetch_one(ctx.pool())`",
    ] {
        assert!(
            report.contains(line),
            "missing from the report: {line}\n{report}"
        );
    }

    // Its kit is as gpkit wrote it: replaced as a unit, in one line.
    let replaced = report.lines().any(|line| {
        let line = line.trim_start();
        line.starts_with("replaced ") && line.contains(" kit/ (unmodified: ")
    });
    assert!(replaced, "{report}");
    assert!(!report.contains("kit/src/"), "{report}");

    let read = |path: &str| std::fs::read_to_string(project.join(path)).unwrap();
    let orders = read("src/routes/orders.rs");
    assert!(
        orders.contains("kit::dispatch(&mut *tx, &event).await?;"),
        "{orders}"
    );
    assert!(!orders.contains("dispatcher"), "{orders}");
    let notify = read("src/listeners/order_shipped/notify.rs");
    assert!(notify.contains(".bind(ctx.event_id())"), "{notify}");
    assert!(!read("src/startup.rs").contains("dispatcher"));

    lint(&project);
    cargo(&project, &["fmt", "--check"]);
    // A second run has nothing left to carry.
    let again = gpkit(&project)
        .args(["upgrade", "templates"])
        .assert()
        .code(0);
    let again = String::from_utf8(again.get_output().stdout.clone()).unwrap();
    assert!(!again.contains("rewritten"), "{again}");
}

/// The default project (with the worker), generated and built once per
/// test run under `target/e2e/shop` and shared by the end-to-end tests.
pub fn built_project() -> &'static Path {
    static PROJECT: OnceLock<PathBuf> = OnceLock::new();
    PROJECT.get_or_init(|| {
        let project = new_shop_in("e2e", &[]);
        build_binaries(&project);
        project
    })
}

/// An empty directory for a test's projects, `target/e2e-kept/<name>`,
/// emptied when the test takes it and kept after it ends: a kit built there
/// stays reusable by the later projects of the run (see [`cargo_lock`]),
/// which a temporary directory's would not.
pub fn kept_dir(name: &str) -> PathBuf {
    emptied(&format!("e2e-kept/{name}"))
}

/// A new project `shop` (`gpkit --no-input new project shop <options>`) in
/// `target/<dir>`, emptied first: the directory of a project that tests
/// build once a run and keep until it ends.
pub fn new_shop_in(dir: &str, options: &[&str]) -> PathBuf {
    let parent = emptied(dir);
    gpkit(&parent)
        .args(["--no-input", "new", "project", "shop"])
        .args(options)
        .assert()
        .success();
    parent.join("shop")
}

/// `target/<dir>`, made empty.
fn emptied(dir: &str) -> PathBuf {
    let dir = repo().join("target").join(dir);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A binary of the built project.
pub fn binary(name: &str) -> PathBuf {
    built_project().join(".bin").join(name)
}

#[test]
#[ignore = "builds a generated project"]
fn a_generated_project_builds_cleanly_passes_its_tests_and_migrates() {
    // Arrange: the project, built with zero warnings.
    let project = built_project();

    // Its own quality gates.
    lint(project);
    cargo(project, &["fmt", "--check"]);
    cargo(project, &["test"]);

    // migrate up on a fresh database creates exactly the outbox schema.
    let db = Database::create("gpkit_e2e");
    migrate(project, &db, &["up"]);
    let columns = psql(
        &db.url(),
        "SELECT column_name || ' ' || data_type || ' ' || is_nullable || ' ' || \
         coalesce(column_default, '-') || ' ' || is_identity || ' ' || coalesce(identity_generation, '-') \
         FROM information_schema.columns WHERE table_name = 'outbox_events' ORDER BY ordinal_position",
    );
    assert_eq!(
        columns,
        "id bigint NO - YES ALWAYS\n\
         event_id uuid NO - NO -\n\
         event_name text NO - NO -\n\
         payload jsonb NO - NO -\n\
         metadata jsonb NO '{}'::jsonb NO -\n\
         created_at timestamp with time zone NO now() NO -\n\
         published_at timestamp with time zone YES - NO -"
    );
    let indexes = psql(
        &db.url(),
        "SELECT indexdef FROM pg_indexes WHERE tablename = 'outbox_events' ORDER BY indexname",
    );
    assert_eq!(
        indexes,
        "CREATE INDEX outbox_events_created_at_idx ON public.outbox_events USING brin (created_at)\n\
         CREATE UNIQUE INDEX outbox_events_event_id_key ON public.outbox_events USING btree (event_id)\n\
         CREATE UNIQUE INDEX outbox_events_pkey ON public.outbox_events USING btree (id)\n\
         CREATE INDEX outbox_events_unpublished_idx ON public.outbox_events USING btree (id) WHERE (published_at IS NULL)"
    );
    let versions = psql(
        &db.url(),
        "SELECT version_id, is_applied FROM goose_db_version ORDER BY id",
    );
    let applied: Vec<String> = std::iter::once(0)
        .chain(kit_versions())
        .map(|version| format!("{version}|t"))
        .collect();
    assert_eq!(versions, applied.join("\n"));
    let status = String::from_utf8(migrate(project, &db, &["status"]).stderr).unwrap();
    for file in kit_files() {
        assert!(status.contains(&format!("-- {file}")), "{file}: {status}");
    }
    let version = String::from_utf8(migrate(project, &db, &["version"]).stderr).unwrap();
    assert!(
        version.contains(&format!("goose: version {}", newest_kit_version())),
        "{version}"
    );

    // migrate down, once per kit migration, newest first, rolls back that
    // migration and removes what it made, and keeps the version-0 row.
    for &(version, stem) in KIT.iter().rev() {
        let file = file_name(version, stem);
        let gone = rolled_back_check(stem);
        assert_eq!(psql(&db.url(), gone), "f", "{file} before its rollback");
        let log = String::from_utf8(migrate(project, &db, &["down"]).stderr).unwrap();
        assert!(log.contains(&file), "not {file} rolled back:\n{log}");
        assert_eq!(psql(&db.url(), gone), "t", "{file} after its rollback");
    }
    assert_eq!(
        psql(
            &db.url(),
            "SELECT version_id FROM goose_db_version ORDER BY id"
        ),
        "0"
    );
}

/// Per kit migration (by its file stem, in [`KIT`]'s order), a query that
/// is `t` once its `down` ran and `f` while it is applied: what its rollback
/// removes.
const ROLLED_BACK: &[(&str, &str)] = &[
    ("outbox", "SELECT to_regclass('outbox_events') IS NULL"),
    ("inbox", "SELECT to_regclass('inbox_processed') IS NULL"),
    (
        "listener_failures",
        "SELECT to_regclass('listener_failures') IS NULL",
    ),
    (
        "outbox_created_at",
        "SELECT to_regclass('outbox_events_created_at_idx') IS NULL",
    ),
    (
        "ordered_listeners",
        "SELECT to_regclass('ordered_runs') IS NULL",
    ),
    (
        "ordered_chains_in_valkey",
        "SELECT NOT EXISTS (SELECT 1 FROM information_schema.columns \
         WHERE table_name = 'outbox_keys' AND column_name = 'epoch')",
    ),
    (
        "ordered_chains_beside_their_queue",
        "SELECT (to_regclass('outbox_service') IS NULL) AND NOT EXISTS (SELECT 1 \
         FROM information_schema.columns WHERE table_name = 'listener_failures' \
         AND column_name = 'holds_key')",
    ),
    (
        "listener_cancellations",
        "SELECT to_regclass('listener_cancellations') IS NULL",
    ),
    ("outbox_later", "SELECT to_regclass('outbox_later') IS NULL"),
    (
        "outbox_unique",
        "SELECT to_regclass('outbox_unique') IS NULL",
    ),
];

/// The [`ROLLED_BACK`] query of the kit migration `stem`.
fn rolled_back_check(stem: &str) -> &'static str {
    ROLLED_BACK
        .iter()
        .find(|(of, _)| *of == stem)
        .unwrap_or_else(|| panic!("no ROLLED_BACK check in tests/cli/e2e.rs for {stem}"))
        .1
}

/// Every kit migration has its rollback checked, in [`KIT`]'s order.
#[test]
fn every_kit_migration_has_a_rollback_check() {
    let checked: Vec<&str> = ROLLED_BACK.iter().map(|(stem, _)| *stem).collect();
    let kit: Vec<&str> = KIT.iter().map(|(_, stem)| *stem).collect();
    assert_eq!(checked, kit, "ROLLED_BACK in tests/cli/e2e.rs vs KIT");
}

/// rustfmt's line breaks depend on line length, so the crate name must not
/// decide whether generated code is formatted: check a short and a long one.
#[test]
fn generated_code_is_formatted_whatever_the_name_length() {
    for name in ["a", "a-long-service-name-of-forty-characterss"] {
        for flags in [&[][..], &["--no-worker"][..], &["--example"][..]] {
            let dir = tempfile::tempdir().unwrap();
            gpkit(dir.path())
                .args(["new", "project", name])
                .args(flags)
                .assert()
                .success();
            let output = Command::new(env!("CARGO"))
                .args(["fmt", "--check"])
                .current_dir(dir.path().join(name))
                .output()
                .unwrap();
            assert!(
                output.status.success(),
                "`cargo fmt --check` fails for `{name}` {flags:?}:\n{}",
                String::from_utf8_lossy(&output.stdout)
            );
        }
    }
}

/// After a clean upgrade of a project from an older template set (with user
/// edits), the project builds, passes its checks and its own tests.
#[test]
#[ignore = "builds a generated project"]
fn an_upgraded_project_builds_and_passes_its_tests() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("legacy-shop");
    crate::support::materialise_fixture("synthetic-0-clean", &project);
    gpkit(&project)
        .args(["upgrade", "templates"])
        .assert()
        .code(0);

    build_and_test(&project);
}
