//! `WORKER_RETRIES`: the override of listeners' retries, timeouts and
//! backoffs at deploy time, as `WORKER_LIMITS` overrides their limits.
//! Entries separated by `;`, each `<event>.<listener>=<settings>`, the
//! settings any of `retries:N`, `timeout:<duration>` and
//! `backoff:asynq|fixed:<duration>|exponential:<base>:<max>`, separated by
//! commas; durations such as `500ms`, `30s`, `10m`, `1h`. What an entry
//! does not name keeps the value the code gives its listener.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use super::retry_policy::{Backoff, RetryPolicy};

/// The environment variable read.
pub(crate) const RETRIES_VAR: &str = "WORKER_RETRIES";
/// The expected form of an entry, for errors.
const ENTRY_FORM: &str = "<event>.<listener>=retries:N,timeout:<duration>,\
     backoff:asynq|fixed:<duration>|exponential:<base>:<max> (any of the three; \
     durations such as 500ms, 30s, 10m, 1h), entries separated by `;`, such as \
     orderPlaced.payment=retries:2,timeout:30s,backoff:fixed:10s;orderPlaced.email=backoff:exponential:1s:5m";

/// What one entry sets; `None` keeps the listener's own.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PolicyOverride {
    pub(crate) retries: Option<u32>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) backoff: Option<Backoff>,
}

impl PolicyOverride {
    /// `policy` with what the entry sets replaced.
    pub(crate) fn apply_to(&self, policy: &mut RetryPolicy) {
        if let Some(retries) = self.retries {
            policy.retries = retries;
        }
        if let Some(timeout) = self.timeout {
            policy.timeout = timeout;
        }
        if let Some(backoff) = self.backoff {
            policy.backoff = backoff;
        }
    }
}

impl FromStr for PolicyOverride {
    type Err = String;

    /// `retries:N`, `timeout:<duration>`, `backoff:<backoff>`, separated by
    /// commas, at least one of them, each at most once.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut settings = Self::default();
        if text.trim().is_empty() {
            return Err("sets nothing".into());
        }
        for setting in text.split(',').map(str::trim) {
            let Some((name, value)) = setting.split_once(':') else {
                return Err(format!(
                    "has `{setting}`, which is no setting: it needs a name and a value, \
                     such as retries:3, timeout:30s or backoff:fixed:10s"
                ));
            };
            let (name, value) = (name.trim(), value.trim());
            let twice = || format!("gives `{name}` twice");
            match name {
                "retries" => {
                    let retries = value.parse::<u32>().map_err(|_| {
                        format!("has `{setting}`: `{value}` is not a whole number of retries")
                    })?;
                    if settings.retries.replace(retries).is_some() {
                        return Err(twice());
                    }
                }
                "timeout" => {
                    let timeout = duration(setting, value)?;
                    if settings.timeout.replace(timeout).is_some() {
                        return Err(twice());
                    }
                }
                "backoff" => {
                    let backoff = backoff(setting, value)?;
                    if settings.backoff.replace(backoff).is_some() {
                        return Err(twice());
                    }
                }
                _ => {
                    return Err(format!(
                        "has `{name}`, which is no setting; the settings are retries, timeout \
                         and backoff"
                    ));
                }
            }
        }
        Ok(settings)
    }
}

/// `asynq`, `fixed:<duration>` or `exponential:<base>:<max>`.
fn backoff(setting: &str, value: &str) -> Result<Backoff, String> {
    let mut parts = value.split(':').map(str::trim);
    let backoff = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some("asynq"), None, None, None) => Backoff::asynq(),
        (Some("fixed"), Some(delay), None, None) => Backoff::fixed(duration(setting, delay)?),
        (Some("exponential"), Some(base), Some(max), None) => {
            let (base, max) = (duration(setting, base)?, duration(setting, max)?);
            if base > max {
                return Err(format!("has `{setting}`: the base is longer than the most"));
            }
            Backoff::exponential(base, max)
        }
        _ => {
            return Err(format!(
                "has `{setting}`, which is no backoff; the backoffs are asynq, \
                 fixed:<duration> and exponential:<base>:<max>"
            ));
        }
    };
    Ok(backoff)
}

/// A duration longer than zero: `500ms`, `30s`, `10m`, `1h`.
fn duration(setting: &str, value: &str) -> Result<Duration, String> {
    match humantime::parse_duration(value) {
        Ok(duration) if !duration.is_zero() => Ok(duration),
        Ok(_) => Err(format!("has `{setting}`: `{value}` is no longer than zero")),
        Err(_) => Err(format!(
            "has `{setting}`: `{value}` is not a duration (such as 500ms, 30s, 10m, 1h)"
        )),
    }
}

/// A `WORKER_RETRIES` entry that does not read: which, why, and the form
/// expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{RETRIES_VAR}: the entry `{entry}` {problem}; expected {ENTRY_FORM}")]
pub(crate) struct RetriesError {
    /// The entry as written.
    pub(crate) entry: String,
    /// What is wrong with it.
    pub(crate) problem: String,
}

