//! Schedules as `gpkit add schedule` takes them: the schedule's name, its
//! timing spec (`--cron`) and its time zone (`--tz`), validated with the
//! crates the generated scheduler uses (`croner` for cron specs,
//! `humantime` for `@every` durations, `chrono-tz` for zones), so a spec
//! gpkit accepts is a spec the worker runs.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;
use std::time::Duration;

use anyhow::{Result, bail};
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use serde::{Deserialize, Serialize};

use crate::domain::names::{self, is_rust_keyword};

/// A schedule as `gpkit add schedule` recorded it in the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleRecord {
    /// The schedule's name, snake_case: its module and its job's task type.
    pub(crate) name: String,
    /// The timing spec as given (`0 2 * * *`, `@hourly`, `@every 30s`).
    pub(crate) cron: String,
    /// The wire name of the event it dispatches; `None` for a job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) event: Option<String>,
    /// The IANA time zone the spec is read in; `None` for UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) tz: Option<String>,
    /// How many missed ticks a new leader enqueues (0: missed ticks are skipped).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) catch_up: u32,
}

fn is_zero(value: &u32) -> bool {
    *value == 0
}

/// The nicknames a spec may be, and what they mean.
const NICKNAMES: &[&str] = &[
    "@yearly",
    "@annually",
    "@monthly",
    "@weekly",
    "@daily",
    "@hourly",
];

/// The fields of a cron spec with seconds, in order, and what each takes.
const FIELDS: [(&str, &str); 6] = [
    ("second", "0-59"),
    ("minute", "0-59"),
    ("hour", "0-23"),
    ("day-of-month", "1-31, L or W"),
    ("month", "1-12 or JAN-DEC"),
    ("day-of-week", "0-7 (0 and 7 are Sunday) or SUN-SAT, # or L"),
];

/// A timing spec that parsed: a cron spec (5 fields, or 6 with seconds
/// first), a nickname (`@hourly` ...), or `@every <duration>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ScheduleSpec {
    text: String,
}

impl ScheduleSpec {
    /// The spec as given, trimmed.
    pub(crate) fn as_str(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for ScheduleSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Why a spec was refused: what is wrong, where in the spec (shown with a
/// caret line under it), and the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SpecError {
    spec: String,
    span: Range<usize>,
    message: String,
    help: String,
}

impl SpecError {
    fn new(spec: &str, span: Range<usize>, message: String, help: &str) -> Self {
        Self {
            spec: spec.to_string(),
            span,
            message,
            help: help.to_string(),
        }
    }
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let before = self.spec[..self.span.start].chars().count();
        let width = self.spec[self.span.clone()].chars().count().max(1);
        write!(
            f,
            "{}\n    {}\n    {}{}\nhelp: {}",
            self.message,
            self.spec,
            " ".repeat(before),
            "^".repeat(width),
            self.help
        )
    }
}

impl std::error::Error for SpecError {}

const CRON_HELP: &str = "a spec is 5 fields `minute hour day-of-month month day-of-week` \
     (6 with a seconds field first), such as `0 2 * * *`; or @hourly, @daily, @weekly, \
     @monthly; or `@every <duration>`, such as `@every 30s`";

/// The parser the generated scheduler uses too: an optional seconds field,
/// no year field.
pub(crate) fn cron_parser() -> CronParser {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build()
}

impl FromStr for ScheduleSpec {
    type Err = SpecError;

