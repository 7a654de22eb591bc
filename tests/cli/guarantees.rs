//! The table of promises (`docs/guarantees.md`) names only tests that exist.
//!
//! Each cell of the table names the tests that prove a promise in one
//! scenario, or says why none does. A test renamed or deleted would leave
//! the table claiming a proof that is gone; this check fails instead, and
//! also when the counts the document states are not its table's.

use std::path::Path;

/// How one cell of the table stands.
#[derive(Debug, PartialEq)]
enum Cell {
    Covered(Vec<String>),
    NotCovered,
    NotApplicable,
}

/// The scenario columns after the promise's own.
const SCENARIOS: usize = 8;

#[test]
fn every_test_the_table_of_promises_names_exists_and_its_counts_add_up() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/guarantees.md")).unwrap();
    let rows: Vec<(&str, Vec<Cell>)> = doc
        .lines()
        .filter(|line| line.starts_with("| **"))
        .map(|line| {
            let mut cells = line.trim_matches('|').split('|').map(str::trim);
            let promise = cells.next().unwrap();
            (promise, cells.map(cell).collect())
        })
        .collect();
    assert!(rows.len() >= 10, "the table has {} promises", rows.len());

    let mut problems = Vec::new();
    for (promise, cells) in &rows {
        if cells.len() != SCENARIOS {
            problems.push(format!("{promise}: {} cells, not {SCENARIOS}", cells.len()));
        }
        for (column, cell) in cells.iter().enumerate() {
            match cell {
                Cell::Covered(names) if names.is_empty() => problems.push(format!(
                    "{promise}, column {}: names no test and says neither `not covered` nor `n/a`",
                    column + 1
                )),
                Cell::Covered(names) => {
                    for name in names {
                        if let Err(problem) = exists(root, name) {
                            problems.push(format!("{promise}: `{name}`: {problem}"));
                        }
                    }
                }
                Cell::NotCovered | Cell::NotApplicable => {}
            }
        }
    }
    assert!(
        problems.is_empty(),
        "docs/guarantees.md:\n{}",
        problems.join("\n")
    );

    let all: Vec<&Cell> = rows.iter().flat_map(|(_, cells)| cells).collect();
    let count = |wanted: fn(&Cell) -> bool| all.iter().filter(|cell| wanted(cell)).count();
    let stated = format!(
        "**Cells: {}; covered {}, not covered {}, n/a {}.**",
        all.len(),
        count(|cell| matches!(cell, Cell::Covered(_))),
        count(|cell| matches!(cell, Cell::NotCovered)),
        count(|cell| matches!(cell, Cell::NotApplicable)),
    );
    assert!(
        doc.contains(&stated),
        "docs/guarantees.md should state the table's counts: {stated}"
    );
}

/// Reads a cell: `not covered: why`, `n/a: why`, or the code spans naming tests.
fn cell(text: &str) -> Cell {
    if text.starts_with("not covered") {
        return Cell::NotCovered;
    }
    if text.starts_with("n/a") {
        return Cell::NotApplicable;
    }
    let names = text
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    Cell::Covered(names)
}

/// Whether the test a cell names is there: a test function in a module of
/// the kit's or gpkit's tests that the test binary declares (not commented
/// out, not compiled out by a `#[cfg]`), or the chaos run and one of its
/// `--break` short forms, as scripts/test runs them in CI.
fn exists(root: &Path, name: &str) -> Result<(), String> {
    if name == "chaos" {
        script(root, "scripts/chaos")?;
        return ci_runs(root, "scripts/chaos --seed");
    }
    if let Some(mode) = name.strip_prefix("chaos --break ") {
        let source = script(root, "scripts/chaos")?;
        let choices = source
            .lines()
            .find(|line| line.contains("\"--break\"") && line.contains("choices="))
            .ok_or("scripts/chaos declares no --break choices")?;
        if !choices.contains(&format!("\"{mode}\"")) {
            return Err(format!("scripts/chaos has no --break {mode}"));
        }
        return ci_runs(root, &format!("--break {mode}"));
    }
    let attributes = crate::support::test_attributes(name)?;
    // CI runs gpkit's ignored tests (`--include-ignored`), not the kit's.
    if name.starts_with("kit::") && attributes.iter().any(|line| line.starts_with("#[ignore")) {
        return Err(format!("{name} is ignored: CI does not run it"));
    }
    Ok(())
}

/// Whether scripts/test, the suite CI runs, runs `command`.
fn ci_runs(root: &Path, command: &str) -> Result<(), String> {
    match script(root, "scripts/test")?.contains(command) {
        true => Ok(()),
        false => Err(format!("scripts/test does not run `{command}`")),
    }
}

fn script(root: &Path, path: &str) -> Result<String, String> {
    std::fs::read_to_string(root.join(path)).map_err(|_| format!("no {path}"))
}
