//! Project and identifier names: validation and case conversion.
//!
//! Every name a user types goes through here before anything touches the
//! disk, so that a bad name fails with an explanation instead of producing a
//! project that does not compile.

use anyhow::{Result, bail};

/// Rust keywords (2024 edition, strict and reserved). A crate or module with
/// one of these names cannot be used without raw identifiers.
const RUST_KEYWORDS: &[&str] = &[
    "abstract", "as", "async", "await", "become", "box", "break", "const", "continue", "crate",
    "do", "dyn", "else", "enum", "extern", "false", "final", "fn", "for", "gen", "if", "impl",
    "in", "let", "loop", "macro", "match", "mod", "move", "mut", "override", "priv", "pub", "ref",
    "return", "self", "Self", "static", "struct", "super", "trait", "true", "try", "type",
    "typeof", "union", "unsafe", "unsized", "use", "virtual", "where", "while", "yield",
];

/// Names that clash with the standard library's crates, with Cargo's own
/// build directories, or with the generated project's binaries.
const RESERVED_PACKAGE_NAMES: &[&str] = &[
    "alloc",
    "core",
    "proc_macro",
    "std",
    "test",
    "build",
    "deps",
    "examples",
    "incremental",
    "server",
    "migrate",
    "worker",
];

/// The longest project name gpkit accepts. Generated `use` lines start with
/// the crate name; past this length rustfmt would wrap them differently.
pub(crate) const MAX_NAME_LEN: usize = 40;

/// A validated Cargo package name, with the Rust crate identifier derived
/// from it (`my-shop` gives `my_shop`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageName {
    name: String,
}

impl PackageName {
    /// Checks `raw` against Cargo's and Rust's rules and gpkit's reserved
    /// names. The error says what is wrong and what to use instead.
    pub fn parse(raw: &str) -> Result<Self> {
        let help = "help: use a short lowercase name such as `shop` or `order-service`";
        if raw.is_empty() {
            bail!("the project name is empty\n{help}");
        }
        if raw == "." || raw == ".." || raw.contains('/') || raw.contains('\\') {
            bail!(
                "`{raw}` is a path, not a project name; the project is created in a new \
                 directory named after the project\n\
                 help: give a plain name, and use `-C <dir>` to choose the parent directory"
            );
        }
        if let Some(bad) = raw
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
        {
            bail!(
                "`{raw}` is not a valid Cargo package name: `{bad}` is not allowed \
                 (only ASCII letters, digits, `-` and `_`)\n{help}"
            );
        }
        if !raw.starts_with(|c: char| c.is_ascii_alphabetic()) {
            bail!("`{raw}` is not a valid Cargo package name: it must start with a letter\n{help}");
        }
        if raw.len() > MAX_NAME_LEN {
            bail!(
                "`{raw}` is {} characters long; gpkit takes names of up to {MAX_NAME_LEN}, \
                 so that generated code stays readable and formatted\n{help}",
                raw.len()
            );
        }
        let ident = raw.replace('-', "_");
        if RUST_KEYWORDS.contains(&raw) || RUST_KEYWORDS.contains(&ident.as_str()) {
            bail!("`{raw}` is a Rust keyword and cannot name a crate\n{help}");
        }
        if RESERVED_PACKAGE_NAMES.contains(&ident.as_str()) {
            bail!(
                "`{raw}` is reserved: it clashes with a standard crate, a Cargo build \
                 directory or one of the generated binaries\n{help}"
            );
        }
        Ok(Self {
            name: raw.to_string(),
        })
    }

    /// The Cargo package name, as the user typed it.
    pub(crate) fn as_str(&self) -> &str {
        &self.name
    }

    /// The Rust identifier of the library crate (`-` becomes `_`).
    pub fn crate_name(&self) -> String {
        self.name.replace('-', "_")
    }
}

/// Splits any spelling (`OrderPlaced`, `order_placed`, `orderPlaced`,
/// `order-placed`) into lowercase words.
pub(crate) fn words(raw: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut current = String::new();
    let chars: Vec<char> = raw.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        if !c.is_ascii_alphanumeric() {
            if !current.is_empty() {
                words.push(std::mem::take(&mut current));
            }
            continue;
        }
        let boundary = c.is_ascii_uppercase()
            && !current.is_empty()
            && (chars[i - 1].is_ascii_lowercase()
                || chars[i - 1].is_ascii_digit()
                || chars.get(i + 1).is_some_and(|n| n.is_ascii_lowercase()));
        if boundary {
            words.push(std::mem::take(&mut current));
        }
        current.push(c.to_ascii_lowercase());
    }
    if !current.is_empty() {
        words.push(current);
    }
    words
}

/// `order_placed`
pub fn snake_case(raw: &str) -> String {
    words(raw).join("_")
}

/// `OrderPlaced`
pub fn pascal_case(raw: &str) -> String {
    words(raw).iter().map(|w| capitalize(w)).collect()
}

/// `orderPlaced`, the Go kit's wire name for events.
pub fn lower_camel_case(raw: &str) -> String {
    let words = words(raw);
    let mut out = String::new();
    for (i, w) in words.iter().enumerate() {
        if i == 0 {
            out.push_str(w);
        } else {
            out.push_str(&capitalize(w));
        }
    }
    out
}

fn capitalize(word: &str) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(first) => first.to_ascii_uppercase().to_string() + chars.as_str(),
        None => String::new(),
    }
}

/// Whether `ident` is a Rust keyword.
pub fn is_rust_keyword(ident: &str) -> bool {
    RUST_KEYWORDS.contains(&ident)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_names() {
        for name in ["shop", "order-service", "order_service", "a1"] {
            assert_eq!(PackageName::parse(name).unwrap().as_str(), name);
        }
        assert_eq!(
            PackageName::parse("order-service").unwrap().crate_name(),
            "order_service"
        );
    }

    #[test]
    fn rejects_bad_names_with_a_reason() {
        let cases = [
            ("", "empty"),
            ("..", "is a path"),
            ("a/b", "is a path"),
            ("a\\b", "is a path"),
            ("my shop", "`Cargo package name"),
            ("1shop", "must start with a letter"),
            ("-shop", "must start with a letter"),
            ("fn", "Rust keyword"),
            ("async", "Rust keyword"),
            ("std", "reserved"),
            ("test", "reserved"),
            ("core", "reserved"),
            ("proc-macro", "reserved"),
            ("ünï", "not a valid Cargo package name"),
            (
                "a-name-that-is-longer-than-forty-characters",
                "gpkit takes names of up to 40",
            ),
        ];
        for (name, expected) in cases {
            let err = PackageName::parse(name).unwrap_err().to_string();
            let expected = expected.trim_start_matches('`');
            assert!(err.contains(expected), "{name:?}: {err}");
            assert!(err.contains("help:"), "{name:?} has no help line: {err}");
        }
    }

    #[test]
    fn converts_between_cases() {
        for raw in [
            "OrderPlaced",
            "order_placed",
            "orderPlaced",
            "order-placed",
            "ORDER_PLACED",
        ] {
            assert_eq!(snake_case(raw), "order_placed", "{raw}");
            assert_eq!(pascal_case(raw), "OrderPlaced", "{raw}");
            assert_eq!(lower_camel_case(raw), "orderPlaced", "{raw}");
        }
        assert_eq!(snake_case("HTTPRequestSent"), "http_request_sent");
        assert_eq!(lower_camel_case("user2FAEnabled"), "user2FaEnabled");
    }
}
