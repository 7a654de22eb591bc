//! The kits gpkit has released: every version of every file of the kit
//! crate that a template set shipped, so that the base of a kit file a
//! project has not patched is regenerated from the hash in `gpkit.toml`
//! instead of being kept as a copy under `.gpkit/base/`.
//!
//! The store is `templates/released/` in gpkit's repository, embedded with
//! the templates: `set-<N>.sha256` lists the kit's files of template set N
//! (SHA-256 and path inside the kit crate, as `sha256sum` prints them), and
//! `blobs/<sha256>.gz` holds the bytes, gzipped ([`pack`]), once per
//! distinct content, so a release adds blobs only for the files it changed
//! (text, about a third of its size). `scripts/record-kit-release`
//! writes it at each release. The kit's `Cargo.toml` is stored as gpkit's
//! template (package `gpkit-kit`) and renamed for the project when
//! regenerated, as the blueprint renders it.
//!
//! Every regenerated base is checked against the recorded hash: bytes that
//! do not hash to it are never used, and a hash found nowhere is no base
//! (a conflict to report, never permission to overwrite).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, OnceLock};

use anyhow::{Context, Result, bail};

use crate::engine::blueprint::{KIT_DIR, kit_manifest};
use crate::engine::manifest::sha256_hex;
use crate::engine::templates;

/// The kit's manifest, the one file that differs between projects.
const KIT_MANIFEST: &str = "Cargo.toml";

/// Released kit files: the lists of each template set and their bytes.
#[derive(Debug, Default)]
pub struct Store {
    /// Template set → path inside the kit crate → SHA-256 of its bytes.
    releases: BTreeMap<u32, BTreeMap<String, String>>,
    /// SHA-256 → gzipped bytes (not trusted until unpacked and hashed).
    blobs: BTreeMap<String, &'static [u8]>,
    /// SHA-256 → the blob unpacked and checked, or `None` when it failed:
    /// a command asks for the same kit file more than once (its base, then
    /// whether a copy is needed), and a process running gpkit many times
    /// (the tests) asks again each time.
    verified: Mutex<HashMap<String, Option<Vec<u8>>>>,
}

