//! Names: project-name validation, case conversion, event names and field
//! types, on arbitrary text. Besides never panicking, it checks that
//! - `snake_case` is idempotent and gives lowercase words joined by `_` (the
//!   other conversions lose words: `a_b_c` is `ABC`, which reads back as `abc`);
//! - a valid project name's crate name is valid too, and maps to itself;
//! - a valid event name's three spellings (the wire name is what the manifest
//!   records) convert to one another, and are valid event names with the same
//!   three spellings;
//! - a field type that maps to Rust maps the same way after trimming;
//! - every refusal of a name says what to do instead (a `help:` line).
#![no_main]

use gpkit::domain::events::{self, EventNames};
use gpkit::domain::names::{self, PackageName};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|raw: &str| {
    let snake = names::snake_case(raw);
    assert_eq!(
        names::snake_case(&snake),
        snake,
        "snake_case of {raw:?} is not idempotent"
    );
    assert!(
        snake.is_empty()
            || snake.split('_').all(|word| !word.is_empty()
                && word
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())),
        "snake_case of {raw:?} is {snake:?}"
    );

    if let Ok(name) = PackageName::parse(raw) {
        let crate_name = name.crate_name();
        let again = PackageName::parse(&crate_name)
            .unwrap_or_else(|err| panic!("crate name of {raw:?} is refused: {err:#}"));
        assert_eq!(again.crate_name(), crate_name);
    }

    if let Ok(event) = EventNames::parse(raw) {
        for form in [&event.wire, &event.type_name, &event.module] {
            assert_eq!(
                names::snake_case(form),
                event.module,
                "{form:?} (from {raw:?})"
            );
            assert_eq!(
                names::pascal_case(form),
                event.type_name,
                "{form:?} (from {raw:?})"
            );
            assert_eq!(
                names::lower_camel_case(form),
                event.wire,
                "{form:?} (from {raw:?})"
            );
            let again = EventNames::parse(form)
                .unwrap_or_else(|err| panic!("{form:?} (from {raw:?}) is refused: {err:#}"));
            assert_eq!(again, event, "{form:?} (from {raw:?}) names another event");
        }
    }

    let _ = EventNames::recorded(raw);

    if let Ok(rust) = events::rust_type(raw) {
        assert_eq!(events::rust_type(raw.trim()).ok(), Some(rust));
    }

    for (what, refusal) in [
        ("project name", PackageName::parse(raw).err()),
        ("event name", EventNames::parse(raw).err()),
        ("field", events::parse_field(raw).err()),
        ("listener", events::check_listener(raw).err()),
    ] {
        if let Some(err) = refusal {
            let text = format!("{err:#}");
            assert!(
                text.contains("\nhelp: "),
                "{what} {raw:?}: no help line in {text:?}"
            );
        }
    }
});
