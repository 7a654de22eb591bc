//! Managed regions: the parts of a user-owned file that gpkit keeps up to
//! date, between `// gpkit:begin <name>` and `// gpkit:end <name>` lines
//! (in Markdown, `<!-- gpkit:begin <name> -->` and `<!-- gpkit:end <name> -->`).
//!
//! Outside the markers the file is the user's alone. Inside, gpkit replaces
//! what it wrote last time with what the templates render now, and stops
//! (rather than guess) when the markers are gone or the user edited inside.

use anyhow::{Result, bail};

const BEGIN: &str = "// gpkit:begin ";
const END: &str = "// gpkit:end ";

/// The name of the region a marker line begins (`begin`) or ends.
fn marker(line: &str, begin: bool) -> Option<&str> {
    let trimmed = line.trim();
    let keyword = if begin { "gpkit:begin " } else { "gpkit:end " };
    let inner = trimmed.strip_prefix("// ").or_else(|| {
        trimmed
            .strip_prefix("<!-- ")
            .and_then(|t| t.strip_suffix(" -->"))
    })?;
    inner.strip_prefix(keyword).map(str::trim)
}

/// One region: its name and the lines between the markers.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Region {
    name: String,
    /// Byte range of the region's body (after the begin line, up to the end line).
    body: std::ops::Range<usize>,
}

fn regions(text: &str) -> Result<Vec<Region>> {
    let mut found = Vec::new();
    let mut open: Option<(String, usize)> = None;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if let Some(name) = marker(line, true) {
            if let Some((outer, _)) = &open {
                bail!("region `{name}` begins inside region `{outer}`");
            }
            open = Some((name.to_string(), offset + line.len()));
        } else if let Some(name) = marker(line, false) {
            match open.take() {
                Some((begun, _)) if found.iter().any(|r: &Region| r.name == begun) => {
                    // Which copy would gpkit update? Neither, rather than guess.
                    bail!(
                        "region `{begun}` appears twice; a region's name must be unique in a file"
                    )
                }
                Some((begun, start)) if begun == name => {
                    found.push(Region {
                        name: begun,
                        body: start..offset,
                    });
                }
                _ => bail!("`{}` has no matching `{BEGIN}{name}`", line.trim()),
            }
        }
        offset += line.len();
    }
    if let Some((name, _)) = open {
        bail!("region `{name}` has no `{END}{name}` line");
    }
    Ok(found)
}

fn body<'a>(text: &'a str, name: &str) -> Result<Option<&'a str>> {
    Ok(regions(text)?
        .into_iter()
        .find(|r| r.name == name)
        .map(|r| &text[r.body]))
}

/// Why a region could not be updated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegionProblem {
    /// The markers are gone; `wanted` is what the region should hold.
    Missing { name: String, wanted: String },
    /// The user edited inside the region, and gpkit's version changed too.
    Edited { name: String, wanted: String },
}

impl RegionProblem {
    /// What to tell the user: which region, and the code to restore.
    pub(crate) fn explain(&self, path: &str) -> String {
        match self {
            RegionProblem::Missing { name, wanted } => format!(
                "`{path}`: the gpkit region `{name}` is gone. Restore these lines (or add the code \
                 between them by hand, then rerun):\n{BEGIN}{name}\n{wanted}{END}{name}"
            ),
            RegionProblem::Edited { name, wanted } => format!(
                "`{path}`: the gpkit region `{name}` was edited by hand. Move your lines out of the \
                 region, or make it read:\n{BEGIN}{name}\n{wanted}{END}{name}"
            ),
        }
    }
}