    fn from_str(raw: &str) -> Result<Self, SpecError> {
        let text = raw.trim();
        if text.is_empty() {
            return Err(SpecError::new(
                raw,
                0..raw.len(),
                "the spec is empty".into(),
                CRON_HELP,
            ));
        }
        if let Some(rest) = text
            .strip_prefix("@every")
            .filter(|rest| rest.is_empty() || rest.starts_with(char::is_whitespace))
        {
            parse_every(text, rest)?;
            return Ok(Self {
                text: text.to_string(),
            });
        }
        if text.starts_with('@') {
            if NICKNAMES.contains(&text) {
                return Ok(Self {
                    text: text.to_string(),
                });
            }
            return Err(SpecError::new(
                text,
                0..text.len(),
                format!("`{text}` is not a spec nickname gpkit knows"),
                &format!(
                    "use one of {}, or `@every <duration>`",
                    NICKNAMES.join(", ")
                ),
            ));
        }
        parse_cron(text)?;
        Ok(Self {
            text: text.to_string(),
        })
    }
}

/// `@every <duration>`: whole seconds, at least one.
fn parse_every(text: &str, rest: &str) -> Result<Duration, SpecError> {
    let help = "write a duration of whole seconds, such as `@every 30s`, `@every 5m` or \
                `@every 1h30m`";
    let duration_text = rest.trim();
    let start = text.len() - rest.trim_start().len();
    let span = if duration_text.is_empty() {
        text.len()..text.len()
    } else {
        start..start + duration_text.len()
    };
    if duration_text.is_empty() {
        return Err(SpecError::new(
            text,
            span,
            "`@every` needs a duration after it".into(),
            help,
        ));
    }
    let duration = humantime::parse_duration(duration_text).map_err(|err| {
        SpecError::new(
            text,
            span.clone(),
            format!("`{duration_text}` is not a duration: {err}"),
            help,
        )
    })?;
    if duration < Duration::from_secs(1) || duration.subsec_nanos() != 0 {
        return Err(SpecError::new(
            text,
            span,
            format!("`{duration_text}` is not a whole number of seconds, at least one"),
            help,
        ));
    }
    Ok(duration)
}

/// A cron spec: 5 or 6 fields that croner accepts, and that match some time.
fn parse_cron(text: &str) -> Result<Cron, SpecError> {
    let fields = field_spans(text);
    if fields.len() < 5 {
        return Err(SpecError::new(
            text,
            text.len()..text.len(),
            format!(
                "the spec has {} field{}, and a cron spec has 5 or 6",
                fields.len(),
                if fields.len() == 1 { "" } else { "s" }
            ),
            CRON_HELP,
        ));
    }
    if fields.len() > 6 {
        let extra = fields[6].start..text.len();
        return Err(SpecError::new(
            text,
            extra,
            format!(
                "the spec has {} fields, and a cron spec has 5 or 6 (gpkit takes no year field)",
                fields.len()
            ),
            CRON_HELP,
        ));
    }
    let parser = cron_parser();
    let cron = match parser.parse(text) {
        Ok(cron) => cron,
        Err(whole) => {
            // Find the field at fault: parse each alone, with `*` elsewhere.
            let offset = 6 - fields.len();
            for (index, span) in fields.iter().enumerate() {
                let field = &text[span.clone()];
                let mut alone = ["0", "*", "*", "*", "*", "*"];
                alone[index + offset] = field;
                if let Err(err) = parser.parse(&alone.join(" ")) {
                    let (name, takes) = FIELDS[index + offset];
                    return Err(SpecError::new(
                        text,
                        span.clone(),
                        format!(
                            "the {name} field `{field}` is not valid ({}); it takes {takes}, \
                             with `*`, `,`, `-` and `/`",
                            croner_message(&err)
                        ),
                        CRON_HELP,
                    ));
                }
            }
            return Err(SpecError::new(
                text,
                0..text.len(),
                format!("the spec is not valid: {}", croner_message(&whole)),
                CRON_HELP,
            ));
        }
    };
    if cron
        .find_next_occurrence(&chrono::Utc::now(), false)
        .is_err()
    {
        return Err(SpecError::new(
            text,
            0..text.len(),
            "the spec never matches a date (such as the 30th of February)".into(),
            CRON_HELP,
        ));
    }
    Ok(cron)
}

/// croner's message, without its type prefix.
fn croner_message(err: &croner::errors::CronError) -> String {
    let text = err.to_string().replace("CronPattern ", "the field ");
    let text = text
        .split_once(": ")
        .map_or(text.as_str(), |(_, rest)| rest)
        .trim_end_matches('.');
    let mut chars = text.chars();
    chars
        .next()
        .map(|first| first.to_lowercase().chain(chars).collect())
        .unwrap_or_default()
}

/// The byte range of each whitespace-separated field of `text`.
fn field_spans(text: &str) -> Vec<Range<usize>> {
    let mut spans = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        match (c.is_whitespace(), start) {
            (true, Some(s)) => {
                spans.push(s..i);
                start = None;
            }
            (false, None) => start = Some(i),
            _ => {}
        }
    }
    if let Some(s) = start {
        spans.push(s..text.len());
    }
    spans
}

