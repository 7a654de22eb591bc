//! The real Go peers: programs of the Go module `tests/interop/go`, which
//! pins Go asynq v0.26.0 and goose v3.30.0, built once per test run into
//! `target/interop/`.
//!
//! Where `go` is missing the interop tests skip, under the rule of
//! [`require_tool`]: a printed `skipped:` line, and a failure under CI.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

use crate::support::{repo, require_tool};

/// The Go module with the peers.
pub fn module_dir() -> PathBuf {
    repo().join("tests/interop/go")
}

/// The binary of the Go program `cmd/<name>` of the interop module, built
/// on first use; `None` where Go is missing (see [`require_tool`]).
pub fn go_peer(name: &str) -> Option<PathBuf> {
    crate::e2e::build_shared_projects_ahead();
    let go = require_tool("go")?;
    static BUILT: Mutex<BTreeMap<String, PathBuf>> = Mutex::new(BTreeMap::new());
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(path) = built.get(name) {
        return Some(path.clone());
    }
    let out = repo().join("target/interop").join(name);
    let output = Command::new(go)
        .args(["build", "-mod=readonly", "-o"])
        .arg(&out)
        .arg(format!("./cmd/{name}"))
        .current_dir(module_dir())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "`go build ./cmd/{name}` failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    built.insert(name.to_string(), out.clone());
    Some(out)
}
