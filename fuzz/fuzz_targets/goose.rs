//! The generated project's goose migration parser and file-name rules
//! (`templates/kit/src/migrate/{parser,naming}.rs`, compiled in as gpkit's
//! conformance test does), on arbitrary UTF-8. Besides never panicking or
//! overflowing the stack, it checks that
//! - an error's line number is a line of the file;
//! - statements are trimmed, and NO TRANSACTION applies to both directions
//!   alike;
//! - a version read from a file name is positive, and a `snake_case`
//!   description makes a valid file name (`1_<description>.sql` is version 1).
#![no_main]

#[allow(dead_code)]
#[path = "../../templates/kit/src/migrate/parser.rs"]
mod parser;

#[allow(dead_code)]
#[path = "../../templates/kit/src/migrate/naming.rs"]
mod naming;

use libfuzzer_sys::fuzz_target;
use parser::{Direction, parse};

/// A fixed environment for `-- +goose ENVSUB ON` sections: an ASCII value,
/// an empty one and a multi-byte one (for `${VAR:offset:length}` cuts).
fn env(name: &str) -> Option<String> {
    match name {
        "A" => Some("abc".to_owned()),
        "EMPTY" => Some(String::new()),
        "U" => Some("é€😀".to_owned()),
        _ => None,
    }
}

fuzz_target!(|sql: &str| {
    let lines = sql.split('\n').count();
    let mut use_tx = Vec::new();
    for direction in [Direction::Up, Direction::Down] {
        match parse(sql, direction, &env) {
            Ok(parsed) => {
                for statement in &parsed.statements {
                    assert_eq!(statement.trim(), statement, "{direction}: untrimmed");
                }
                use_tx.push(parsed.use_tx);
            }
            Err(err) => {
                if let Some(line) = err.line() {
                    assert!(
                        (1..=lines).contains(&line),
                        "{direction}: line {line} of {lines}: {err}"
                    );
                }
            }
        }
    }
    if let [up, down] = use_tx[..] {
        assert_eq!(up, down, "NO TRANSACTION differs between directions");
    }

    if let Ok(version) = naming::parse_version(sql) {
        assert!(version > 0);
        let _ = naming::is_timestamp(version);
    }
    let description = naming::snake_case(sql);
    if !description.is_empty() {
        let file_name = format!("1_{description}.sql");
        assert_eq!(naming::parse_version(&file_name), Ok(1), "{file_name:?}");
    }
});
