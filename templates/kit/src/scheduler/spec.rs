//! Timing specs and the tick times they give: cron specs (5 fields, or 6
//! with seconds first), the nicknames `@hourly`, `@daily`, `@weekly`,
//! `@monthly` (and `@yearly`), and `@every <duration>`.
//!
//! Every replica computes the same tick times, so a tick's id (see
//! [`super::Tick`]) is the same whichever replica enqueues it:
//! - a cron spec's ticks are its matches in the schedule's time zone
//!   (`croner`, zones from `chrono-tz`);
//! - `@every <d>` ticks at the multiples of `d` since the Unix epoch, so
//!   `@every 1h` ticks on the hour (UTC) whoever started when.
//!
//! # Daylight saving time
//!
//! - A local time that is skipped (clocks go forward) runs once, at the
//!   first instant after the gap: `30 2 * * *` in `Europe/Paris` runs at
//!   03:00 on the last Sunday of March. croner does this for specs with a
//!   fixed second, minute and hour; for other specs (`*/30 2 * * *`) the
//!   skipped times do not run: they did not happen.
//! - A local time that repeats (clocks go back) runs once, at its first
//!   occurrence. croner runs specs without a fixed time (`0 * * * *`) at
//!   both occurrences; [`Spec::next_after`] skips the second, so every
//!   local time runs at most once a day.
//!
//! `@every` ignores time zones: it counts elapsed time.

use std::str::FromStr;
use std::time::Duration;

use anyhow::{Context as _, bail};
use chrono::{DateTime, LocalResult, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};

/// A schedule's timing: when it ticks.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    timing: Timing,
    zone: Tz,
}

#[derive(Debug, Clone)]
enum Timing {
    Cron(Box<Cron>),
    /// Every this many seconds, counted from the Unix epoch.
    Every(i64),
}

impl Spec {
    /// Parses `spec` read in the IANA time zone `zone` (such as `UTC` or
    /// `Europe/Paris`).
    pub(crate) fn parse(spec: &str, zone: &str) -> anyhow::Result<Self> {
        let zone = Tz::from_str(zone)
            .map_err(|_| anyhow::anyhow!("`{zone}` is not an IANA time zone, such as UTC"))?;
        let spec = spec.trim();
        let timing = if let Some(every) = spec.strip_prefix("@every ") {
            let every = humantime::parse_duration(every.trim())
                .with_context(|| format!("`{spec}`: not a duration"))?;
            if every < Duration::from_secs(1) || every.subsec_nanos() != 0 {
                bail!("`{spec}`: the duration must be whole seconds, at least one");
            }
            Timing::Every(i64::try_from(every.as_secs()).context("the duration is too long")?)
        } else {
            let cron = CronParser::builder()
                .seconds(Seconds::Optional)
                .year(Year::Disallowed)
                .build()
                .parse(spec)
                .with_context(|| format!("`{spec}` is not a cron spec"))?;
            Timing::Cron(Box::new(cron))
        };
        Ok(Self { timing, zone })
    }