impl Store {
    /// The store embedded in this gpkit. Debug builds also read the
    /// releases of `GPKIT_RELEASED_DIR`, a directory laid out as the store
    /// (a test hook, ignored in release builds: the tests upgrade from a
    /// kit that no real release shipped).
    pub fn embedded() -> &'static Store {
        static STORE: OnceLock<Store> = OnceLock::new();
        STORE.get_or_init(|| {
            let mut store = Store::load(templates::released_names(), templates::released_file)
                .expect("the store of released kits is well-formed (this is a bug in gpkit)");
            if cfg!(debug_assertions)
                && let Some(dir) = std::env::var_os("GPKIT_RELEASED_DIR")
            {
                let extra = Store::read_dir(std::path::Path::new(&dir))
                    .expect("GPKIT_RELEASED_DIR holds a store of released kits");
                store.releases.extend(extra.releases);
                store.blobs.extend(extra.blobs);
            }
            store
        })
    }

    /// A store laid out in the directory `dir` (the test hook's).
    fn read_dir(dir: &std::path::Path) -> Result<Self> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let name = entry?.file_name().into_string().unwrap_or_default();
            names.push(&*Box::leak(name.into_boxed_str()));
        }
        Store::load(names, |path| {
            let bytes = std::fs::read(dir.join(path)).ok()?;
            Some(&*Box::leak(bytes.into_boxed_slice()))
        })
    }

    /// Reads a store from its list `names` (the files directly in it) and
    /// `file` (a file of it by path).
    fn load(names: Vec<&str>, file: impl Fn(&str) -> Option<&'static [u8]>) -> Result<Self> {
        let mut store = Store::default();
        for name in names {
            let Some(set) = name
                .strip_prefix("set-")
                .and_then(|n| n.strip_suffix(".sha256"))
            else {
                continue;
            };
            let set: u32 = set
                .parse()
                .with_context(|| format!("`{name}` does not name a template set"))?;
            let text = std::str::from_utf8(file(name).unwrap_or_default())
                .with_context(|| format!("`{name}` is not UTF-8"))?;
            let mut files = BTreeMap::new();
            for line in text
                .lines()
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
            {
                let Some((sha256, path)) = line.split_once("  ") else {
                    bail!("`{name}`: `{line}` is not `<sha256>  <path>`");
                };
                let blob = file(&format!("blobs/{sha256}.gz")).with_context(|| {
                    format!("`{name}` names `blobs/{sha256}.gz`, which is missing")
                })?;
                store.blobs.insert(sha256.to_string(), blob);
                files.insert(path.to_string(), sha256.to_string());
            }
            store.releases.insert(set, files);
        }
        Ok(store)
    }

    /// The template sets the store has the kit of (for the tests).
    #[cfg(test)]
    pub(crate) fn sets(&self) -> impl Iterator<Item = u32> + '_ {
        self.releases.keys().copied()
    }

    /// The kit files of template set `set`: path inside the kit crate to
    /// SHA-256, if the store has that set (for the tests).
    #[cfg(test)]
    pub(crate) fn release(&self, set: u32) -> Option<&BTreeMap<String, String>> {
        self.releases.get(&set)
    }

    /// The bytes that hash to `sha256`, if gpkit released them as the file
    /// `path` of a project named `project`: a file of the kit crate
    /// (`kit/...`) that some template set shipped at that path, checked
    /// against the hash. `None` for anything else: such a base must be kept
    /// as a copy.
    pub fn find(&self, path: &str, sha256: &str, project: &str) -> Option<Vec<u8>> {
        let in_kit = path.strip_prefix(KIT_DIR)?.strip_prefix('/')?;
        if in_kit == KIT_MANIFEST {
            // Rendered for each project: try each released template, the
            // newest first (most projects are of a recent set, and each
            // try unpacks a blob).
            let mut tried = BTreeSet::new();
            return self
                .releases
                .values()
                .rev()
                .filter_map(|files| files.get(KIT_MANIFEST))
                .filter(|template| tried.insert(*template))
                .filter_map(|template| self.verified(template))
                .filter_map(|template| kit_manifest(&template, project).ok())
                .find(|bytes| sha256_hex(bytes) == sha256);
        }
        let released = self
            .releases
            .values()
            .any(|files| files.get(in_kit).is_some_and(|s| s == sha256));
        if !released {
            return None;
        }
        self.verified(sha256)
    }

    /// The bytes of blob `sha256`, if it is there, unpacks and hashes to
    /// its name.
    fn verified(&self, sha256: &str) -> Option<Vec<u8>> {
        let mut verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        verified
            .entry(sha256.to_string())
            .or_insert_with(|| {
                let bytes = unpack(self.blobs.get(sha256)?)?;
                (sha256_hex(&bytes) == sha256).then_some(bytes)
            })
            .clone()
    }
}

/// `bytes` as the store keeps them: gzipped (what `scripts/record-kit-release`
/// and `scripts/fixture` write, with Python's `gzip`).
pub fn pack(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder
        .write_all(bytes)
        .and_then(|()| encoder.finish())
        .expect("gzip into memory does not fail")
}