/// The overrides by (event, listener).
pub(crate) type RetryOverrides = BTreeMap<(String, String), PolicyOverride>;

/// Reads `WORKER_RETRIES`' text (module docs). Blank entries are ignored;
/// a listener named twice is an error.
pub(crate) fn parse_overrides(text: &str) -> Result<RetryOverrides, RetriesError> {
    let mut overrides = RetryOverrides::new();
    for entry in text.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let error = |problem: String| RetriesError {
            entry: entry.to_string(),
            problem,
        };
        let Some((name, settings)) = entry.split_once('=') else {
            return Err(error(
                "has no `=` between the listener and its settings".into(),
            ));
        };
        let name = name.trim();
        let Some((event, listener)) = name
            .rsplit_once('.')
            .filter(|(event, listener)| !event.trim().is_empty() && !listener.trim().is_empty())
        else {
            return Err(error(format!(
                "does not name a listener as <event>.<listener>: `{name}`"
            )));
        };
        let settings: PolicyOverride = settings.parse().map_err(error)?;
        let key = (event.trim().to_string(), listener.trim().to_string());
        if overrides.insert(key, settings).is_some() {
            return Err(error(format!("names `{name}` again")));
        }
    }
    Ok(overrides)
}

/// [`parse_overrides`] of `WORKER_RETRIES`; none when it is unset.
pub(crate) fn overrides_from_env() -> Result<RetryOverrides, RetriesError> {
    match std::env::var(RETRIES_VAR) {
        Ok(text) => parse_overrides(&text),
        Err(_) => Ok(RetryOverrides::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(event: &str, listener: &str) -> (String, String) {
        (event.to_string(), listener.to_string())
    }

    fn applied(text: &str) -> String {
        let mut policy = RetryPolicy::default();
        let overrides = parse_overrides(text).unwrap();
        overrides[&key("orderPlaced", "payment")].apply_to(&mut policy);
        policy.to_string()
    }

    #[test]
    fn entries_set_what_they_name_and_keep_the_rest() {
        assert_eq!(
            applied("orderPlaced.payment=retries:2,timeout:30s,backoff:fixed:10s"),
            "retries:2,timeout:30s,backoff:fixed:10s"
        );
        assert_eq!(
            applied(" orderPlaced.payment = timeout:500ms "),
            "retries:25,timeout:500ms,backoff:asynq"
        );
        assert_eq!(
            applied("orderPlaced.payment=backoff:exponential:1s:5m;orderPlaced.email=retries:0;"),
            "retries:25,timeout:30m,backoff:exponential:1s:5m"
        );
        assert_eq!(
            applied("orderPlaced.payment=retries:0,backoff:asynq,timeout:1h"),
            "retries:0,timeout:1h,backoff:asynq"
        );
        assert!(parse_overrides("  ; ").unwrap().is_empty());
    }

    #[test]
    fn a_policy_writes_the_form_its_entry_reads() {
        for text in [
            "retries:3,timeout:10m,backoff:exponential:500ms:2m",
            "retries:0,timeout:1s,backoff:fixed:90s",
            "retries:25,timeout:30m,backoff:asynq",
        ] {
            assert_eq!(applied(&format!("orderPlaced.payment={text}")), text);
        }
    }

    #[test]
    fn a_wrong_entry_is_named_with_what_is_wrong_and_the_form_expected() {
        for (text, problem) in [
            ("orderPlaced.payment", "has no `=`"),
            ("payment=retries:2", "does not name a listener"),
            ("orderPlaced.payment=", "sets nothing"),
            (
                "orderPlaced.payment=retries",
                "`retries`, which is no setting",
            ),
            (
                "orderPlaced.payment=retries:-1",
                "`-1` is not a whole number",
            ),
            (
                "orderPlaced.payment=timeout:soon",
                "`soon` is not a duration",
            ),
            ("orderPlaced.payment=timeout:0s", "no longer than zero"),
            ("orderPlaced.payment=backoff:linear", "which is no backoff"),
            ("orderPlaced.payment=backoff:fixed", "which is no backoff"),
            (
                "orderPlaced.payment=backoff:exponential:1m:1s",
                "base is longer",
            ),
            (
                "orderPlaced.payment=tries:2",
                "`tries`, which is no setting",
            ),
            (
                "orderPlaced.payment=retries:1,retries:2",
                "gives `retries` twice",
            ),
            ("a.b=retries:1;a.b=retries:2", "names `a.b` again"),
        ] {
            let error = parse_overrides(text).unwrap_err().to_string();
            assert!(
                error.starts_with("WORKER_RETRIES: the entry `")
                    && error.contains(problem)
                    && error.contains("expected <event>.<listener>=retries:N"),
                "{text}: {error}"
            );
        }
    }
}
