//! Events as `gpkit add event` takes them: names in any spelling, fields
//! with gpkit's types, listener names; all validated before anything is
//! planned, and turned into what the templates print.

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

use std::collections::BTreeMap;

use crate::domain::listener_options::{ListenerRun, wrap};
use crate::domain::names::{self, is_rust_keyword};

/// An event as `gpkit add event` recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventSpec {
    /// The wire name, lowerCamelCase (`orderPlaced`).
    pub(crate) name: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) fields: Vec<FieldSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) listeners: Vec<String>,
    /// The field whose value keys the event's order (`Event::order_key`),
    /// from `--ordered-by`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) ordered_by: Option<String>,
    /// How its listeners run where flags said (ordered, limits), by listener.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) listener_options: BTreeMap<String, ListenerRun>,
}

/// The field types that can key an event's order: a value that is always
/// there and compares exactly.
const KEY_TYPES: &[&str] = &["string", "i32", "i64", "uuid"];

/// Checks that `field` (from `--ordered-by`) is one of `fields` and can key
/// an order.
pub(crate) fn check_ordered_by(field: &str, fields: &[FieldSpec]) -> Result<()> {
    let Some(spec) = fields.iter().find(|f| f.name == field) else {
        let names: Vec<&str> = fields.iter().map(|f| f.name.as_str()).collect();
        bail!(
            "`--ordered-by {field}` names no field of the event (its fields: {})\n\
             help: order by one of its fields, or add it with `--field {field}:i64`",
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        );
    };
    if !KEY_TYPES.contains(&spec.ty.as_str()) {
        bail!(
            "`--ordered-by {field}`: a field of type `{}` cannot key an order\n\
             help: order by a field of type {}",
            spec.ty,
            KEY_TYPES.join(", ")
        );
    }
    Ok(())
}

/// One field of an event: its name and its gpkit type (`i64`, `Option<uuid>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldSpec {
    pub(crate) name: String,
    #[serde(rename = "type")]
    pub(crate) ty: String,
}

/// The field types an event may have, and their Rust types.
const SCALARS: &[(&str, &str)] = &[
    ("string", "String"),
    ("bool", "bool"),
    ("i32", "i32"),
    ("i64", "i64"),
    ("f64", "f64"),
    ("uuid", "uuid::Uuid"),
    ("datetime", "chrono::DateTime<chrono::Utc>"),
    ("json", "serde_json::Value"),
];

fn allowed_types() -> String {
    let scalars: Vec<&str> = SCALARS.iter().map(|(t, _)| *t).collect();
    format!(
        "{}, and Option<...> or Vec<...> of these",
        scalars.join(", ")
    )
}

/// The Rust type of a gpkit field type such as `Option<Vec<uuid>>`.
///
/// The wrappers are peeled off in a loop, not by recursion: the type may
/// come from an untrusted `gpkit.toml`, nested any number of times.
pub fn rust_type(ty: &str) -> Result<String> {
    let mut ty = ty.trim();
    let mut wrappers = Vec::new();
    while let Some((rust, inner)) = [("Option<", "Option"), ("Vec<", "Vec")]
        .into_iter()
        .find_map(|(wrapper, rust)| {
            let inner = ty.strip_prefix(wrapper)?.strip_suffix('>')?;
            Some((rust, inner))
        })
    {
        wrappers.push(rust);
        ty = inner.trim();
    }
    let Some((_, scalar)) = SCALARS.iter().find(|(name, _)| *name == ty) else {
        bail!(
            "`{ty}` is not a field type gpkit knows\nhelp: use one of {}",
            allowed_types()
        );
    };
    let mut rust = String::new();
    for wrapper in &wrappers {
        rust.push_str(wrapper);
        rust.push('<');
    }
    rust.push_str(scalar);
    rust.push_str(&">".repeat(wrappers.len()));
    Ok(rust)
}

