//! The project manifest `gpkit.toml`: what gpkit generated, and for whom.
//!
//! It records the gpkit and template-set versions, the answers the project
//! was generated with, the components present, and for every generated file
//! its owner and a hash of what gpkit last wrote. The exact bytes gpkit last
//! wrote are kept beside it under `.gpkit/base/`, so that `gpkit upgrade
//! templates` can do a 3-way merge without git, but for the kit's files,
//! which gpkit regenerates from the hash ([`crate::engine::released`]).

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

pub(crate) use crate::domain::events::{EventSpec, FieldSpec};
pub(crate) use crate::domain::schedule::ScheduleRecord;
use sha2::{Digest, Sha256};

/// The manifest's file name, at the project root.
pub(crate) const MANIFEST_FILE: &str = "gpkit.toml";

/// Where the last-written content of each generated file is kept.
pub(crate) const BASE_DIR: &str = ".gpkit/base";

/// Who owns a generated file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Owner {
    /// The kit's machinery: gpkit keeps it up to date with 3-way merges.
    Kit,
    /// Written once for the user to change; gpkit edits only its managed
    /// regions and dependency tables.
    User,
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Owner::Kit => "kit",
            Owner::User => "user",
        })
    }
}

/// The whole manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub(crate) gpkit: Versions,
    pub answers: Answers,
    #[serde(default)]
    pub components: Components,
    #[serde(default)]
    pub files: BTreeMap<String, FileRecord>,
}

/// Which gpkit and which template set last wrote the project.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Versions {
    pub(crate) version: String,
    pub(crate) template_set: u32,
}

/// The answers the project was generated with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answers {
    pub name: String,
    /// The data layer the application code uses. Recorded only when it is
    /// not the default, so manifests of sqlx projects (and those written
    /// before the choice existed) read as sqlx.
    #[serde(default, skip_serializing_if = "DataLayer::is_default")]
    pub db: DataLayer,
}

/// The data layer of a project (`gpkit new project --db`): what its
/// transactions hand to the application code, and what the outbox
/// dispatcher joins.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
pub enum DataLayer {
    /// sqlx alone: transactions are `sqlx` connections.
    #[default]
    #[serde(rename = "sqlx")]
    #[value(name = "sqlx")]
    Sqlx,
    /// SeaORM on the same sqlx pool: transactions are SeaORM
    /// `DatabaseTransaction`s, and events dispatched on them join them.
    #[serde(rename = "sea-orm")]
    #[value(name = "sea-orm")]
    SeaOrm,
}

impl DataLayer {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// How `--db` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sqlx => "sqlx",
            Self::SeaOrm => "sea-orm",
        }
    }
}

/// The optional parts of the project.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Components {
    #[serde(default)]
    pub worker: bool,
    /// The container files (`Dockerfile`, `.dockerignore`, `compose.yaml`)
    /// of `gpkit add deploy`. Recorded only when on, so manifests of
    /// projects without them read as before.
    #[serde(default, skip_serializing_if = "is_false")]
    pub deploy: bool,
    /// Events added with `gpkit add event`, in the order they were added.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<EventSpec>,
    /// Schedules added with `gpkit add schedule`, in the order they were added.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schedules: Vec<ScheduleRecord>,
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// What gpkit knows of one generated file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    pub owner: Owner,
    /// SHA-256 of the bytes gpkit last wrote (kept in `.gpkit/base/`, or
    /// for a released kit file found by this hash).
    pub sha256: String,
}

