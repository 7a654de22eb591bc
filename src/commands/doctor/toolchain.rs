//! The Rust toolchain check: the `rustc` that cargo would use in the
//! project directory (rustup honours a `rust-toolchain.toml` there) against
//! the project's `rust-version`.

use std::path::Path;
use std::process::Command;

use super::report::Finding;
use crate::engine::blueprint::GENERATED_RUST_VERSION;

const CHECK: &str = "rust";

/// Compares the toolchain with what the project declares it needs (its
/// `Cargo.toml` `package.rust-version`, else what the templates need).
pub(crate) fn check(root: &Path) -> Finding {
    let (needed, declared) = match declared_rust_version(root) {
        Some(version) => (version, true),
        None => (GENERATED_RUST_VERSION.to_string(), false),
    };
    let needs = if declared {
        format!("Cargo.toml asks for {needed} or later")
    } else {
        format!("the templates need {needed} or later")
    };
    let output = Command::new("rustc")
        .arg("--version")
        .current_dir(root)
        .output();
    let version_line = match output {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).trim().to_string(),
        Ok(out) => {
            return Finding::fail(
                CHECK,
                format!(
                    "`rustc --version` failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
                format!("install a toolchain: rustup toolchain install stable ({needs})"),
            );
        }
        Err(err) => {
            return Finding::fail(
                CHECK,
                format!("cannot run rustc: {err}"),
                "install Rust from https://rustup.rs",
            );
        }
    };
    let Some(found) = version_line.split_whitespace().nth(1) else {
        return Finding::warn(
            CHECK,
            format!("cannot read the version in `{version_line}`"),
            format!("make sure rustc is {needed} or later"),
        );
    };
    match (parse(found), parse(&needed)) {
        (Some(have), Some(need)) if have >= need => {
            Finding::ok(CHECK, format!("rustc {found}; {needs}"))
        }
        (Some(_), Some(_)) => Finding::fail(
            CHECK,
            format!("rustc {found} is too old: {needs}"),
            "rustup update stable",
        ),
        _ => Finding::warn(
            CHECK,
            format!("cannot compare rustc {found} with {needed}"),
            format!("make sure rustc is {needed} or later"),
        ),
    }
}

/// `package.rust-version` from the project's `Cargo.toml`, if set.
fn declared_rust_version(root: &Path) -> Option<String> {
    let text = std::fs::read_to_string(root.join("Cargo.toml")).ok()?;
    let doc: toml_edit::DocumentMut = text.parse().ok()?;
    doc.get("package")?
        .get("rust-version")?
        .as_str()
        .map(str::to_string)
}

/// `1.89`, `1.89.0` or `1.90.0-nightly` as (major, minor, patch).
fn parse(version: &str) -> Option<(u32, u32, u32)> {
    let core = version.split('-').next()?;
    let mut parts = core.split('.').map(str::parse::<u32>);
    let major = parts.next()?.ok()?;
    let minor = parts.next()?.ok()?;
    let patch = parts.next().unwrap_or(Ok(0)).ok()?;
    Some((major, minor, patch))
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn versions_compare_numerically() {
        assert!(parse("1.100.0") > parse("1.89"));
        assert_eq!(parse("1.89"), parse("1.89.0"));
        assert_eq!(parse("1.90.0-nightly"), Some((1, 90, 0)));
        assert_eq!(parse("stable"), None);
    }
}
