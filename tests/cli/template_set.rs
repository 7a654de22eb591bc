//! The template-set version must change whenever rendered output changes:
//! `snapshots/template-set.lock` pins a hash of everything the templates
//! render for each option combination, per version.

use gpkit::engine::blueprint::{self, TEMPLATE_SET_VERSION};
use gpkit::engine::manifest::{Answers, Components, DataLayer, sha256_hex};

use crate::support::repo;

/// A hash over every rendered file of every option combination.
fn rendered_hash() -> String {
    let mut all = Vec::new();
    for db in [DataLayer::Sqlx, DataLayer::SeaOrm] {
        for (worker, deploy) in [(false, false), (true, false), (false, true), (true, true)] {
            let tree = blueprint::render(
                &Answers {
                    name: "shop".into(),
                    db,
                },
                &Components {
                    worker,
                    deploy,
                    events: Vec::new(),
                    schedules: Vec::new(),
                },
                blueprint::Tests::All,
                &[],
            )
            .unwrap();
            for (path, file) in tree {
                let db = db.as_str();
                all.extend_from_slice(
                    format!("{db} {worker} {deploy} {path} {} ", file.owner).as_bytes(),
                );
                all.extend_from_slice(sha256_hex(&file.contents).as_bytes());
                all.push(b'\n');
            }
        }
    }
    sha256_hex(&all)
}

#[test]
fn rendered_output_changes_only_with_a_new_template_set_version() {
    let lock_path = repo().join("snapshots/template-set.lock");
    let hash = rendered_hash();
    let lock = format!(
        "# Written by gpkit's tests: the template-set version and a hash of all it renders.\n\
         # A change to rendered output without a version bump fails the tests.\n\
         template_set = {TEMPLATE_SET_VERSION}\nsha256 = \"{hash}\"\n"
    );
    let recorded = std::fs::read_to_string(&lock_path).unwrap_or_default();
    if recorded == lock {
        return;
    }
    let recorded_version = recorded
        .lines()
        .find_map(|l| l.strip_prefix("template_set = "))
        .and_then(|v| v.parse::<u32>().ok());
    if recorded_version == Some(TEMPLATE_SET_VERSION) {
        panic!(
            "the templates render differently, but TEMPLATE_SET_VERSION is still \
             {TEMPLATE_SET_VERSION}: bump it in src/blueprint.rs, then run the tests with \
             GPKIT_UPDATE_SNAPSHOTS=1"
        );
    }
    if crate::support::updating_snapshots() {
        std::fs::write(&lock_path, lock).unwrap();
        return;
    }
    panic!(
        "TEMPLATE_SET_VERSION is {TEMPLATE_SET_VERSION} but snapshots/template-set.lock records \
         {recorded_version:?}: run the tests with GPKIT_UPDATE_SNAPSHOTS=1 to record the new set"
    );
}

/// The kit's `migrate` applies its own migrations out of order
/// (`KIT_VERSIONS` in `templates/kit/src/migrate/mod.rs`): that list must
/// name every migration the project template has, and nothing else.
#[test]
fn the_kit_lists_each_migration_of_the_template_as_its_own() {
    let source = std::fs::read_to_string(repo().join("templates/kit/src/migrate/mod.rs")).unwrap();
    let list = source
        .split_once("KIT_VERSIONS: &[i64] = &[")
        .and_then(|(_, rest)| rest.split_once("];"))
        .expect("templates/kit/src/migrate/mod.rs declares KIT_VERSIONS")
        .0;
    let listed: std::collections::BTreeSet<i64> = list
        .split(',')
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(|v| v.parse().unwrap())
        .collect();
    let files: std::collections::BTreeSet<i64> =
        std::fs::read_dir(repo().join("templates/project/migrations"))
            .unwrap()
            .map(|entry| {
                let name = entry.unwrap().file_name().to_string_lossy().into_owned();
                name.split_once('_').unwrap().0.parse().unwrap()
            })
            .collect();
    assert_eq!(
        listed, files,
        "KIT_VERSIONS and templates/project/migrations differ"
    );
}

/// Every template set from 24 on is released through the speed gate
/// (`scripts/speed-gate`): the load bench's capacity and the end-to-end
/// backlog bench against the previous set, alternating, five rounds or
/// more. Its verdict, committed in `scripts/bench/gates/set-<N>.json`, must
/// have passed, or have been accepted because the set's CHANGELOG.md entry
/// states the cost (`Speed:`).
#[test]
fn the_current_template_set_passed_its_speed_gate() {
    let path = repo().join(format!(
        "scripts/bench/gates/set-{TEMPLATE_SET_VERSION}.json"
    ));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|_| {
        panic!(
            "template set {TEMPLATE_SET_VERSION} has no speed gate verdict ({}): run \
             `scripts/with-services scripts/speed-gate` when the set is released, and commit \
             the verdict it writes",
            path.display()
        )
    });
    let record: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        record["template_set"],
        TEMPLATE_SET_VERSION,
        "{}",
        path.display()
    );
    assert!(
        record["rounds"].as_u64().is_some_and(|rounds| rounds >= 5),
        "the gate ran fewer than five rounds: {text}"
    );
    match record["verdict"].as_str() {
        Some("passed") => {}
        Some("accepted") => {
            let changelog = std::fs::read_to_string(repo().join("CHANGELOG.md")).unwrap();
            let speed = record["changelog_speed"].as_str().unwrap_or_default();
            assert!(
                !speed.is_empty() && changelog.contains(speed),
                "the gate accepted a slower set for a CHANGELOG.md line that is not there: {speed:?}"
            );
        }
        verdict => panic!(
            "template set {TEMPLATE_SET_VERSION}'s speed gate did not pass ({verdict:?}): \
             make it faster, or state the cost in CHANGELOG.md (`Speed:`) and run the gate again"
        ),
    }
}
