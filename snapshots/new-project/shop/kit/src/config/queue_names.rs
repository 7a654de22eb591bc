//! Queue names: the rule every queue name follows, and [`QueueNames`], a
//! list of them such as `OUTBOX_QUEUES=shop,billing`.
//!
//! A name is what Go asynq accepts and this module can store safely: not
//! empty, no surrounding spaces, and none of `{`, `}` (the keys' hash tag),
//! `,` or `=` (the separators of the settings that list queues).

use std::fmt;
use std::str::FromStr;

/// Go asynq's default queue, where a task goes when none is named.
pub(crate) const DEFAULT_QUEUE: &str = "default";

/// Checks one queue name.
pub(crate) fn check_queue_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.contains(['{', '}', ',', '=']) || name.trim() != name {
        return Err(format!(
            "`{name}` is not a valid queue name (it must be non-empty, without spaces around \
             it, and without `{{`, `}}`, `,` or `=`)"
        ));
    }
    Ok(())
}

/// One or more distinct queue names, in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueNames(Vec<String>);

impl QueueNames {
    /// The names, in the order given.
    pub fn names(&self) -> &[String] {
        &self.0
    }
}

impl Default for QueueNames {
    /// `default`: Go asynq's default queue alone.
    fn default() -> Self {
        Self(vec![DEFAULT_QUEUE.to_string()])
    }
}

impl FromStr for QueueNames {
    type Err = String;

    /// `shop,billing`: comma-separated names.
    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let mut names: Vec<String> = Vec::new();
        for name in spec.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            check_queue_name(name)?;
            if names.iter().any(|seen| seen == name) {
                return Err(format!("queue `{name}` is listed twice"));
            }
            names.push(name.to_string());
        }
        if names.is_empty() {
            return Err("no queue given; expected names such as default or shop,billing".into());
        }
        Ok(Self(names))
    }
}

impl fmt::Display for QueueNames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_list_of_names() {
        let names: QueueNames = " shop , billing".parse().unwrap();
        assert_eq!(names.names(), ["shop", "billing"]);
        assert_eq!(names.to_string(), "shop,billing");
        assert_eq!(QueueNames::default().to_string(), "default");
    }

    #[test]
    fn refuses_names_it_cannot_store() {
        for bad in ["", " , ", "a,a", "{a}", "a=1", "x}"] {
            assert!(bad.parse::<QueueNames>().is_err(), "{bad:?}");
        }
    }
}
