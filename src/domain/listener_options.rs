//! How a listener runs, as `gpkit add event`'s flags say (`--ordered-by`,
//! `--concurrency`, `--rate`, `--burst`, and the retry policy's
//! `--retries`, `--timeout`, `--backoff`, read in [`super::retry_flags`]):
//! the rules those flags follow, and the kit's `ListenerOptions` the
//! listener's `options()` returns.

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

use super::retry_flags::RetryFlags;

/// How one listener runs besides its handler, as recorded in `gpkit.toml`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ListenerRun {
    /// One event of each key at a time, in commit order.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) ordered: bool,
    /// At most this many runs at once, across every worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) concurrency: Option<u32>,
    /// At most this many runs started per period (`10/s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) rate: Option<String>,
    /// The burst the rate allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) burst: Option<u32>,
    /// Retries after the first failed run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) retries: Option<u32>,
    /// The longest one run may take (`10m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) timeout: Option<String>,
    /// The delay before each retry (`fixed:30s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) backoff: Option<String>,
}

/// `gpkit add event`'s flags on how the listeners given with them run.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RunFlags<'a> {
    pub(crate) ordered: bool,
    pub(crate) concurrency: Option<u32>,
    pub(crate) rate: Option<&'a str>,
    pub(crate) burst: Option<u32>,
    pub(crate) retries: Option<u32>,
    pub(crate) timeout: Option<&'a str>,
    pub(crate) backoff: Option<&'a str>,
}

/// A rate as `--rate` takes it: `N/s`, `N/m` or `N/h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rate {
    pub(crate) count: u32,
    pub(crate) per: Period,
}

/// The period of a [`Rate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Period {
    Second,
    Minute,
    Hour,
}

impl Rate {
    /// `10/s`, `100/m`, `5000/h`.
    pub(crate) fn parse(raw: &str) -> Result<Self> {
        let form = "expected N/s, N/m or N/h with N of at least 1, such as `--rate 10/s`";
        let Some((count, per)) = raw.split_once('/') else {
            bail!("`--rate {raw}` is not a rate\nhelp: {form}");
        };
        let per = match per {
            "s" => Period::Second,
            "m" => Period::Minute,
            "h" => Period::Hour,
            _ => bail!("`--rate {raw}`: `{per}` is not a period\nhelp: {form}"),
        };
        match count.parse::<u32>() {
            Ok(count) if count > 0 => Ok(Self { count, per }),
            _ => bail!("`--rate {raw}`: `{count}` is not a number of runs\nhelp: {form}"),
        }
    }

    /// The kit's `Rate` of it, as code.
    fn code(self) -> String {
        let per = match self.per {
            Period::Second => "per_second",
            Period::Minute => "per_minute",
            Period::Hour => "per_hour",
        };
        format!("Rate::{per}({})", self.count)
    }

    /// In words: `10 a second`.
    fn words(self) -> String {
        let per = match self.per {
            Period::Second => "second",
            Period::Minute => "minute",
            Period::Hour => "hour",
        };
        format!("{} a {per}", self.count)
    }
}

impl ListenerRun {
    /// The run `gpkit add event`'s flags ask for: ordered or not, and the
    /// limits, checked; `None` when they ask for nothing.
    pub(crate) fn from_flags(flags: RunFlags<'_>) -> Result<Option<Self>> {
        let RunFlags {
            ordered,
            concurrency,
            rate,
            burst,
            retries,
            timeout,
            backoff,
        } = flags;
        RetryFlags::parse(retries, timeout, backoff)?;
        if concurrency == Some(0) {
            bail!(
                "`--concurrency 0` would never run the listener\n\
                 help: give at least 1, or leave the flag out for no limit"
            );
        }
        if let Some(rate) = rate {
            Rate::parse(rate)?;
        }
        match (rate, burst) {
            (None, Some(_)) => bail!(
                "`--burst` is the burst of a rate, and no `--rate` is given\n\
                 help: add `--rate 10/s`, or leave out `--burst`"
            ),
            (_, Some(0)) => bail!("`--burst 0` allows no run at all\nhelp: give at least 1"),
            _ => {}
        }
        let run = Self {
            ordered,
            concurrency,
            rate: rate.map(str::to_string),
            burst,
            retries,
            timeout: timeout.map(str::to_string),
            backoff: backoff.map(str::to_string),
        };
        Ok((run != Self::default()).then_some(run))
    }

    /// Its retry policy, read (`from_flags` checked it; a hand-edited
    /// `gpkit.toml` that no longer reads counts as none).
    fn retry(&self) -> RetryFlags {
        RetryFlags::parse(
            self.retries,
            self.timeout.as_deref(),
            self.backoff.as_deref(),
        )
        .unwrap_or_default()
    }

