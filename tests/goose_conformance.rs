//! Conformance of the generated project's goose migration parser with pressly/goose.
//!
//! The parser and the file-name rules live in the project template
//! (`templates/kit/src/migrate/{parser,naming}.rs`) and depend on `std` only, so
//! they are compiled straight into this test. The corpus in `tests/fixtures/goose/`
//! (see its README) holds goose's own test data plus the JSON output of the real goose
//! parser for every file, in both directions.

// Not every public helper is exercised here.
#[allow(dead_code)]
#[path = "../templates/kit/src/migrate/parser.rs"]
mod parser;

#[allow(dead_code)]
#[path = "../templates/kit/src/migrate/naming.rs"]
mod naming;

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use parser::{Direction, ParsedSql, parse};
use serde_json::Value;

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/goose")
}

/// The variables goose's own envsub test sets; everything else is unset.
fn envsub_env(name: &str) -> Option<String> {
    let vars: HashMap<&str, &str> = [
        ("GOOSE_ENV_REGION", "us_east_"),
        ("GOOSE_ENV_SET_BUT_EMPTY_VALUE", ""),
        ("GOOSE_ENV_NAME", "foo"),
    ]
    .into_iter()
    .collect();
    vars.get(name).map(|value| (*value).to_owned())
}

fn no_env(_: &str) -> Option<String> {
    None
}

fn files_under(dir: &Path, suffix: &str, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            files_under(&path, suffix, out);
        } else if path.to_string_lossy().ends_with(suffix) {
            out.push(path);
        }
    }
}

/// Every (input .sql, expected .json) pair in the corpus.
fn expected_cases() -> Vec<(PathBuf, PathBuf)> {
    let root = corpus();
    let mut cases = Vec::new();

    let mut json = Vec::new();
    files_under(&root.join("expected-json"), ".json", &mut json);
    for expected in json {
        let relative = expected.strip_prefix(root.join("expected-json")).unwrap();
        let input = root.join(relative).with_extension("sql");
        cases.push((input, expected));
    }

    let mut inline = Vec::new();
    files_under(
        &root.join("parser_test_inline"),
        ".expected.json",
        &mut inline,
    );
    for expected in inline {
        let name = expected.file_name().unwrap().to_string_lossy();
        let input = expected.with_file_name(name.replace(".expected.json", ".sql"));
        cases.push((input, expected));
    }
    cases
}

/// Compares one direction with the JSON goose produced; returns a description of
/// each mismatch.
fn check_direction(
    label: &str,
    actual: Result<ParsedSql, parser::ParseError>,
    expected: &Value,
) -> Vec<String> {
    let mut problems = Vec::new();
    let expected_statements: Vec<String> = expected["statements"]
        .as_array()
        .expect("statements array")
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect();
    let expected_tx = expected["use_tx"].as_bool().expect("use_tx bool");
    match (actual, expected.get("error")) {
        (Ok(parsed), None) => {
            if parsed.statements != expected_statements {
                problems.push(format!(
                    "{label}: statements differ\n  expected: {expected_statements:?}\n  actual:   {:?}",
                    parsed.statements
                ));
            }
            if parsed.use_tx != expected_tx {
                problems.push(format!(
                    "{label}: use_tx {} != expected {expected_tx}",
                    parsed.use_tx
                ));
            }
        }
        (Ok(parsed), Some(error)) => problems.push(format!(
            "{label}: expected error {error}, got {:?}",
            parsed.statements
        )),
        (Err(error), None) => problems.push(format!("{label}: unexpected error: {error}")),
        (Err(error), Some(expected_error)) => {
            let expected_error = expected_error.as_str().unwrap();
            if error.message() != expected_error {
                problems.push(format!(
                    "{label}: error message differs\n  expected: {expected_error}\n  actual:   {}",
                    error.message()
                ));
            }
        }
    }
    problems
}