/// Checks `--tz`: an IANA zone name such as `Europe/Paris`.
pub(crate) fn parse_zone(raw: &str) -> Result<chrono_tz::Tz> {
    if let Ok(zone) = raw.parse::<chrono_tz::Tz>() {
        return Ok(zone);
    }
    let suggestion = chrono_tz::TZ_VARIANTS
        .iter()
        .map(|zone| zone.name())
        .find(|name| {
            name.eq_ignore_ascii_case(raw)
                || name
                    .rsplit('/')
                    .next()
                    .is_some_and(|city| city.eq_ignore_ascii_case(raw))
        })
        .map(|name| format!(", such as `{name}`"))
        .unwrap_or_else(|| ", such as `Europe/Paris`, `America/New_York` or `UTC`".into());
    bail!(
        "`{raw}` is not a time zone of the IANA database\n\
         help: give a zone name as `Area/City`{suggestion}"
    )
}

/// Checks a schedule's name: snake_case, not a Rust keyword.
pub(crate) fn check_name(raw: &str) -> Result<()> {
    let valid = raw.starts_with(|c: char| c.is_ascii_lowercase())
        && raw
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !valid {
        let suggestion = names::snake_case(raw);
        let suggestion = suggestion.trim_start_matches(|c: char| !c.is_ascii_lowercase());
        bail!(
            "`{raw}` is not a valid schedule name: use snake_case (lowercase letters, digits \
             and `_`, starting with a letter)\nhelp: for example `{}`",
            if suggestion.is_empty() {
                "nightly_report"
            } else {
                suggestion
            }
        );
    }
    if is_rust_keyword(raw) || ["mod", "self", "super", "crate"].contains(&raw) {
        bail!(
            "`{raw}` is a Rust keyword and cannot name a schedule module\n\
             help: pick another name, such as `{raw}_schedule`"
        );
    }
    Ok(())
}

/// What the templates print for one schedule.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ScheduleView {
    pub(crate) name: String,
    pub(crate) cron: String,
    /// The time zone, `UTC` when none was given.
    pub(crate) tz: String,
    pub(crate) catch_up: u32,
    /// The event it dispatches (its names and fields), for an event schedule.
    pub(crate) event: Option<crate::domain::events::EventView>,
}