    /// Whether its `options()` names `std::time::Duration`.
    pub(crate) fn uses_duration(&self) -> bool {
        self.retry().uses_duration()
    }

    /// Whether it sets limits (`WORKER_LIMITS` overrides them).
    pub(crate) fn has_limits(&self) -> bool {
        self.concurrency.is_some() || self.rate.is_some()
    }

    /// Whether it sets a retry policy (`WORKER_RETRIES` overrides it).
    pub(crate) fn has_retry_policy(&self) -> bool {
        self.retry() != RetryFlags::default()
    }

    /// Its rate, read (`from_flags` checked it).
    fn parsed_rate(&self) -> Option<Rate> {
        self.rate.as_deref().and_then(|r| Rate::parse(r).ok())
    }

    /// The calls on `ListenerOptions::new()` that make it:
    /// `["ordered()", "concurrency(5)", "rate(Rate::per_second(10))"]`.
    pub(crate) fn calls(&self) -> Vec<String> {
        let mut calls = Vec::new();
        if self.ordered {
            calls.push("ordered()".to_string());
        }
        if let Some(concurrency) = self.concurrency {
            calls.push(format!("concurrency({concurrency})"));
        }
        if let Some(rate) = self.parsed_rate() {
            let burst = self
                .burst
                .map(|b| format!(".with_burst({b})"))
                .unwrap_or_default();
            calls.push(format!("rate({}{burst})", rate.code()));
        }
        calls.extend(self.retry().calls());
        calls
    }

    /// Whether rustfmt keeps `ListenerOptions::new()` and [`Self::calls`]
    /// on one line: a chain of one call always (while the line fits), a
    /// longer one while it takes at most 60 columns.
    /// A call of several lines (an exponential backoff, whose arguments
    /// rustfmt puts one per line) keeps a chain of more calls on lines of
    /// their own.
    pub(crate) fn fits_one_line(&self) -> bool {
        let calls = self.calls();
        let width =
            "ListenerOptions::new()".len() + calls.iter().map(|c| c.len() + 1).sum::<usize>();
        calls.len() <= 1 || (width <= 60 && !calls.iter().any(|c| c.contains('\n')))
    }

    /// The body of `options()`: lines indented as rustfmt leaves them. One
    /// call stays on the first line, a call of several lines overflowing
    /// from it; more calls, each on its own line.
    pub(crate) fn body(&self) -> Vec<String> {
        let calls = self.calls();
        if self.fits_one_line() {
            let chain: String = calls.iter().map(|c| format!(".{c}")).collect();
            let mut lines = chain.lines();
            let first = format!("    ListenerOptions::new(){}", lines.next().unwrap_or(""));
            std::iter::once(first)
                .chain(lines.map(|line| format!("    {line}")))
                .collect()
        } else {
            std::iter::once("    ListenerOptions::new()".to_string())
                .chain(calls.iter().flat_map(|call| {
                    call.lines()
                        .enumerate()
                        .map(|(i, line)| {
                            if i == 0 {
                                format!("        .{line}")
                            } else {
                                format!("        {line}")
                            }
                        })
                        .collect::<Vec<_>>()
                }))
                .collect()
        }
    }

    /// What it does, in words, for the doc comment of `options()`:
    /// `one event of each order_id at a time, in commit order; at most 5 at
    /// once and 10 a second, across every worker`.
    pub(crate) fn summary(&self, ordered_by: Option<&str>) -> String {
        let mut parts = Vec::new();
        if self.ordered {
            parts.push(format!(
                "one event of each `{}` at a time, in the order their transactions committed",
                ordered_by.unwrap_or("key")
            ));
        }
        let mut limits = Vec::new();
        if let Some(concurrency) = self.concurrency {
            limits.push(format!("at most {concurrency} at once"));
        }
        if let Some(rate) = self.parsed_rate() {
            let burst = self
                .burst
                .map(|b| format!(" (bursts of {b})"))
                .unwrap_or_default();
            limits.push(format!("{}{burst}", rate.words()));
        }
        if !limits.is_empty() {
            parts.push(format!("{}, across every worker", limits.join(" and ")));
        }
        let retry = self.retry().words();
        if !retry.is_empty() {
            parts.push(retry);
        }
        parts.join("; ")
    }
}

