//! The real Go peers: programs of the Go module `tests/interop/go`, which
//! pins Go asynq v0.26.0 and goose v3.30.0, built once per test run into
//! `target/interop/`.
//!
//! Where `go` is missing the interop tests are skipped with a printed
//! reason, except when `GPKIT_REQUIRE_GO` is set (`scripts/test` sets it
//! under CI), where a missing toolchain fails them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use crate::support::repo;

/// The Go module with the peers.
pub fn module_dir() -> PathBuf {
    repo().join("tests/interop/go")
}

/// Whether a Go toolchain is on PATH; panics when it is not and
/// `GPKIT_REQUIRE_GO` is set.
fn go_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        let found = Command::new("go")
            .arg("version")
            .output()
            .is_ok_and(|out| out.status.success());
        assert!(
            found || std::env::var_os("GPKIT_REQUIRE_GO").is_none(),
            "GPKIT_REQUIRE_GO is set but `go` is not on PATH: install Go 1.26 to run the interop tests"
        );
        found
    })
}

/// The binary of the Go program `cmd/<name>` of the interop module, built
/// on first use; `None` (with the reason printed) where Go is missing.
pub fn go_peer(name: &str) -> Option<PathBuf> {
    if !go_available() {
        eprintln!("skipped: `go` is not on PATH, so the Go peer `{name}` cannot be built");
        return None;
    }
    static BUILT: Mutex<BTreeMap<String, PathBuf>> = Mutex::new(BTreeMap::new());
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(path) = built.get(name) {
        return Some(path.clone());
    }
    let out = repo().join("target/interop").join(name);
    let output = Command::new("go")
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
