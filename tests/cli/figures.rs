//! Every figure the READMEs state can be taken again: README.md's figures
//! table names, for each, the script that took it and the template set it
//! measured; a figure in a generated project's documents (the kit's docs
//! and README, the project's README) names both in its paragraph; and every
//! script they name still runs as far as its options: a Python script's
//! `--help` (its imports and argument parser), a bash script parsed
//! (`bash -n`), and the kit's bench test that a bash script runs found by
//! name. The benches' Rust programs are compiled as binaries of a generated
//! project (`BENCH_SOURCES` in event_e2e.rs).

use std::collections::BTreeSet;
use std::process::Command;

use gpkit::engine::blueprint::TEMPLATE_SET_VERSION;

use crate::support::repo;

/// The header of README.md's figures table.
const FIGURES_HEADER: &str = "| what | figure | script, template set | bench |";

/// The rows of README.md's figures table, each split into its cells.
fn figure_rows() -> Vec<Vec<String>> {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let table = readme
        .split_once(FIGURES_HEADER)
        .unwrap_or_else(|| panic!("README.md has no figures table `{FIGURES_HEADER}`"))
        .1;
    table
        .lines()
        .skip(2)
        .take_while(|line| line.starts_with("| "))
        .map(|line| {
            line.trim_matches('|')
                .split(" | ")
                .map(|cell| cell.trim().to_string())
                .collect()
        })
        .collect()
}

/// The template sets a text names (`set 24`, `sets 22 and 21`).
fn sets_named(text: &str) -> Vec<u32> {
    let words: Vec<&str> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    let mut sets = Vec::new();
    for (i, word) in words.iter().enumerate() {
        if *word == "set" || *word == "sets" {
            let mut rest = words[i + 1..].iter();
            while let Some(Ok(set)) = rest.next().map(|w| w.parse::<u32>()) {
                sets.push(set);
                if rest.clone().next() != Some(&"and") {
                    break;
                }
                rest.next();
            }
        }
    }
    sets
}

/// The scripts of gpkit's repository a text names in backticks
/// (`` `scripts/bench/load --release` ``: scripts/bench/load).
fn scripts_named(text: &str) -> BTreeSet<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter_map(|code| code.split_whitespace().next())
        .filter(|path| path.starts_with("scripts/") && !path.ends_with(".rs"))
        .map(str::to_string)
        .collect()
}

#[test]
fn every_figure_in_the_readme_names_its_script_and_template_set() {
    let rows = figure_rows();
    assert!(rows.len() >= 11, "{rows:?}");
    for row in &rows {
        assert_eq!(row.len(), 4, "{row:?}");
        let named = &row[2];
        let scripts = scripts_named(named);
        assert!(!scripts.is_empty(), "no script for the figure {row:?}");
        for script in &scripts {
            assert!(
                repo().join(script).is_file(),
                "{script}: no such script ({row:?})"
            );
        }
        let sets = sets_named(named);
        assert!(!sets.is_empty(), "no template set for the figure {row:?}");
        for set in sets {
            assert!(
                (1..=TEMPLATE_SET_VERSION).contains(&set),
                "set {set}: not a template set so far ({row:?})"
            );
        }
    }
}

/// The documents a generated project carries that state figures.
fn project_documents() -> Vec<std::path::PathBuf> {
    let mut documents = vec![
        repo().join("templates/kit/README.md"),
        repo().join("templates/project/README.md.jinja"),
    ];
    for entry in std::fs::read_dir(repo().join("templates/kit/docs")).unwrap() {
        documents.push(entry.unwrap().path());
    }
    documents
}

/// Whether a paragraph states a measured figure: it says "measured" and
/// has a number with a unit of time or rate.
fn states_a_measured_figure(paragraph: &str) -> bool {
    let words: Vec<&str> = paragraph.split_whitespace().collect();
    paragraph.contains("measured")
        && words.windows(2).any(|pair| {
            pair[0].trim_start_matches('(').parse::<f64>().is_ok()
                && [
                    "ms", "ms,", "ms)", "s", "s,", "s)", "events/s", "runs/s", "tasks/s",
                ]
                .contains(&pair[1])
        })
}

#[test]
fn every_figure_in_a_projects_documents_names_its_script_and_template_set() {
    let mut figures = 0;
    for document in project_documents() {
        let text = std::fs::read_to_string(&document).unwrap();
        for paragraph in text.split("\n\n").filter(|p| states_a_measured_figure(p)) {
            figures += 1;
            let scripts = scripts_named(paragraph);
            assert!(
                !scripts.is_empty() && !sets_named(paragraph).is_empty(),
                "{}: a figure without its script and template set:\n{paragraph}",
                document.display()
            );
            for script in scripts {
                assert!(repo().join(&script).is_file(), "{script}: no such script");
            }
        }
    }
    // templates/kit/docs/worker.md: commit to listener.
    assert!(figures >= 1, "no figure found: the check finds none");
}

/// Every script README.md or a project's documents name beside a figure.
fn figure_scripts() -> BTreeSet<String> {
    let mut scripts: BTreeSet<String> = figure_rows()
        .iter()
        .flat_map(|row| scripts_named(&row[2]))
        .collect();
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    for line in readme
        .lines()
        .filter(|line| line.contains("(template set "))
    {
        scripts.extend(
            scripts_named(line)
                .into_iter()
                .filter(|s| s.contains("bench")),
        );
    }
    for document in project_documents() {
        scripts.extend(scripts_named(&std::fs::read_to_string(document).unwrap()));
    }
    scripts
}

#[test]
fn every_script_that_took_a_figure_still_runs_as_far_as_its_options() {
    let scripts = figure_scripts();
    assert!(scripts.len() >= 8, "{scripts:?}");
    for script in &scripts {
        let path = repo().join(script);
        let text = std::fs::read_to_string(&path).unwrap();
        let shebang = text.lines().next().unwrap_or("");
        let output = if shebang.ends_with("python3") {
            Command::new("python3").arg(&path).arg("--help").output()
        } else if shebang.ends_with("bash") {
            Command::new("bash").arg("-n").arg(&path).output()
        } else {
            panic!("{script}: neither Python 3 nor bash ({shebang})")
        }
        .unwrap();
        assert!(
            output.status.success(),
            "{script} does not run:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        for test in kit_tests_run_by(&text) {
            assert_kit_test_exists(script, &test);
        }
    }
}

/// The kit's tests a script runs by their path (`tests::limits::bench_...`).
fn kit_tests_run_by(script: &str) -> BTreeSet<String> {
    script
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .filter(|word| word.starts_with("tests::") && word.matches("::").count() == 2)
        .map(str::to_string)
        .collect()
}

/// The kit's test `tests::<module>::<name>` is a test of its suite (run
/// by the script with `--ignored` when it is ignored).
fn assert_kit_test_exists(script: &str, test: &str) {
    let name = test.replacen("tests::", "kit::", 1);
    if let Err(why) = crate::support::test_attributes(&name) {
        panic!("{script} runs {test}: {why}");
    }
}
