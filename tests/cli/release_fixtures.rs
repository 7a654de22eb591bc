//! The release fixtures (`tests/fixtures/upgrade/v<N>-edited`) and what
//! their upgrade must show, as `tests/fixtures/upgrade/expectations.toml`
//! declares it: the user's edits kept, the deleted files gone, and exactly
//! the conflicts a fixture declares (exit 3 passes for no other).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Deserialize;

use crate::support::{fixture_names, gpkit, read_tree, repo};

/// `tests/fixtures/upgrade/expectations.toml`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expectations {
    /// Files that must not exist after any release fixture's upgrade.
    gone: Vec<String>,
    /// The user's edits every release fixture carries.
    kept: Vec<Kept>,
    /// Fixtures whose upgrade conflicts, by name.
    #[serde(default)]
    fixtures: BTreeMap<String, Declared>,
}

/// One edit of the user's: `text` must be in `file` after the upgrade.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Kept {
    file: String,
    text: String,
}

/// What one fixture declares of its own.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Declared {
    conflicts: BTreeSet<String>,
}

impl Expectations {
    /// Reads the declarations; every fixture they name exists.
    pub fn load() -> Self {
        let path = repo().join("tests/fixtures/upgrade/expectations.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let expectations: Self =
            toml_edit::de::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let releases = release_fixtures();
        for name in expectations.fixtures.keys() {
            assert!(
                releases.contains(name),
                "expectations.toml declares {name}, which is no release fixture"
            );
        }
        expectations
    }

    /// The files `release`'s upgrade must report as conflicted.
    pub fn conflicts(&self, release: &str) -> BTreeSet<String> {
        self.fixtures
            .get(release)
            .map(|declared| declared.conflicts.clone())
            .unwrap_or_default()
    }

    /// The exit code `release`'s upgrade must have: 3 when it declares
    /// conflicts, else 0.
    pub fn exit_code(&self, release: &str) -> i32 {
        if self.conflicts(release).is_empty() {
            0
        } else {
            3
        }
    }

    /// Checks that no project gpkit generates today (`fresh`) already has
    /// an edit's text where the edit is checked: the check would then hold
    /// whatever the upgrade did.
    pub fn assert_edits_are_not_in(&self, fresh: &Path) {
        for kept in &self.kept {
            let generated = std::fs::read_to_string(fresh.join(&kept.file)).unwrap_or_default();
            assert!(
                !generated.contains(&kept.text),
                "a new project's {} has the edit {:?}: checking it proves nothing",
                kept.file,
                kept.text
            );
        }
    }

    /// Checks that `release`, materialised in `project` and not yet
    /// upgraded, carries every declared edit.
    pub fn assert_edits_before_the_upgrade(&self, release: &str, project: &Path) {
        let before = read_tree(project, &[".gpkit"]);
        for kept in &self.kept {
            assert!(
                before
                    .values()
                    .any(|bytes| String::from_utf8_lossy(bytes).contains(&kept.text)),
                "{release}: the fixture has no edit {:?} to check (expectations.toml)",
                kept.text
            );
        }
    }

    /// Checks `release`'s upgrade in `project`: its exit code, the files its
    /// text `report` lists as conflicted, the edits and the deleted files.
    pub fn assert_upgraded(&self, release: &str, project: &Path, code: i32, report: &str) {
        assert_eq!(
            conflicted(report),
            self.conflicts(release),
            "{release}: the conflicts reported are not the ones declared in \
             expectations.toml\n{report}"
        );
        assert_eq!(
            code,
            self.exit_code(release),
            "{release}: the upgrade's exit code\n{report}"
        );
        for kept in &self.kept {
            let after = std::fs::read_to_string(project.join(&kept.file)).unwrap_or_else(|e| {
                panic!("{release}: {} after the upgrade: {e}", kept.file);
            });
            assert!(
                after.contains(&kept.text),
                "{release}: the edit {:?} to {} is lost",
                kept.text,
                kept.file
            );
        }
        for gone in &self.gone {
            assert!(
                !project.join(gone).exists(),
                "{release}: {gone} exists after the upgrade"
            );
        }
    }

    /// Materialises `release` into `project`, upgrades it and checks the
    /// upgrade as [`Self::assert_upgraded`] does.
    pub fn upgrade_and_check(&self, release: &str, project: &Path) {
        crate::support::materialise_fixture(release, project);
        self.assert_edits_before_the_upgrade(release, project);
        let upgrade = gpkit(project)
            .args(["upgrade", "templates"])
            .output()
            .unwrap();
        let report = format!(
            "{}{}",
            String::from_utf8_lossy(&upgrade.stdout),
            String::from_utf8_lossy(&upgrade.stderr)
        );
        let code = upgrade.status.code().unwrap_or(-1);
        self.assert_upgraded(release, project, code, &report);
    }
}

/// The files a text report of `gpkit upgrade templates` lists as
/// conflicted (`conflicted`, `conflicted (markers remain)`, ...).
pub fn conflicted(report: &str) -> BTreeSet<String> {
    const LABELS: [&str; 4] = [
        "conflicted (markers remain)",
        "conflicted (file exists)",
        "conflicted (region)",
        "conflicted",
    ];
    report
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("  ")?;
            let label = LABELS.iter().find(|label| rest.starts_with(**label))?;
            let path = rest[label.len()..].split_whitespace().next()?;
            Some(path.to_string())
        })
        .collect()
}

/// The release fixtures' names, oldest set first.
pub fn release_fixtures() -> Vec<String> {
    let mut releases: Vec<(u32, String)> = fixture_names()
        .into_iter()
        .filter_map(|name| {
            let set = name
                .strip_prefix('v')?
                .strip_suffix("-edited")?
                .parse()
                .ok()?;
            Some((set, name))
        })
        .collect();
    releases.sort();
    releases.into_iter().map(|(_, name)| name).collect()
}