    /// The first tick strictly after `after`, or `None` when the spec never
    /// matches again.
    pub(crate) fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match &self.timing {
            Timing::Every(every) => {
                let next = (after.timestamp().div_euclid(*every) + 1) * every;
                DateTime::from_timestamp(next, 0)
            }
            Timing::Cron(cron) => {
                let mut from = after.with_timezone(&self.zone);
                // A repeated local hour has at most 3600 seconds to skip.
                for _ in 0..=3600 {
                    let next = cron.find_next_occurrence(&from, false).ok()?;
                    if !self.is_repeat(&next) {
                        return Some(next.with_timezone(&Utc));
                    }
                    from = next;
                }
                None
            }
        }
    }

    /// Up to `count` ticks at or before `at`, oldest first: the ticks a new
    /// leader catches up on.
    pub(crate) fn latest(&self, at: DateTime<Utc>, count: u32) -> Vec<DateTime<Utc>> {
        let mut ticks = Vec::new();
        match &self.timing {
            Timing::Every(every) => {
                let last = at.timestamp().div_euclid(*every) * every;
                for k in 0..i64::from(count) {
                    if let Some(tick) = DateTime::from_timestamp(last - k * every, 0) {
                        ticks.push(tick);
                    }
                }
            }
            Timing::Cron(cron) => {
                let mut from = at.with_timezone(&self.zone);
                let mut inclusive = true;
                while ticks.len() < count as usize {
                    let Ok(tick) = cron.find_previous_occurrence(&from, inclusive) else {
                        break;
                    };
                    if !self.is_repeat(&tick) {
                        ticks.push(tick.with_timezone(&Utc));
                    }
                    from = tick;
                    inclusive = false;
                }
            }
        }
        ticks.reverse();
        ticks
    }

    /// Whether `local` is the second occurrence of a repeated local time.
    fn is_repeat(&self, local: &DateTime<Tz>) -> bool {
        matches!(
            self.zone.from_local_datetime(&local.naive_local()),
            LocalResult::Ambiguous(first, _) if first != *local
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(text: &str) -> DateTime<Utc> {
        text.parse().unwrap()
    }

    /// Ticks of `spec` in `zone` from `from` up to `to`, in UTC.
    fn ticks(spec: &str, zone: &str, from: &str, to: &str) -> Vec<String> {
        let spec = Spec::parse(spec, zone).unwrap();
        let (mut at, to) = (utc(from), utc(to));
        let mut out = Vec::new();
        while let Some(next) = spec.next_after(at).filter(|next| *next <= to) {
            out.push(next.to_rfc3339());
            at = next;
        }
        out
    }

    #[test]
    fn every_ticks_on_multiples_of_its_duration() {
        assert_eq!(
            ticks(
                "@every 20s",
                "UTC",
                "2026-01-01T00:00:05Z",
                "2026-01-01T00:01:00Z"
            ),
            [
                "2026-01-01T00:00:20+00:00",
                "2026-01-01T00:00:40+00:00",
                "2026-01-01T00:01:00+00:00"
            ]
        );
    }

    /// Paris skips 02:00-03:00 on 2026-03-29: 02:30 runs once, at 03:00
    /// local (01:00 UTC); the days around it run at 02:30.
    #[test]
    fn a_skipped_local_time_runs_once_at_the_next_valid_time() {
        assert_eq!(
            ticks(
                "30 2 * * *",
                "Europe/Paris",
                "2026-03-28T00:00:00Z",
                "2026-03-30T23:00:00Z"
            ),
            [
                "2026-03-28T01:30:00+00:00",
                "2026-03-29T01:00:00+00:00",
                "2026-03-30T00:30:00+00:00"
            ]
        );
    }

    /// Paris repeats 02:00-03:00 on 2026-10-25: 02:30 runs once, at its
    /// first occurrence (00:30 UTC), not again at 01:30 UTC.
    #[test]
    fn a_repeated_local_time_runs_once() {
        assert_eq!(
            ticks(
                "30 2 * * *",
                "Europe/Paris",
                "2026-10-24T00:00:00Z",
                "2026-10-26T23:00:00Z"
            ),
            [
                "2026-10-24T00:30:00+00:00",
                "2026-10-25T00:30:00+00:00",
                "2026-10-26T01:30:00+00:00"
            ]
        );
    }

    /// croner alone would run an hourly spec at 02:00 twice that night
    /// (00:00 and 01:00 UTC); the repeat is skipped.
    #[test]
    fn an_hourly_spec_runs_each_local_hour_once_when_clocks_go_back() {
        assert_eq!(
            ticks(
                "@hourly",
                "Europe/Paris",
                "2026-10-24T22:30:00Z",
                "2026-10-25T02:30:00Z"
            ),
            [
                "2026-10-24T23:00:00+00:00",
                "2026-10-25T00:00:00+00:00",
                "2026-10-25T02:00:00+00:00"
            ]
        );
    }

    /// The gap [`Spec::next_after`] fills: croner alone runs an hourly spec
    /// at both occurrences of the repeated 02:00. Should croner change,
    /// this test says so.
    #[test]
    fn croner_alone_runs_a_repeated_hour_twice() {
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse("0 * * * *")
            .unwrap();
        let first = utc("2026-10-25T00:00:00Z").with_timezone(&Tz::Europe__Paris);
        let next = cron.find_next_occurrence(&first, false).unwrap();
        assert_eq!(next.with_timezone(&Utc), utc("2026-10-25T01:00:00Z"));
        assert_eq!(next.naive_local(), first.naive_local());
    }

    /// Documented: a spec without a fixed time skips the local times that
    /// do not exist (`*/30 2 * * *` has no 02:00 or 02:30 on 2026-03-29).
    #[test]
    fn specs_without_a_fixed_time_skip_a_skipped_hour() {
        assert_eq!(
            ticks(
                "*/30 2 * * *",
                "Europe/Paris",
                "2026-03-28T23:00:00Z",
                "2026-03-30T01:00:00Z"
            ),
            ["2026-03-30T00:00:00+00:00", "2026-03-30T00:30:00+00:00"]
        );
    }

    #[test]
    fn latest_gives_the_ticks_to_catch_up_on_oldest_first() {
        let spec = Spec::parse("@every 1s", "UTC").unwrap();
        assert_eq!(
            spec.latest(utc("2026-01-01T00:00:10.5Z"), 3),
            [
                utc("2026-01-01T00:00:08Z"),
                utc("2026-01-01T00:00:09Z"),
                utc("2026-01-01T00:00:10Z")
            ]
        );
        let daily = Spec::parse("0 2 * * *", "UTC").unwrap();
        assert_eq!(
            daily.latest(utc("2026-01-03T01:00:00Z"), 2),
            [utc("2026-01-01T02:00:00Z"), utc("2026-01-02T02:00:00Z")]
        );
    }

    #[test]
    fn bad_specs_and_zones_are_errors() {
        assert!(Spec::parse("0 2 32 * *", "UTC").is_err());
        assert!(Spec::parse("@every 500ms", "UTC").is_err());
        assert!(Spec::parse("0 2 * * *", "Mars/Olympus").is_err());
    }
}
