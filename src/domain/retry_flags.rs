//! A listener's retry policy as `gpkit add event`'s flags give it
//! (`--retries`, `--timeout`, `--backoff`): the forms those flags take, and
//! the kit's calls (`ListenerOptions::retries`, `timeout`, `backoff`) and
//! words they become.

use anyhow::{Result, bail};

/// The form of a duration, for errors.
const DURATION_FORM: &str = "a whole number with a unit, ms, s, m or h, such as `90s` or `10m`";
/// The forms of a backoff, for errors.
const BACKOFF_FORM: &str = "`fixed:<delay>` (such as `fixed:30s`), \
     `exponential:<first>:<most>` (such as `exponential:1s:10m`) or `asynq` (the default)";

/// A duration as the flags take it: `500ms`, `90s`, `10m`, `1h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FlagDuration {
    millis: u64,
}

impl FlagDuration {
    /// Reads `raw`; `flag` names the flag for the error (`--timeout`).
    pub(crate) fn parse(raw: &str, flag: &str) -> Result<Self> {
        let unit_at = raw.find(|c: char| !c.is_ascii_digit()).unwrap_or(raw.len());
        let (number, unit) = raw.split_at(unit_at);
        let scale = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "" => bail!("`{flag} {raw}` has no unit\nhelp: expected {DURATION_FORM}"),
            _ => bail!("`{flag} {raw}`: `{unit}` is not a unit\nhelp: expected {DURATION_FORM}"),
        };
        let millis = number
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(scale));
        match millis {
            Some(millis) if millis > 0 => Ok(Self { millis }),
            _ => bail!(
                "`{flag} {raw}`: `{number}` is not a duration above zero\n\
                 help: expected {DURATION_FORM}"
            ),
        }
    }

    /// As code: `Duration::from_secs(90)`, or `from_millis` below a whole
    /// second.
    fn code(self) -> String {
        if self.millis.is_multiple_of(1_000) {
            format!("Duration::from_secs({})", self.millis / 1_000)
        } else {
            format!("Duration::from_millis({})", self.millis)
        }
    }

    /// In words: `90 seconds`, `10 minutes`, `1 hour`, `500 ms`.
    fn words(self) -> String {
        let plural = |n: u64, unit: &str| format!("{n} {unit}{}", if n == 1 { "" } else { "s" });
        match self.millis {
            ms if ms.is_multiple_of(3_600_000) => plural(ms / 3_600_000, "hour"),
            ms if ms.is_multiple_of(60_000) => plural(ms / 60_000, "minute"),
            ms if ms.is_multiple_of(1_000) => plural(ms / 1_000, "second"),
            ms => format!("{ms} ms"),
        }
    }
}

/// A backoff as `--backoff` takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FlagBackoff {
    /// Go asynq's, the kit's default.
    Asynq,
    /// The same delay before every retry.
    Fixed(FlagDuration),
    /// Doubling from the first delay up to the most, with jitter.
    Exponential {
        first: FlagDuration,
        most: FlagDuration,
    },
}

impl FlagBackoff {
    /// Reads `fixed:30s`, `exponential:1s:10m` or `asynq`.
    pub(crate) fn parse(raw: &str) -> Result<Self> {
        let mut parts = raw.split(':');
        let kind = parts.next().unwrap_or_default();
        let rest: Vec<&str> = parts.collect();
        let flag = "--backoff";
        match (kind, rest.as_slice()) {
            ("asynq", []) => Ok(Self::Asynq),
            ("fixed", [delay]) => Ok(Self::Fixed(FlagDuration::parse(delay, flag)?)),
            ("exponential", [first, most]) => {
                let first = FlagDuration::parse(first, flag)?;
                let most = FlagDuration::parse(most, flag)?;
                if most.millis < first.millis {
                    bail!(
                        "`--backoff {raw}`: the most, {}, is less than the first delay, {}\n\
                         help: give the first delay, then the longest, such as \
                         `exponential:1s:10m`",
                        most.words(),
                        first.words()
                    );
                }
                Ok(Self::Exponential { first, most })
            }
            _ => bail!("`--backoff {raw}` is not a backoff\nhelp: expected {BACKOFF_FORM}"),
        }
    }

    /// As code: `Backoff::fixed(Duration::from_secs(30))`. An exponential
    /// one's two arguments, always wider together than rustfmt's 60
    /// columns of arguments, go one per line, indented by four.
    fn code(self) -> String {
        match self {
            Self::Asynq => "Backoff::asynq()".to_string(),
            Self::Fixed(delay) => format!("Backoff::fixed({})", delay.code()),
            Self::Exponential { first, most } => format!(
                "Backoff::exponential(\n    {},\n    {},\n)",
                first.code(),
                most.code()
            ),
        }
    }

    /// In words, after "retries ...": `30 seconds apart`.
    fn words(self) -> String {
        match self {
            Self::Asynq => "with Go asynq's backoff".to_string(),
            Self::Fixed(delay) => format!("{} apart", delay.words()),
            Self::Exponential { first, most } => format!(
                "from {} apart, doubling up to {}, with jitter",
                first.words(),
                most.words()
            ),
        }
    }
}

/// The retry flags given, read and checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RetryFlags {
    pub(crate) retries: Option<u32>,
    pub(crate) timeout: Option<FlagDuration>,
    pub(crate) backoff: Option<FlagBackoff>,
}

impl RetryFlags {
    /// Reads the flags as given (the raw strings are what `gpkit.toml`
    /// records).
    pub(crate) fn parse(
        retries: Option<u32>,
        timeout: Option<&str>,
        backoff: Option<&str>,
    ) -> Result<Self> {
        Ok(Self {
            retries,
            timeout: timeout
                .map(|t| FlagDuration::parse(t, "--timeout"))
                .transpose()?,
            backoff: backoff.map(FlagBackoff::parse).transpose()?,
        })
    }