/// A `snake_case` Rust identifier that is not a keyword, for fields and
/// listeners.
fn check_identifier(raw: &str, what: &str) -> Result<()> {
    let valid = raw.starts_with(|c: char| c.is_ascii_lowercase())
        && raw
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !valid {
        bail!(
            "`{raw}` is not a valid {what} name: use snake_case (lowercase letters, digits and `_`, \
             starting with a letter)\nhelp: for example `{}`",
            names::snake_case(raw).trim_start_matches(|c: char| !c.is_ascii_lowercase())
        );
    }
    if is_rust_keyword(raw) {
        bail!(
            "`{raw}` is a Rust keyword and cannot name a {what}\nhelp: pick another name, such as `{raw}_value`"
        );
    }
    Ok(())
}

/// Parses `--field name:type`.
pub fn parse_field(raw: &str) -> Result<FieldSpec> {
    let Some((name, ty)) = raw.split_once(':') else {
        bail!("`--field {raw}` has no type\nhelp: write it as name:type, such as `order_id:uuid`");
    };
    let name = name.trim();
    check_identifier(name, "field")?;
    rust_type(ty).map_err(|err| anyhow::anyhow!("field `{name}`: {err:#}"))?;
    Ok(FieldSpec {
        name: name.to_string(),
        ty: ty.trim().to_string(),
    })
}

/// Checks a listener name.
pub fn check_listener(raw: &str) -> Result<()> {
    check_identifier(raw, "listener")
}

/// An event name in its three spellings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EventNames {
    /// `orderPlaced`, the wire name shared with Go services.
    pub wire: String,
    /// `OrderPlaced`, the Rust type.
    pub type_name: String,
    /// `order_placed`, the module.
    pub module: String,
}

impl EventNames {
    /// Any spelling (`OrderPlaced`, `order_placed`, `orderPlaced`) of a new
    /// event's name. Its three spellings must convert into one another, so
    /// that the wire name the manifest records gives back the same module and
    /// type: `a_b_c` is refused, as its camelCase `aBC` reads back as `a_bc`.
    pub fn parse(raw: &str) -> Result<Self> {
        let names = Self::recorded(raw)?;
        if let Some(problem) = names.disagreement() {
            let suggestion = names::snake_case(&names.type_name);
            let example = match Self::recorded(&suggestion) {
                Ok(other) if other.disagreement().is_none() => format!(", such as `{suggestion}`"),
                _ => String::new(),
            };
            bail!(
                "`{raw}` cannot be spelled the same way in every case: {problem}\n\
                 help: join one-letter words, and words that start with a digit, to the word \
                 before{example}"
            );
        }
        Ok(names)
    }

    /// The names of an event the manifest records, by its wire name. Only
    /// the checks that make a module name: events recorded before gpkit
    /// refused ambiguous names keep working.
    pub fn recorded(raw: &str) -> Result<Self> {
        let help =
            "help: name the event for what happened, such as `orderPlaced` or `user_signed_up`";
        if raw.is_empty() {
            bail!("the event name is empty\n{help}");
        }
        if let Some(bad) = raw
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
        {
            bail!(
                "`{raw}` is not a valid event name: `{bad}` is not allowed (only ASCII letters, digits, `_` and `-`)\n{help}"
            );
        }
        let module = names::snake_case(raw);
        if !module.starts_with(|c: char| c.is_ascii_lowercase()) {
            bail!("`{raw}` is not a valid event name: it must start with a letter\n{help}");
        }
        if is_rust_keyword(&module) || ["mod", "self", "super", "crate"].contains(&module.as_str())
        {
            bail!("`{raw}` is a Rust keyword and cannot name an event module\n{help}");
        }
        Ok(Self {
            wire: names::lower_camel_case(raw),
            type_name: names::pascal_case(raw),
            module,
        })
    }

    /// Which spelling reads back as another module, if one does.
    fn disagreement(&self) -> Option<String> {
        [&self.wire, &self.type_name].into_iter().find_map(|form| {
            let module = names::snake_case(form);
            (module != self.module).then(|| {
                format!(
                    "as `{form}` it reads back as `{module}`, not `{}`",
                    self.module
                )
            })
        })
    }
}

/// What the templates print for one event.
#[derive(Debug, Clone, Serialize)]
pub struct EventView {
    #[serde(flatten)]
    pub(crate) names: EventNames,
    pub(crate) fields: Vec<FieldView>,
    pub(crate) listeners: Vec<String>,
    /// Whether the struct can derive `Eq` (no `f64` or `json` inside).
    pub(crate) eq: bool,
    /// The field that keys its order, if any.
    pub(crate) ordered_by: Option<String>,
    /// How its listeners with options run, by listener.
    pub(crate) options: BTreeMap<String, OptionsView>,
}