/// `text` as lines of at most `width` characters, broken between words.
pub(crate) fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_read_per_second_minute_or_hour() {
        assert_eq!(
            Rate::parse("10/s").unwrap(),
            Rate {
                count: 10,
                per: Period::Second
            }
        );
        assert_eq!(Rate::parse("5/h").unwrap().per, Period::Hour);
        for bad in ["10", "10/d", "0/s", "x/s", "-1/m", "/s"] {
            let err = Rate::parse(bad).unwrap_err().to_string();
            assert!(err.contains(&format!("`--rate {bad}`")), "{err}");
            assert!(err.contains("help: expected N/s, N/m or N/h"), "{err}");
        }
    }

    #[test]
    fn flags_are_checked_and_nothing_asked_is_none() {
        assert_eq!(ListenerRun::from_flags(RunFlags::default()).unwrap(), None);
        let run = ListenerRun::from_flags(RunFlags {
            ordered: true,
            concurrency: Some(5),
            rate: Some("10/s"),
            burst: Some(20),
            ..RunFlags::default()
        })
        .unwrap()
        .unwrap();
        assert_eq!(
            run.calls(),
            [
                "ordered()",
                "concurrency(5)",
                "rate(Rate::per_second(10).with_burst(20))"
            ]
        );
        assert!(!run.fits_one_line());
        assert_eq!(
            run.summary(Some("order_id")),
            "one event of each `order_id` at a time, in the order their transactions \
             committed; at most 5 at once and 10 a second (bursts of 20), across every worker"
        );
        for (flags, message) in [
            ((None, None, Some(3)), "no `--rate` is given"),
            ((Some(0), None, None), "`--concurrency 0` would never run"),
            ((None, Some("1/s"), Some(0)), "`--burst 0` allows no run"),
            ((None, Some("1/x"), None), "`x` is not a period"),
        ] {
            let (concurrency, rate, burst) = flags;
            let err = ListenerRun::from_flags(RunFlags {
                concurrency,
                rate,
                burst,
                ..RunFlags::default()
            })
            .unwrap_err()
            .to_string();
            assert!(err.contains(message), "{err}");
            assert!(err.contains("help:"), "{err}");
        }
    }

    #[test]
    fn a_chain_fits_one_line_as_rustfmt_keeps_it() {
        let run = |ordered, concurrency, rate: Option<&str>| ListenerRun {
            ordered,
            concurrency,
            rate: rate.map(str::to_string),
            ..ListenerRun::default()
        };
        // Checked against rustfmt (edition 2024).
        assert!(run(true, None, None).fits_one_line());
        assert!(run(true, Some(5), None).fits_one_line());
        assert!(run(false, None, Some("10/s")).fits_one_line());
        assert!(!run(false, Some(5), Some("10/s")).fits_one_line());
        assert!(!run(true, None, Some("1000/m")).fits_one_line());
    }

    #[test]
    fn a_retry_policy_is_checked_written_after_the_limits_and_said() {
        let run = ListenerRun::from_flags(RunFlags {
            concurrency: Some(2),
            retries: Some(3),
            timeout: Some("10m"),
            backoff: Some("exponential:1s:1m"),
            ..RunFlags::default()
        })
        .unwrap()
        .unwrap();
        assert_eq!(
            run.calls(),
            [
                "concurrency(2)",
                "retries(3)",
                "timeout(Duration::from_secs(600))",
                "backoff(Backoff::exponential(\n    Duration::from_secs(1),\n    Duration::from_secs(60),\n))"
            ]
        );
        assert!(run.uses_duration() && run.has_retry_policy() && run.has_limits());
        assert_eq!(
            run.summary(None),
            "at most 2 at once, across every worker; at most 3 retries, from 1 second apart, \
             doubling up to 1 minute, with jitter; each run stopped after 10 minutes"
        );
        let retries_only = ListenerRun::from_flags(RunFlags {
            retries: Some(2),
            ..RunFlags::default()
        })
        .unwrap()
        .unwrap();
        assert_eq!(retries_only.calls(), ["retries(2)"]);
        assert!(!retries_only.uses_duration() && !retries_only.has_limits());
        let err = ListenerRun::from_flags(RunFlags {
            timeout: Some("soon"),
            ..RunFlags::default()
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("`--timeout soon`"), "{err}");
    }

    #[test]
    fn an_exponential_backoff_is_written_as_rustfmt_writes_it() {
        // Checked against rustfmt (edition 2024): one call overflows from
        // the first line, more calls go one per line.
        let run = |timeout: Option<&str>| {
            ListenerRun::from_flags(RunFlags {
                timeout,
                backoff: Some("exponential:1s:10m"),
                ..RunFlags::default()
            })
            .unwrap()
            .unwrap()
        };
        assert_eq!(
            run(None).body(),
            [
                "    ListenerOptions::new().backoff(Backoff::exponential(",
                "        Duration::from_secs(1),",
                "        Duration::from_secs(600),",
                "    ))"
            ]
        );
        assert_eq!(
            run(Some("90s")).body(),
            [
                "    ListenerOptions::new()",
                "        .timeout(Duration::from_secs(90))",
                "        .backoff(Backoff::exponential(",
                "            Duration::from_secs(1),",
                "            Duration::from_secs(600),",
                "        ))"
            ]
        );
    }

    #[test]
    fn text_wraps_between_words() {
        assert_eq!(wrap("one two three four", 9), ["one two", "three", "four"]);
    }
}