    /// Whether a timeout or a backoff is given: the listener's module then
    /// needs `std::time::Duration` (an `asynq` backoff alone does not).
    pub(crate) fn uses_duration(&self) -> bool {
        self.timeout.is_some() || matches!(self.backoff, Some(b) if b != FlagBackoff::Asynq)
    }

    /// The calls on `ListenerOptions` that say it: `["retries(3)",
    /// "timeout(Duration::from_secs(60))", "backoff(...)"]`.
    pub(crate) fn calls(&self) -> Vec<String> {
        let mut calls = Vec::new();
        if let Some(retries) = self.retries {
            calls.push(format!("retries({retries})"));
        }
        if let Some(timeout) = self.timeout {
            calls.push(format!("timeout({})", timeout.code()));
        }
        if let Some(backoff) = self.backoff {
            calls.push(format!("backoff({})", backoff.code()));
        }
        calls
    }

    /// In words: `at most 3 retries, 30 seconds apart; each run stopped
    /// after 10 minutes`; empty when no flag is given.
    pub(crate) fn words(&self) -> String {
        let retries = match (self.retries, self.backoff) {
            (None, None) => None,
            (Some(0), _) => Some("no retry".to_string()),
            (Some(n), None) => Some(format!(
                "at most {n} retr{}",
                if n == 1 { "y" } else { "ies" }
            )),
            (Some(n), Some(backoff)) => Some(format!(
                "at most {n} retr{}, {}",
                if n == 1 { "y" } else { "ies" },
                backoff.words()
            )),
            (None, Some(backoff)) => Some(format!("retries {}", backoff.words())),
        };
        let timeout = self
            .timeout
            .map(|t| format!("each run stopped after {}", t.words()));
        [retries, timeout]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_a_number_and_a_unit() {
        let ms = |raw| FlagDuration::parse(raw, "--timeout").unwrap().millis;
        assert_eq!(ms("500ms"), 500);
        assert_eq!(ms("90s"), 90_000);
        assert_eq!(ms("10m"), 600_000);
        assert_eq!(ms("1h"), 3_600_000);
        for (bad, says) in [
            ("90", "has no unit"),
            ("10d", "`d` is not a unit"),
            ("0s", "not a duration above zero"),
            ("s", "not a duration above zero"),
            ("-1s", "`-1s` is not a unit"),
            ("99999999999999999h", "not a duration above zero"),
        ] {
            let err = FlagDuration::parse(bad, "--timeout")
                .unwrap_err()
                .to_string();
            assert!(err.contains(&format!("`--timeout {bad}`")), "{err}");
            assert!(err.contains(says), "{bad}: {err}");
            assert!(err.contains("help: expected a whole number"), "{err}");
        }
    }

    #[test]
    fn durations_become_code_and_words() {
        let d = |raw| FlagDuration::parse(raw, "--timeout").unwrap();
        assert_eq!(d("10m").code(), "Duration::from_secs(600)");
        assert_eq!(d("1500ms").code(), "Duration::from_millis(1500)");
        assert_eq!(d("1h").words(), "1 hour");
        assert_eq!(d("120s").words(), "2 minutes");
        assert_eq!(d("1s").words(), "1 second");
        assert_eq!(d("1500ms").words(), "1500 ms");
    }

    #[test]
    fn backoffs_read_their_three_forms() {
        assert_eq!(FlagBackoff::parse("asynq").unwrap(), FlagBackoff::Asynq);
        assert_eq!(
            FlagBackoff::parse("fixed:30s").unwrap().code(),
            "Backoff::fixed(Duration::from_secs(30))"
        );
        assert_eq!(
            FlagBackoff::parse("exponential:1s:10m").unwrap().code(),
            "Backoff::exponential(\n    Duration::from_secs(1),\n    Duration::from_secs(600),\n)"
        );
        for (bad, says) in [
            ("linear", "is not a backoff"),
            ("fixed", "is not a backoff"),
            ("fixed:30", "has no unit"),
            ("exponential:1s", "is not a backoff"),
            (
                "exponential:10m:1s",
                "the most, 1 second, is less than the first delay",
            ),
            ("asynq:1s", "is not a backoff"),
        ] {
            let err = FlagBackoff::parse(bad).unwrap_err().to_string();
            assert!(err.contains(says), "{bad}: {err}");
            assert!(err.contains("help:"), "{err}");
        }
    }

    #[test]
    fn the_flags_become_calls_and_words() {
        let flags = RetryFlags::parse(Some(3), Some("10m"), Some("fixed:30s")).unwrap();
        assert_eq!(
            flags.calls(),
            [
                "retries(3)",
                "timeout(Duration::from_secs(600))",
                "backoff(Backoff::fixed(Duration::from_secs(30)))"
            ]
        );
        assert_eq!(
            flags.words(),
            "at most 3 retries, 30 seconds apart; each run stopped after 10 minutes"
        );
        assert!(flags.uses_duration());
        let asynq = RetryFlags::parse(Some(1), None, Some("asynq")).unwrap();
        assert!(!asynq.uses_duration());
        assert_eq!(asynq.words(), "at most 1 retry, with Go asynq's backoff");
        let none = RetryFlags::parse(Some(0), None, None).unwrap();
        assert_eq!(none.words(), "no retry");
        assert_eq!(RetryFlags::default().words(), "");
        assert!(RetryFlags::default().calls().is_empty());
    }
}