impl ScheduleView {
    /// The view of `record`, whose event (if any) is one of `events`. The
    /// record may come from an untrusted `gpkit.toml`: its spec and zone
    /// are checked again, as they are printed into Rust string literals.
    pub(crate) fn new(
        record: &ScheduleRecord,
        events: &[crate::domain::events::EventView],
    ) -> Result<Self> {
        check_name(&record.name)?;
        let spec: ScheduleSpec = record.cron.parse().map_err(|err: SpecError| {
            anyhow::anyhow!("schedule `{}` in gpkit.toml: {err}", record.name)
        })?;
        if spec.as_str() != record.cron
            || !record
                .cron
                .chars()
                .all(|c| c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ')
        {
            bail!(
                "schedule `{}` in gpkit.toml has the spec {:?}, which gpkit would not write\n\
                 help: give it a spec as `gpkit add schedule` takes it, such as `0 2 * * *`",
                record.name,
                record.cron
            );
        }
        if let Some(zone) = &record.tz {
            parse_zone(zone)?;
        }
        let event = match &record.event {
            None => None,
            Some(wire) => Some(
                events
                    .iter()
                    .find(|e| &e.names.wire == wire)
                    .cloned()
                    .ok_or_else(|| {
                        anyhow::anyhow!(
                            "schedule `{}` dispatches `{wire}`, which is not an event of \
                             this project",
                            record.name
                        )
                    })?,
            ),
        };
        Ok(Self {
            name: record.name.clone(),
            cron: record.cron.clone(),
            tz: record.tz.clone().unwrap_or_else(|| "UTC".into()),
            catch_up: record.catch_up,
            event,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(spec: &str) -> String {
        spec.parse::<ScheduleSpec>().unwrap_err().to_string()
    }

    #[test]
    fn every_form_the_issue_names_parses() {
        for spec in [
            "0 2 * * *",
            "*/15 * * * *",
            "30 0 2 * * MON-FRI",
            "0 0 1 * *",
            "@hourly",
            "@daily",
            "@weekly",
            "@monthly",
            "@every 1s",
            "@every 1h30m",
        ] {
            let parsed: ScheduleSpec = spec.parse().unwrap_or_else(|err| panic!("{spec}: {err}"));
            assert_eq!(parsed.as_str(), spec);
        }
        assert_eq!(
            parse_every("@every 90s", " 90s").unwrap(),
            Duration::from_secs(90)
        );
    }

    /// The refusals, with their carets, against `snapshots/schedule-spec-errors.txt`
    /// (rewritten with `GPKIT_UPDATE_SNAPSHOTS=1`).
    #[test]
    fn refusals_show_where_the_spec_is_wrong() {
        let specs = [
            "",
            "0 2 * *",
            "0 2 32 * *",
            "61 2 * * *",
            "0 0 2 * * * 2030",
            "0 2 * * MON-XYZ",
            "0 0 30 2 *",
            "@nightly",
            "@every",
            "@every soon",
            "@every 500ms",
            "@everyday",
        ];
        let mut text = String::new();
        for spec in specs {
            text.push_str(&format!("--cron {spec:?}\n{}\n\n", refused(spec)));
        }
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("snapshots/schedule-spec-errors.txt");
        if std::env::var_os("GPKIT_UPDATE_SNAPSHOTS").is_some() {
            // Never under CI, where a rewritten snapshot would pass anything.
            assert!(
                !std::env::var("CI").is_ok_and(|ci| ci == "true"),
                "GPKIT_UPDATE_SNAPSHOTS is set under CI=true; unset it"
            );
            std::fs::write(&path, &text).unwrap();
        }
        let expected = std::fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(
            text, expected,
            "spec errors differ from the snapshot (review, then rerun with GPKIT_UPDATE_SNAPSHOTS=1)"
        );
    }

    #[test]
    fn a_field_error_points_at_the_field() {
        let err = refused("0 2 32 * *");
        assert!(err.contains("day-of-month field `32`"), "{err}");
        assert!(err.contains("\n        ^^\n"), "{err}");
    }

    #[test]
    fn zones_are_iana_names() {
        assert_eq!(
            parse_zone("Europe/Paris").unwrap(),
            chrono_tz::Tz::Europe__Paris
        );
        let err = parse_zone("paris").unwrap_err().to_string();
        assert!(err.contains("such as `Europe/Paris`"), "{err}");
        assert!(parse_zone("Mars/Olympus").is_err());
    }

    /// A `gpkit.toml` from elsewhere cannot put code into the schedule's
    /// string constants.
    #[test]
    fn recorded_specs_and_zones_are_checked_again() {
        let record = |cron: &str, tz: Option<&str>| ScheduleRecord {
            name: "beat".into(),
            cron: cron.into(),
            event: None,
            tz: tz.map(str::to_string),
            catch_up: 0,
        };
        assert!(ScheduleView::new(&record("@every 1s", Some("Europe/Paris")), &[]).is_ok());
        for (cron, tz) in [
            ("\"; fn evil() {} //", None),
            ("@daily\"", None),
            (" @daily", None),
            ("@daily", Some("Europe/Paris\"; //")),
        ] {
            assert!(
                ScheduleView::new(&record(cron, tz), &[]).is_err(),
                "{cron:?} {tz:?}"
            );
        }
    }

    #[test]
    fn names_are_snake_case_identifiers() {
        assert!(check_name("nightly_report").is_ok());
        for bad in ["NightlyReport", "1st", "fn", "a-b", ""] {
            let err = check_name(bad).unwrap_err().to_string();
            assert!(err.contains("help:"), "{bad}: {err}");
        }
    }
}
