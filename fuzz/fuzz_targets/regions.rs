//! The managed-region parser and its 3-way merge, on arbitrary UTF-8: the
//! input is split into base, ours and theirs at `\0` bytes. Besides never
//! panicking, it checks that
//! - a file merged with itself as base, ours and theirs is unchanged;
//! - a successful merge is stable: merging its result again changes nothing;
//! - a template without regions leaves the user's file as it is.
#![no_main]

use gpkit::engine::regions::{has_regions, merge};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &str| {
    let mut parts = input.splitn(3, '\0');
    let base = parts.next().unwrap_or_default();
    let ours = parts.next().unwrap_or(base);
    let theirs = parts.next().unwrap_or(ours);

    for text in [base, ours, theirs] {
        if let Ok(same) = merge(text, text, text) {
            assert_eq!(
                same,
                Ok(text.to_string()),
                "a file merged with itself changed"
            );
        }
    }

    if let Ok(Ok(merged)) = merge(base, ours, theirs) {
        let again = merge(base, &merged, theirs).expect("the merged file parses");
        assert_eq!(again, Ok(merged), "a second merge changed the result");
    }

    if !has_regions(theirs)
        && let Ok(result) = merge(base, ours, theirs)
    {
        assert_eq!(
            result,
            Ok(ours.to_string()),
            "a template without regions changed the file"
        );
    }
});