/// A listener's `options()`, as the templates print it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct OptionsView {
    /// The doc comment's lines, after `/// `.
    pub(crate) doc: Vec<String>,
    /// The body's lines, indented as rustfmt leaves them.
    pub(crate) body: Vec<String>,
    /// Whether the body names `Duration` (its module imports it).
    pub(crate) duration: bool,
}

impl OptionsView {
    fn new(run: &ListenerRun, ordered_by: Option<&str>) -> Self {
        let mut summary = format!("How the worker runs it: {}.", run.summary(ordered_by));
        match (run.has_limits(), run.has_retry_policy()) {
            (true, true) => summary.push_str(
                " `WORKER_LIMITS` overrides its limits, and `WORKER_RETRIES` its retries, at \
                 deploy time.",
            ),
            (true, false) => {
                summary.push_str(" `WORKER_LIMITS` overrides its limits at deploy time.");
            }
            (false, true) => {
                summary.push_str(" `WORKER_RETRIES` overrides its retries at deploy time.");
            }
            (false, false) => {}
        }
        Self {
            doc: wrap(&summary, 76),
            body: run.body(),
            duration: run.uses_duration(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct FieldView {
    pub(crate) name: String,
    pub(crate) rust_type: String,
}

impl EventView {
    pub fn new(spec: &EventSpec) -> Result<Self> {
        let names = EventNames::recorded(&spec.name)?;
        let fields = spec
            .fields
            .iter()
            .map(|f| {
                Ok(FieldView {
                    name: f.name.clone(),
                    rust_type: rust_type(&f.ty)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let eq = !fields
            .iter()
            .any(|f| f.rust_type.contains("f64") || f.rust_type.contains("serde_json::Value"));
        Ok(Self {
            names,
            fields,
            listeners: spec.listeners.clone(),
            eq,
            ordered_by: spec.ordered_by.clone(),
            options: spec
                .listener_options
                .iter()
                .map(|(listener, run)| {
                    (
                        listener.clone(),
                        OptionsView::new(run, spec.ordered_by.as_deref()),
                    )
                })
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_order_is_keyed_by_a_field_that_is_always_there_and_compares_exactly() {
        let fields: Vec<FieldSpec> = ["order_id:i64", "note:Option<string>", "total:f64"]
            .iter()
            .map(|f| parse_field(f).unwrap())
            .collect();
        assert!(check_ordered_by("order_id", &fields).is_ok());
        let missing = check_ordered_by("customer", &fields)
            .unwrap_err()
            .to_string();
        assert!(
            missing.contains("names no field of the event (its fields: order_id, note, total)"),
            "{missing}"
        );
        for field in ["note", "total"] {
            let wrong = check_ordered_by(field, &fields).unwrap_err().to_string();
            assert!(wrong.contains("cannot key an order"), "{wrong}");
            assert!(wrong.contains("string, i32, i64, uuid"), "{wrong}");
        }
    }

    #[test]
    fn any_spelling_gives_the_same_three_names() {
        for raw in ["OrderPlaced", "order_placed", "orderPlaced", "order-placed"] {
            let names = EventNames::parse(raw).unwrap();
            assert_eq!(names.wire, "orderPlaced");
            assert_eq!(names.type_name, "OrderPlaced");
            assert_eq!(names.module, "order_placed");
        }
    }

    #[test]
    fn bad_event_names_are_explained() {
        for (raw, message) in [
            ("", "empty"),
            ("order placed", "not allowed"),
            ("1st", "start with a letter"),
            ("Match", "keyword"),
        ] {
            let err = EventNames::parse(raw).unwrap_err().to_string();
            assert!(
                err.contains(message) && err.contains("help:"),
                "{raw:?}: {err}"
            );
        }
    }

    /// Found by fuzzing (`fuzz/fuzz_targets/names.rs`): the manifest records
    /// the wire name, and these names' wire names read back as other
    /// modules (`a_b_c` was generated as `src/events/a_bc.rs`, and a second
    /// `add event a_b_c --listener x` added the event twice).
    #[test]
    fn names_whose_spellings_disagree_are_refused() {
        for (raw, problem, example) in [
            (
                "a_b_c",
                "as `aBC` it reads back as `a_bc`, not `a_b_c`",
                ", such as `abc`",
            ),
            (
                "t-t-isisme-a-rofattnyn-",
                "as `TTIsismeARofattnyn` it reads back as `tt_isisme_a_rofattnyn`",
                ", such as `tt_isisme_a_rofattnyn`",
            ),
            (
                "order_2nd",
                "as `order2nd` it reads back as `order2nd`",
                "`order2nd`",
            ),
        ] {
            let err = EventNames::parse(raw).unwrap_err().to_string();
            assert!(
                err.contains("cannot be spelled the same way in every case")
                    && err.contains(problem)
                    && err.contains(example)
                    && err.contains("help:"),
                "{raw:?}: {err}"
            );
        }
        assert_eq!(
            EventNames::parse("a_b_c").unwrap_err().to_string(),
            "`a_b_c` cannot be spelled the same way in every case: as `aBC` it reads back as \
             `a_bc`, not `a_b_c`\nhelp: join one-letter words, and words that start with a digit, \
             to the word before, such as `abc`"
        );
        for raw in [
            "order2nd_placed",
            "http_request_sent",
            "user2FAEnabled",
            "a1",
        ] {
            let names = EventNames::parse(raw).unwrap();
            for form in [&names.wire, &names.type_name, &names.module] {
                assert_eq!(
                    EventNames::parse(form).unwrap(),
                    names,
                    "{raw:?} as {form:?}"
                );
            }
        }
    }

    #[test]
    fn recorded_names_of_older_projects_still_read() {
        let names = EventNames::recorded("aBC").unwrap();
        assert_eq!(
            (names.module.as_str(), names.type_name.as_str()),
            ("a_bc", "ABc")
        );
        assert!(EventNames::recorded("tTIsisme").is_ok());
        assert!(EventNames::recorded("").is_err());
        assert!(EventNames::recorded("fn").is_err());
    }

    #[test]
    fn field_types_map_to_rust() {
        assert_eq!(rust_type("uuid").unwrap(), "uuid::Uuid");
        assert_eq!(
            rust_type("Option<Vec<datetime>>").unwrap(),
            "Option<Vec<chrono::DateTime<chrono::Utc>>>"
        );
        let err = rust_type("u8").unwrap_err().to_string();
        assert!(
            err.contains("`u8` is not a field type") && err.contains("string, bool, i32"),
            "{err}"
        );
    }

    /// Found by fuzzing (a deep input given to `fuzz/fuzz_targets/names.rs`):
    /// a field type nested 300,000 times, as a crafted `gpkit.toml` may
    /// record, overflowed the stack.
    #[test]
    fn deeply_nested_field_types_do_not_overflow_the_stack() {
        let depth = 300_000;
        let ty = format!("{}i64{}", "Option< ".repeat(depth), " >".repeat(depth));
        assert_eq!(
            rust_type(&ty).unwrap(),
            format!("{}i64{}", "Option<".repeat(depth), ">".repeat(depth))
        );
        let bad = format!("{}u8{}", "Vec<".repeat(depth), ">".repeat(depth));
        let err = rust_type(&bad).unwrap_err().to_string();
        assert!(err.starts_with("`u8` is not a field type"), "{err}");
    }

    #[test]
    fn fields_and_listeners_must_be_snake_case_identifiers() {
        assert_eq!(
            parse_field("order_id:uuid").unwrap(),
            FieldSpec {
                name: "order_id".into(),
                ty: "uuid".into()
            }
        );
        assert!(
            parse_field("order_id")
                .unwrap_err()
                .to_string()
                .contains("has no type")
        );
        assert!(
            parse_field("OrderId:uuid")
                .unwrap_err()
                .to_string()
                .contains("snake_case")
        );
        assert!(
            parse_field("type:string")
                .unwrap_err()
                .to_string()
                .contains("keyword")
        );
        assert!(
            parse_field("total:u8")
                .unwrap_err()
                .to_string()
                .contains("field `total`")
        );
        assert!(check_listener("audit_log").is_ok());
        assert!(check_listener("Audit").is_err());
        assert!(check_listener("fn").is_err());
    }
}