impl Manifest {
    /// Reads the manifest of the project at `root`, or explains that `root`
    /// is not a gpkit project.
    pub fn load(root: &Path) -> Result<Self> {
        let path = root.join(MANIFEST_FILE);
        crate::engine::project_path::refuse_links(root, MANIFEST_FILE)?;
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => bail!(
                "`{}` is not a gpkit project: it has no `{MANIFEST_FILE}`\n\
                 help: run this command inside a project made by `gpkit new project`, \
                 or point at one with `-C <dir>`",
                root.display()
            ),
            Err(err) => {
                return Err(err).with_context(|| format!("failed to read `{}`", path.display()));
            }
        };
        Self::parse_named(&text, &path)
    }

    /// Reads manifest text: it must have the manifest's shape, and every
    /// file it records must be a plain relative path inside the project.
    /// Errors, never panics, on any text.
    pub fn parse(text: &str) -> Result<Self> {
        Self::parse_named(text, Path::new(MANIFEST_FILE))
    }

    /// [`Manifest::parse`], naming the file as `path` in errors.
    fn parse_named(text: &str, path: &Path) -> Result<Self> {
        let manifest: Self = toml_edit::de::from_str(text)
            .with_context(|| format!("`{}` is not a valid gpkit manifest", path.display()))?;
        for file in manifest.files.keys() {
            crate::engine::project_path::check_manifest_path(file)?;
        }
        Ok(manifest)
    }

    /// The manifest as TOML text, with a header that says what it is.
    pub fn to_toml(&self) -> String {
        let body = toml_edit::ser::to_string_pretty(self).expect("the manifest serialises");
        format!(
            "# Written by gpkit: what it generated in this project, so that `gpkit add` and\n\
             # `gpkit upgrade templates` can change the project without losing your edits.\n\
             # What gpkit last wrote to each file is kept in `.gpkit/base/`, but for the\n\
             # kit's released files, which gpkit finds again by their hash below.\n\
             # Commit this file and `.gpkit/`; do not edit them by hand.\n\n{body}"
        )
    }
}

/// SHA-256 of `bytes`, as lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_toml() {
        let mut files = BTreeMap::new();
        files.insert(
            "src/config.rs".to_string(),
            FileRecord {
                owner: Owner::Kit,
                sha256: sha256_hex(b"x"),
            },
        );
        let manifest = Manifest {
            gpkit: Versions {
                version: "0.1.0".into(),
                template_set: 1,
            },
            answers: Answers {
                name: "shop".into(),
                db: DataLayer::SeaOrm,
            },
            components: Components {
                worker: true,
                deploy: true,
                events: vec![EventSpec {
                    name: "orderPlaced".into(),
                    fields: vec![FieldSpec {
                        name: "order_id".into(),
                        ty: "i64".into(),
                    }],
                    listeners: vec!["audit".into()],
                    ordered_by: None,
                    listener_options: Default::default(),
                }],
                schedules: vec![ScheduleRecord {
                    name: "nightly_report".into(),
                    cron: "0 2 * * *".into(),
                    event: Some("orderPlaced".into()),
                    tz: Some("Europe/Paris".into()),
                    catch_up: 3,
                }],
            },
            files,
        };
        let text = manifest.to_toml();
        assert!(text.starts_with("# Written by gpkit"));
        let back: Manifest = toml_edit::de::from_str(&text).unwrap();
        assert_eq!(back, manifest);
    }

    #[test]
    fn a_manifest_without_a_data_layer_is_sqlx_and_sqlx_is_not_written() {
        let old = "[gpkit]\nversion = \"0.1.0\"\ntemplate_set = 3\n\n[answers]\nname = \"shop\"\n";
        let manifest = Manifest::parse(old).unwrap();
        assert_eq!(manifest.answers.db, DataLayer::Sqlx);
        assert!(
            !manifest.to_toml().contains("db ="),
            "{}",
            manifest.to_toml()
        );

        let mut seaorm = manifest.clone();
        seaorm.answers.db = DataLayer::SeaOrm;
        let text = seaorm.to_toml();
        assert!(text.contains("db = \"sea-orm\""), "{text}");
        assert_eq!(
            Manifest::parse(&text).unwrap().answers.db,
            DataLayer::SeaOrm
        );
    }

    #[test]
    fn hashes_are_sha256_hex() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