/// The bytes a blob of the store holds, or `None` if it is not gzip.
pub fn unpack(blob: &[u8]) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(blob)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &[u8] = b"//! Config.\n";
    const MANIFEST: &[u8] = b"[package]\nname = \"gpkit-kit\"\n";

    /// A store with set 1 (`src/config.rs`, `Cargo.toml`), a list entry
    /// whose blob holds other bytes than its name says, and `corrupt` as
    /// those bytes.
    fn store(corrupt: &'static [u8]) -> Store {
        let list = format!(
            "# header\n{}  src/config.rs\n{}  Cargo.toml\n{}  src/corrupt.rs\n",
            sha256_hex(CONFIG),
            sha256_hex(MANIFEST),
            sha256_hex(b"the real bytes"),
        );
        let list: &'static str = Box::leak(list.into_boxed_str());
        let blob = |bytes: &[u8]| -> &'static [u8] { Box::leak(pack(bytes).into_boxed_slice()) };
        let (config, manifest, corrupt) = (blob(CONFIG), blob(MANIFEST), blob(corrupt));
        let files = move |path: &str| -> Option<&'static [u8]> {
            match path {
                "set-1.sha256" => Some(list.as_bytes()),
                p if p == format!("blobs/{}.gz", sha256_hex(CONFIG)) => Some(config),
                p if p == format!("blobs/{}.gz", sha256_hex(MANIFEST)) => Some(manifest),
                p if p == format!("blobs/{}.gz", sha256_hex(b"the real bytes")) => Some(corrupt),
                _ => None,
            }
        };
        Store::load(vec!["set-1.sha256", "blobs"], files).unwrap()
    }

    #[test]
    fn a_released_kit_file_is_found_by_path_and_hash() {
        let store = store(b"");
        assert_eq!(store.sets().collect::<Vec<_>>(), [1]);
        let sha = sha256_hex(CONFIG);
        assert_eq!(
            store.find("kit/src/config.rs", &sha, "shop").as_deref(),
            Some(CONFIG)
        );
        // Only the kit crate's files, at a path some release had them.
        assert_eq!(store.find("src/config.rs", &sha, "shop"), None);
        assert_eq!(store.find("kit/src/other.rs", &sha, "shop"), None);
        assert_eq!(
            store.find("kit/src/config.rs", &sha256_hex(b"x"), "shop"),
            None
        );
    }

    #[test]
    fn bytes_that_do_not_match_their_hash_are_never_used() {
        let store = store(b"tampered bytes");
        let sha = sha256_hex(b"the real bytes");
        assert_eq!(store.find("kit/src/corrupt.rs", &sha, "shop"), None);
        let honest = self::store(b"the real bytes");
        assert_eq!(
            honest.find("kit/src/corrupt.rs", &sha, "shop").as_deref(),
            Some(&b"the real bytes"[..])
        );
    }

    #[test]
    fn a_blob_that_is_not_gzip_is_never_used() {
        let sha = sha256_hex(CONFIG);
        let list: &'static str = Box::leak(format!("{sha}  src/config.rs\n").into_boxed_str());
        let store = Store::load(vec!["set-1.sha256"], move |p| match p {
            "set-1.sha256" => Some(list.as_bytes()),
            _ => Some(CONFIG),
        })
        .unwrap();
        assert_eq!(store.find("kit/src/config.rs", &sha, "shop"), None);
        assert_eq!(unpack(&pack(CONFIG)).as_deref(), Some(CONFIG));
    }

    #[test]
    fn the_kit_manifest_is_renamed_for_the_project() {
        let store = store(b"");
        let shop = b"[package]\nname = \"shop-kit\"\n";
        let sha = sha256_hex(shop);
        assert_eq!(
            store.find("kit/Cargo.toml", &sha, "shop").as_deref(),
            Some(&shop[..])
        );
        assert_eq!(store.find("kit/Cargo.toml", &sha, "other"), None);
        assert_eq!(
            store.find("kit/Cargo.toml", &sha256_hex(MANIFEST), "shop"),
            None
        );
    }

    #[test]
    fn a_list_naming_a_missing_blob_is_an_error() {
        let list = format!("{}  src/a.rs\n", sha256_hex(b"a"));
        let list: &'static str = Box::leak(list.into_boxed_str());
        let err = Store::load(vec!["set-2.sha256"], move |p| {
            (p == "set-2.sha256").then_some(list.as_bytes())
        })
        .unwrap_err();
        assert!(format!("{err:#}").contains("missing"), "{err:#}");
    }

    /// The embedded store loads, and has the kit of the current template
    /// set exactly as `templates/kit` holds it: releasing a set records its
    /// kit (`scripts/record-kit-release`).
    #[test]
    fn the_embedded_store_has_the_current_kit() {
        use crate::engine::blueprint::TEMPLATE_SET_VERSION;
        let store = Store::embedded();
        let current: BTreeMap<String, String> = templates::template_set(KIT_DIR)
            .unwrap()
            .iter()
            .map(|f| (f.output.to_string(), sha256_hex(f.contents())))
            .collect();
        assert_eq!(
            store.release(TEMPLATE_SET_VERSION),
            Some(&current),
            "the kit in templates/kit is not the kit of template set {TEMPLATE_SET_VERSION} \
             recorded in templates/released: a kit change needs a new template set; after \
             bumping it, run `scripts/make-upgrade-fixtures --release <N>` (which runs \
             `scripts/record-kit-release <N>`)"
        );
        for set in store.sets().collect::<Vec<_>>() {
            for (path, sha256) in store.release(set).unwrap() {
                if path != KIT_MANIFEST {
                    let found = store.find(&format!("{KIT_DIR}/{path}"), sha256, "shop");
                    assert!(found.is_some(), "set {set}: {path} does not match its hash");
                }
            }
        }
    }
}