/// Brings the regions of `ours` (the file on disk) up to date with `theirs`
/// (the template's rendering), given `base` (what gpkit last wrote).
/// Returns the new text, or the problems that stop the update.
pub fn merge(base: &str, ours: &str, theirs: &str) -> Result<Result<String, Vec<RegionProblem>>> {
    let mut out = ours.to_string();
    let mut problems = Vec::new();
    // Work from the last region backwards so earlier byte ranges stay valid.
    let mut wanted: Vec<Region> = regions(theirs)?;
    wanted.reverse();
    for region in wanted {
        let new_body = &theirs[region.body.clone()];
        let old_body = body(base, &region.name)?;
        let current = regions(&out)?.into_iter().find(|r| r.name == region.name);
        match current {
            None if old_body == Some(new_body) => {
                // gpkit has nothing new for the region the user removed.
            }
            None => problems.push(RegionProblem::Missing {
                name: region.name.clone(),
                wanted: new_body.to_string(),
            }),
            Some(current) => {
                let current_body = &out[current.body.clone()];
                if current_body == new_body {
                    continue;
                }
                if old_body.is_some_and(|old| old == current_body) {
                    out.replace_range(current.body, new_body);
                } else {
                    problems.push(RegionProblem::Edited {
                        name: region.name.clone(),
                        wanted: new_body.to_string(),
                    });
                }
            }
        }
    }
    Ok(if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    })
}

/// Whether `text` has any managed region.
pub fn has_regions(text: &str) -> bool {
    text.lines().any(|l| marker(l, true).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "//! lib\n// gpkit:begin modules\npub mod config;\n// gpkit:end modules\n";
    const THEIRS: &str =
        "//! lib\n// gpkit:begin modules\npub mod config;\npub mod worker;\n// gpkit:end modules\n";

    #[test]
    fn replaces_an_untouched_region_and_keeps_everything_around_it() {
        let ours = format!("{BASE}\npub mod orders;\n");
        let merged = merge(BASE, &ours, THEIRS).unwrap().unwrap();
        assert_eq!(
            merged,
            "//! lib\n// gpkit:begin modules\npub mod config;\npub mod worker;\n// gpkit:end modules\n\npub mod orders;\n"
        );
    }

    #[test]
    fn an_up_to_date_region_is_no_change() {
        assert_eq!(merge(BASE, THEIRS, THEIRS).unwrap().unwrap(), THEIRS);
    }

    #[test]
    fn missing_markers_stop_the_update_and_say_what_to_restore() {
        let problems = merge(BASE, "//! lib\npub mod config;\n", THEIRS)
            .unwrap()
            .unwrap_err();
        let text = problems[0].explain("src/lib.rs");
        assert!(text.contains("region `modules` is gone"), "{text}");
        assert!(text.contains("pub mod worker;"), "{text}");
    }

    #[test]
    fn an_edit_inside_the_region_is_never_overwritten() {
        let ours = BASE.replace("pub mod config;", "pub mod config;\npub mod mine;");
        let problems = merge(BASE, &ours, THEIRS).unwrap().unwrap_err();
        assert!(matches!(&problems[0], RegionProblem::Edited { name, .. } if name == "modules"));
    }

    #[test]
    fn markdown_regions_use_html_comments() {
        let base = "# shop\n<!-- gpkit:begin worker -->\n<!-- gpkit:end worker -->\nours\n";
        let theirs =
            "# shop\n<!-- gpkit:begin worker -->\nThe worker.\n<!-- gpkit:end worker -->\nours\n";
        assert_eq!(merge(base, base, theirs).unwrap().unwrap(), theirs);
    }

    #[test]
    fn unbalanced_markers_are_errors() {
        assert!(regions("// gpkit:begin a\n").is_err());
        assert!(regions("// gpkit:end a\n").is_err());
        assert!(regions("// gpkit:begin a\n// gpkit:begin b\n").is_err());
    }

    /// Found by fuzzing (`fuzz/fuzz_targets/regions.rs`): with two regions
    /// of one name, a file merged with itself came out "edited by hand"
    /// (the first region took the second's body, then differed from the base).
    #[test]
    fn a_region_name_used_twice_is_an_error() {
        let text = " // gpkit:begin registry\nr\n// gpkit:end registry\n\
                    // gpkit:begin registry\n // gpkit:end registry";
        let err = merge(text, text, text).unwrap_err().to_string();
        assert_eq!(
            err,
            "region `registry` appears twice; a region's name must be unique in a file"
        );
        assert!(
            regions("// gpkit:begin a\n// gpkit:end a\n// gpkit:begin b\n// gpkit:end b\n").is_ok()
        );
    }
}
