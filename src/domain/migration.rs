//! goose-style migration files for `gpkit new migration`: versions, names
//! and the file template.
//!
//! The naming rules are the generated project's own (`migrate/naming.rs`,
//! std only), compiled into gpkit too, so `gpkit new migration` and the
//! project's `migrate create` can never disagree.

#[path = "../../templates/kit/src/migrate/naming.rs"]
#[allow(dead_code)]
mod naming;

use std::path::Path;

use anyhow::{Context, Result, bail};
use time::{
    OffsetDateTime, PrimitiveDateTime, format_description::FormatItem, macros::format_description,
};

pub(crate) use naming::snake_case;

/// goose v3.27's SQL migration template, as `migrate create` writes it.
pub(crate) const SQL_TEMPLATE: &str = "-- +goose Up
SELECT 'up SQL query';

-- +goose Down
SELECT 'down SQL query';
";

const TIMESTAMP: &[FormatItem<'static>] =
    format_description!("[year][month][day][hour][minute][second]");

/// How the next version is numbered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Numbering {
    /// `YYYYMMDDhhmmss` in UTC, goose's default.
    Timestamp,
    /// `%05d` after the highest sequential version, goose's `-s`.
    Sequential,
}

/// The versions of the `.sql` files at the top level of `dir`, with their
/// file names. A missing directory has none; a badly named `.sql` file is an
/// error, as in goose.
pub(crate) fn existing_versions(dir: &Path) -> Result<Vec<(i64, String)>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(err).with_context(|| format!("failed to read `{}`", dir.display())),
    };
    let mut versions = Vec::new();
    for entry in entries {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".sql") {
            continue;
        }
        let version = naming::parse_version(&name).map_err(|err| {
            anyhow::anyhow!(
                "`{}/{name}` is not a valid goose migration name: {err}\n\
                 help: rename it to `<version>_<description>.sql`",
                dir.display()
            )
        })?;
        versions.push((version, name));
    }
    versions.sort();
    Ok(versions)
}

/// The version for a new migration: `now` as a timestamp (one second after
/// the newest timestamp when that is not in the past), or the next
/// sequential number.
pub(crate) fn next_version(
    existing: &[(i64, String)],
    numbering: Numbering,
    now: OffsetDateTime,
) -> Result<String> {
    match numbering {
        Numbering::Sequential => {
            let last = existing
                .iter()
                .map(|(v, _)| *v)
                .filter(|v| !naming::is_timestamp(*v))
                .max();
            Ok(format!("{:05}", last.unwrap_or(0) + 1))
        }
        Numbering::Timestamp => {
            let now = now.to_offset(time::UtcOffset::UTC);
            let mut version =
                PrimitiveDateTime::new(now.date(), now.time()).replace_nanosecond(0)?;
            let newest = existing
                .iter()
                .map(|(v, _)| *v)
                .filter(|v| naming::is_timestamp(*v))
                .max();
            if let Some(newest) = newest {
                let newest = PrimitiveDateTime::parse(&newest.to_string(), TIMESTAMP)?;
                if newest >= version {
                    version = newest + time::Duration::SECOND;
                }
            }
            Ok(version.format(TIMESTAMP)?)
        }
    }
}

/// The file name of a new migration, or why `name` cannot name one.
pub(crate) fn file_name(version: &str, name: &str) -> Result<String> {
    let description = snake_case(name);
    if description.is_empty() {
        bail!(
            "`{name}` has no letters or digits to name a migration\n\
             help: describe the change, such as `add_orders` or \"add index on users.email\""
        );
    }
    Ok(format!("{version}_{description}.sql"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> OffsetDateTime {
        let t = PrimitiveDateTime::parse(text, TIMESTAMP).unwrap();
        t.assume_utc()
    }

    fn existing(names: &[&str]) -> Vec<(i64, String)> {
        names
            .iter()
            .map(|n| (naming::parse_version(n).unwrap(), n.to_string()))
            .collect()
    }

    #[test]
    fn timestamps_are_utc_and_never_clash() {
        let now = at("20261129213000");
        assert_eq!(
            next_version(&[], Numbering::Timestamp, now).unwrap(),
            "20261129213000"
        );
        let same_second = existing(&["20261129213000_a.sql"]);
        assert_eq!(
            next_version(&same_second, Numbering::Timestamp, now).unwrap(),
            "20261129213001"
        );
        let end_of_minute = existing(&["20261129213059_a.sql"]);
        assert_eq!(
            next_version(&end_of_minute, Numbering::Timestamp, now).unwrap(),
            "20261129213100"
        );
        let older = existing(&["20200101000100_outbox.sql"]);
        assert_eq!(
            next_version(&older, Numbering::Timestamp, now).unwrap(),
            "20261129213000"
        );
    }

    #[test]
    fn sequential_numbers_follow_the_last_sequential_version() {
        let now = at("20261129213000");
        assert_eq!(
            next_version(&[], Numbering::Sequential, now).unwrap(),
            "00001"
        );
        let mixed = existing(&["00001_a.sql", "00007_b.sql", "20200101000100_outbox.sql"]);
        assert_eq!(
            next_version(&mixed, Numbering::Sequential, now).unwrap(),
            "00008"
        );
    }

    #[test]
    fn names_follow_gooses_snake_case() {
        assert_eq!(
            file_name("00001", "Add updated_at to users table").unwrap(),
            "00001_add_updated_at_to_users_table.sql"
        );
        assert!(
            file_name("00001", "!!!")
                .unwrap_err()
                .to_string()
                .contains("no letters or digits")
        );
    }

    #[test]
    fn the_template_is_the_projects_own() {
        let files = include_str!("../../templates/kit/src/migrate/files.rs");
        let literal = format!("pub const SQL_TEMPLATE: &str = \"{SQL_TEMPLATE}\";");
        assert!(
            files.contains(&literal),
            "templates/kit/src/migrate/files.rs has another template"
        );
    }
}