#[test]
fn whole_corpus_matches_goose_in_both_directions() {
    let cases = expected_cases();
    assert!(
        cases.len() >= 60,
        "corpus looks incomplete: {} cases",
        cases.len()
    );
    let mut problems = Vec::new();
    for (input, expected) in &cases {
        let sql =
            fs::read_to_string(input).unwrap_or_else(|e| panic!("read {}: {e}", input.display()));
        let expected: Value = serde_json::from_str(&fs::read_to_string(expected).unwrap()).unwrap();
        let in_envsub = input.components().any(|c| c.as_os_str() == "envsub");
        let env: &dyn Fn(&str) -> Option<String> = if in_envsub { &envsub_env } else { &no_env };
        let name = input.strip_prefix(corpus()).unwrap().display().to_string();
        for (direction, key) in [(Direction::Up, "up"), (Direction::Down, "down")] {
            problems.extend(check_direction(
                &format!("{name} [{key}]"),
                parse(&sql, direction, env),
                &expected[key],
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{} mismatches:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// goose's own golden-file test: statement N of `input.sql` equals `NN.<dir>.golden.sql`.
fn check_goldens(folder: &str, env: &dyn Fn(&str) -> Option<String>) -> usize {
    let mut tests: Vec<_> = fs::read_dir(corpus().join(folder))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    tests.sort();
    let mut checked = 0;
    for test in tests {
        let sql = fs::read_to_string(test.join("input.sql")).unwrap();
        for (direction, key) in [(Direction::Up, "up"), (Direction::Down, "down")] {
            let parsed = parse(&sql, direction, env)
                .unwrap_or_else(|e| panic!("{} [{key}]: {e}", test.display()));
            let mut goldens = Vec::new();
            for n in 1.. {
                let golden = test.join(format!("{n:02}.{key}.golden.sql"));
                if !golden.exists() {
                    break;
                }
                goldens.push(fs::read_to_string(golden).unwrap());
            }
            if key == "down" && goldens.is_empty() {
                // goose only checks Down when a down golden exists.
                continue;
            }
            assert_eq!(parsed.statements, goldens, "{} [{key}]", test.display());
            checked += goldens.len();
        }
    }
    checked
}

#[test]
fn valid_up_goldens() {
    assert_eq!(check_goldens("valid-up", &no_env), 32 - 9);
}

#[test]
fn envsub_goldens() {
    assert_eq!(check_goldens("envsub", &envsub_env), 9);
}

#[test]
fn valid_txn_marks_only_the_no_transaction_file() {
    let dir = corpus().join("valid-txn");
    for (file, use_tx) in [
        ("00001_create_users_table.sql", true),
        ("00002_rename_root.sql", true),
        ("00003_no_transaction.sql", false),
    ] {
        let sql = fs::read_to_string(dir.join(file)).unwrap();
        for direction in [Direction::Up, Direction::Down] {
            assert_eq!(
                parse(&sql, direction, &no_env).unwrap().use_tx,
                use_tx,
                "{file}"
            );
        }
    }
}

#[test]
fn invalid_up_files_fail_up_only() {
    let dir = corpus().join("invalid/up");
    for file in ["a.sql", "b.sql", "c.sql", "d.sql"] {
        let sql = fs::read_to_string(dir.join(file)).unwrap();
        assert!(parse(&sql, Direction::Up, &no_env).is_err(), "{file} up");
        assert!(parse(&sql, Direction::Down, &no_env).is_ok(), "{file} down");
    }
}

// ---- Quirks from the spec (goose-spec.md §2) not covered by the corpus files ----

fn up(sql: &str) -> Result<Vec<String>, String> {
    parse(sql, Direction::Up, &no_env)
        .map(|p| p.statements)
        .map_err(|e| e.to_string())
}

fn down(sql: &str) -> Result<Vec<String>, String> {
    parse(sql, Direction::Down, &no_env)
        .map(|p| p.statements)
        .map_err(|e| e.to_string())
}

#[test]
fn crlf_line_endings_work() {
    assert_eq!(
        up("-- +goose Up\r\nSELECT 1;\r\n-- +goose Down\r\nSELECT 2;\r\n").unwrap(),
        ["SELECT 1;"]
    );
}

#[test]
fn bom_is_not_stripped() {
    assert_eq!(
        up("\u{feff}-- +goose Up\nSELECT 1;\n").unwrap_err(),
        "failed to parse migration: unexpected state 0 on line \"\\ufeff-- +goose Up\", see https://github.com/pressly/goose#sql-migrations"
    );
}

#[test]
fn annotation_names_are_case_insensitive_but_goose_marker_is_not() {
    assert_eq!(
        up("-- +goose up\nSELECT 1;\n-- +goose down\n").unwrap(),
        ["SELECT 1;"]
    );
    assert_eq!(up("--+goose Up\nSELECT 1;\n").unwrap(), ["SELECT 1;"]);
    let err = up("-- +GOOSE UP\nSELECT 1;\n").unwrap_err();
    assert!(err.contains("unexpected state 0"), "{err}");
}

#[test]
fn malformed_annotations_fail_both_directions() {
    let cases = [
        (
            "  -- +goose Up\nSELECT 1;\n",
            "failed to parse annotation line \"  -- +goose Up\": \"  -- +goose Up\" contains leading whitespace: invalid annotation",
        ),
        (
            "-- +goose Up +goose Down\n",
            "failed to parse annotation line \"-- +goose Up +goose Down\": \"  Up +goose Down\" contains multiple '+goose' annotations: invalid annotation",
        ),
        (
            "-- +goose\n",
            "failed to parse annotation line \"-- +goose\": empty annotation",
        ),
        (
            "-- +goose Up -- comment\n",
            "failed to parse annotation line \"-- +goose Up -- comment\": \"Up  comment\" not supported: invalid annotation",
        ),
        (
            "-- +goose NO  TRANSACTION\n",
            "failed to parse annotation line \"-- +goose NO  TRANSACTION\": \"NO  TRANSACTION\" not supported: invalid annotation",
        ),
        (
            "-- +goose Up\n-- managed by +goose tooling\nSELECT 1;\n",
            "failed to parse annotation line \"-- managed by +goose tooling\": \"managed by  tooling\" not supported: invalid annotation",
        ),
    ];
    for (sql, message) in cases {
        assert_eq!(up(sql).unwrap_err(), message, "{sql:?}");
        assert_eq!(down(sql).unwrap_err(), message, "{sql:?}");
    }
}

#[test]
fn errors_carry_line_numbers() {
    let err = parse(
        "-- +goose Up\nSELECT 1;\n\n-- +goose Up\n",
        Direction::Up,
        &no_env,
    )
    .unwrap_err();
    assert_eq!(err.line(), Some(4));
    let err = parse(
        "-- +goose Up\nSELECT 1;\nSELECT\n  2\n",
        Direction::Up,
        &no_env,
    )
    .unwrap_err();
    assert_eq!(err.line(), Some(3));
    let err = parse(
        "-- +goose Up\n-- +goose StatementBegin\nSELECT 1;\n",
        Direction::Up,
        &no_env,
    )
    .unwrap_err();
    assert_eq!(err.line(), Some(2));
    assert_eq!(
        err.message(),
        "failed to parse migration: missing '-- +goose StatementEnd' annotation"
    );
    let err = parse("", Direction::Up, &no_env).unwrap_err();
    assert_eq!(err.line(), None);
}

#[test]
fn semicolon_rule_is_word_based() {
    let sql = "-- +goose Up\nSELECT 1; -- c\nSELECT 2   ; -- c\nSELECT 3 -- c ;\n;\nSELECT 4;-- c\nSELECT 5;\n";
    assert_eq!(
        up(sql).unwrap(),
        [
            "SELECT 1; -- c",
            "SELECT 2   ; -- c",
            "SELECT 3 -- c ;\n;",
            "SELECT 4;-- c\nSELECT 5;"
        ]
    );
    assert_eq!(up("-- +goose Up\n;\n").unwrap(), [";"]);
    assert_eq!(
        up("-- +goose Up\nSELECT 3; SELECT 3;\n").unwrap(),
        ["SELECT 3; SELECT 3;"]
    );
}

#[test]
fn whitespace_only_line_keeps_following_comments() {
    assert_eq!(
        up("-- +goose Up\n   \n-- kept\nSELECT 1;\n").unwrap(),
        ["-- kept\nSELECT 1;"]
    );
}

#[test]
fn empty_block_swallows_the_next_line() {
    let sql =
        "-- +goose Up\n-- +goose StatementBegin\n-- +goose StatementEnd\nSELECT 1;\nSELECT 2;\n";
    assert_eq!(up(sql).unwrap(), ["", "SELECT 2;"]);
}

#[test]
fn no_transaction_anywhere_applies_to_both_directions() {
    let sql = "-- +goose Up\nSELECT 1;\n-- +goose Down\n-- +goose NO TRANSACTION\nSELECT 2;\n";
    assert!(!parse(sql, Direction::Up, &no_env).unwrap().use_tx);
    assert!(!parse(sql, Direction::Down, &no_env).unwrap().use_tx);
}

#[test]
fn unfinished_statement_fails_only_its_own_direction() {
    let sql = "-- +goose Up\nSELECT 1;\n-- +goose Down\nSELECT 2\n";
    assert_eq!(up(sql).unwrap(), ["SELECT 1;"]);
    assert_eq!(
        down(sql).unwrap_err(),
        "failed to parse migration: state 4, direction: down: unexpected unfinished SQL query: \"SELECT 2\": missing semicolon?"
    );
}

#[test]
fn block_without_semicolon_and_merged_prefix() {
    let sql = "-- +goose Up\nSELECT\n-- +goose StatementBegin\n1\n-- +goose StatementEnd\n";
    assert_eq!(up(sql).unwrap(), ["SELECT\n1"]);
}

#[test]
fn only_up_annotation_is_valid_and_empty() {
    assert_eq!(up("-- +goose Up\n").unwrap(), Vec::<String>::new());
    assert_eq!(down("-- +goose Up\n").unwrap(), Vec::<String>::new());
}

#[test]
fn line_of_four_mib_is_too_long() {
    let long = "x".repeat(parser::MAX_LINE_BYTES);
    let err = up(&format!("-- +goose Up\nSELECT '{long}';\n")).unwrap_err();
    assert_eq!(
        err,
        "failed to scan migration: bufio.Scanner: token too long"
    );
    let fits = "x".repeat(parser::MAX_LINE_BYTES - 20);
    assert_eq!(
        up(&format!("-- +goose Up\nSELECT '{fits}';\n"))
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn envsub_semantics() {
    let env = |name: &str| match name {
        "SET" => Some("value".to_owned()),
        "EMPTY" => Some(String::new()),
        _ => None,
    };
    let one = |line: &str| {
        parse(
            &format!("-- +goose ENVSUB ON\n-- +goose Up\n{line}\n"),
            Direction::Up,
            &env,
        )
        .map(|p| p.statements.join("|"))
        .map_err(|e| e.to_string())
    };
    assert_eq!(
        one("SELECT '$SET ${SET}';").unwrap(),
        "SELECT 'value value';"
    );
    assert_eq!(
        one("SELECT '${UNSET:-d} ${EMPTY:-d} ${EMPTY-d} ${UNSET-d}';").unwrap(),
        "SELECT 'd d  d';"
    );
    assert_eq!(
        one("SELECT '${SET:1:3} ${SET: -2}';").unwrap(),
        "SELECT 'alu ue';"
    );
    assert_eq!(
        one("SELECT $$x$$, \\$SET, $(x), '\\\\';").unwrap(),
        "SELECT $x$, $SET, $(x), '\\\\';"
    );
    assert_eq!(one("SELECT 1; -- $").unwrap(), "SELECT 1; -- $");
    assert_eq!(
        one("SELECT $1;").unwrap_err(),
        "variable substitution failed: Expected identifier to start with a letter, got 1:\nSELECT $1;"
    );
    assert_eq!(
        one("SELECT '${UNSET?}';").unwrap_err(),
        "variable substitution failed: $UNSET: not set:\nSELECT '${UNSET?}';"
    );
    assert_eq!(
        one("SELECT '${UNSET?is $SET}';").unwrap_err(),
        "variable substitution failed: $UNSET: is value:\nSELECT '${UNSET?is $SET}';"
    );
    // ENVSUB errors fail both directions, even for lines of the other direction.
    let sql = "-- +goose Up\nSELECT 1;\n-- +goose Down\n-- +goose ENVSUB ON\nSELECT $1;\n";
    assert!(parse(sql, Direction::Up, &env).is_err());
}

/// Found by fuzzing (a deep input given to `fuzz/fuzz_targets/goose.rs`): a line of
/// expansions nested 300,000 deep, well within goose's 4 MiB line, overflowed the
/// stack. Nesting is now limited; goose (Go's growable stack) has no limit.
#[test]
fn deeply_nested_expansions_are_an_error_not_a_stack_overflow() {
    let env = |name: &str| (name == "SET").then(|| "value".to_owned());
    let nested = |depth: usize, operator: &str| {
        let line = format!(
            "SELECT '{}x{}';",
            format!("${{UNSET{operator}").repeat(depth),
            "}".repeat(depth)
        );
        parse(
            &format!("-- +goose Up\n-- +goose ENVSUB ON\n{line}\n"),
            Direction::Up,
            &env,
        )
        .map(|p| p.statements.join("|"))
        .map_err(|e| e.to_string())
    };
    let max = parser::interpolate::MAX_NESTING;
    assert_eq!(nested(max, ":-").unwrap(), "SELECT 'x';");
    assert_eq!(
        nested(max, "?").unwrap_err().lines().next().unwrap(),
        "variable substitution failed: $UNSET: x:"
    );
    for (depth, operator) in [
        (max + 1, ":-"),
        (300_000, ":-"),
        (300_000, "-"),
        (300_000, "?"),
    ] {
        let err = nested(depth, operator).unwrap_err();
        assert!(
            err.starts_with(&format!(
                "variable substitution failed: Expansions nested more than {max} deep are not supported:\n"
            )),
            "{depth} {operator}: {}",
            &err[..200]
        );
    }
}

// ---- File names (goose-spec.md §1.1, §1.4) ----

#[test]
fn version_from_file_name() {
    use naming::parse_version;
    assert_eq!(
        parse_version("20170506082420_add_some_column.sql"),
        Ok(20170506082420)
    );
    assert_eq!(parse_version("00001_init.sql"), Ok(1));
    assert_eq!(parse_version("migrations/1_a.b-c_d.sql"), Ok(1));
    assert_eq!(parse_version("+3_plus.go"), Ok(3));
    let message = |name: &str| parse_version(name).unwrap_err().to_string();
    assert_eq!(
        message("1_a.SQL"),
        "migration file does not have .sql or .go file extension"
    );
    assert_eq!(
        message("1_a.txt"),
        "migration file does not have .sql or .go file extension"
    );
    assert_eq!(message("001.sql"), "no filename separator '_' found");
    assert_eq!(
        message("abc_x.sql"),
        "failed to parse version from migration file: abc_x.sql: strconv.ParseInt: parsing \"abc\": invalid syntax"
    );
    assert_eq!(
        message("99999999999999999999_x.sql"),
        "failed to parse version from migration file: 99999999999999999999_x.sql: strconv.ParseInt: parsing \"99999999999999999999\": value out of range"
    );
    assert_eq!(
        message("0_x.sql"),
        "migration version must be greater than zero"
    );
    assert_eq!(
        message("-2_x.sql"),
        "migration version must be greater than zero"
    );
}

#[test]
fn timestamp_classification() {
    use naming::is_timestamp;
    assert!(is_timestamp(20170506082420));
    assert!(is_timestamp(20240229235959));
    assert!(!is_timestamp(20230229000000), "not a leap year");
    assert!(!is_timestamp(20171306082420), "month 13");
    assert!(!is_timestamp(20170506242420), "hour 24");
    assert!(!is_timestamp(19700101000000), "the epoch itself");
    assert!(is_timestamp(19700101000001));
    assert!(!is_timestamp(19691231235959), "before the epoch");
    assert!(!is_timestamp(1));
    assert!(!is_timestamp(2017050608242), "13 digits");
}

#[test]
fn snake_case_vectors() {
    use naming::snake_case;
    assert_eq!(
        snake_case("Add updated_at to users table"),
        "add_updated_at_to_users_table"
    );
    assert_eq!(snake_case("$()&^%(_--crazy__--input$)"), "crazy_input");
    assert_eq!(snake_case("foo!"), "foo_");
    assert_eq!(snake_case("foo!!"), "foo");
    assert_eq!(snake_case("CamelCase Name"), "camelcase_name");
}
