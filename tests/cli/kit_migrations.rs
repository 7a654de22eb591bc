//! The kit's migrations, the ones every generated project has
//! (`templates/project/migrations/`): the one list the CLI tests derive
//! theirs from (file names, versions, the version table, the newest
//! version, the order of rollbacks). A new kit migration is one line in
//! [`KIT`].

use std::path::Path;

/// The kit's migrations in version order: `(version, file stem)`, the file
/// being `<version>_<stem>.sql`.
pub const KIT: &[(i64, &str)] = &[
    (20200101000100, "outbox"),
    (20261130000000, "inbox"),
    (20261205130000, "listener_failures"),
    (20261205140000, "outbox_created_at"),
    (20261205180000, "ordered_listeners"),
    (20261206120000, "ordered_chains_in_valkey"),
    (20261207120000, "ordered_chains_beside_their_queue"),
    (20261208120000, "listener_cancellations"),
    (20261208130000, "outbox_later"),
    (20261208140000, "outbox_unique"),
];

/// The file name of a migration: `<version>_<stem>.sql`.
pub fn file_name(version: i64, stem: &str) -> String {
    format!("{version}_{stem}.sql")
}

/// The kit's migration files, in version order.
pub fn kit_files() -> Vec<String> {
    KIT.iter()
        .map(|&(version, stem)| file_name(version, stem))
        .collect()
}

/// The kit's migration versions, in version order.
pub fn kit_versions() -> Vec<i64> {
    KIT.iter().map(|&(version, _)| version).collect()
}

/// The version of the kit's newest migration.
pub fn newest_kit_version() -> i64 {
    KIT.last().unwrap().0
}

/// Asserts that `found` are the migration files `expected`, in the same
/// order, and otherwise names each file that is in one and not the other.
#[track_caller]
pub fn assert_migration_files(found: &[String], expected: &[String], what: &str) {
    let unexpected: Vec<&String> = found.iter().filter(|f| !expected.contains(f)).collect();
    let missing: Vec<&String> = expected.iter().filter(|f| !found.contains(f)).collect();
    assert!(
        unexpected.is_empty() && missing.is_empty(),
        "{what}: there but not expected: {unexpected:?}; expected but not there: {missing:?} \
         (the kit's migrations are KIT in tests/cli/kit_migrations.rs)"
    );
    assert_eq!(found, expected, "{what}: the order");
}

/// [`KIT`] is the kit's migrations directory, file for file, so that a
/// new kit migration fails here first, named, until it is added.
#[test]
fn kit_lists_the_migrations_of_the_project_template() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("templates/project/migrations");
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".sql"))
        .collect();
    on_disk.sort();
    assert_migration_files(&on_disk, &kit_files(), &dir.display().to_string());
}
