//! Times and durations on the command line: `--since 2h` (two hours ago),
//! `--since 2026-11-30T08:00:00Z` (RFC 3339, or `2026-11-30 08:00:00`,
//! UTC), `--max-lag 30s` (humantime durations: `90s`, `5m`, `7d`, `1h 30m`).

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

/// A point in time: a duration means that long before now.
pub(crate) fn parse_time(text: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(ago) = humantime::parse_duration(text) {
        let ago = TimeDelta::from_std(ago).map_err(|_| too_far(text))?;
        return Utc::now()
            .checked_sub_signed(ago)
            .ok_or_else(|| too_far(text));
    }
    if let Ok(time) = DateTime::parse_from_rfc3339(text) {
        return Ok(time.to_utc());
    }
    if let Ok(time) = humantime::parse_rfc3339_weak(text) {
        return Ok(DateTime::<Utc>::from(time));
    }
    Err(format!(
        "`{text}` is not a time; expected a duration such as 30m or 7d (that long ago) or a \
         time such as 2026-11-30T08:00:00Z"
    ))
}

/// A duration such as `30s`, `5m` or `1h 30m`.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|err| {
        format!("`{text}` is not a duration ({err}); expected a duration such as 30s, 5m or 1h")
    })
}

fn too_far(text: &str) -> String {
    format!("`{text}` reaches too far back")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_is_that_long_ago() {
        let time = parse_time("2h").unwrap();
        let ago = Utc::now() - time;
        assert!(ago >= TimeDelta::hours(2) && ago < TimeDelta::hours(2) + TimeDelta::minutes(1));
    }

    #[test]
    fn times_are_rfc_3339_or_utc_without_zone() {
        let expected: DateTime<Utc> = "2026-11-30T08:00:00Z".parse().unwrap();
        assert_eq!(parse_time("2026-11-30T08:00:00Z").unwrap(), expected);
        assert_eq!(parse_time("2026-11-30T09:00:00+01:00").unwrap(), expected);
        assert_eq!(parse_time("2026-11-30 08:00:00").unwrap(), expected);
    }

    #[test]
    fn anything_else_is_a_clear_error() {
        let err = parse_time("yesterday").unwrap_err();
        assert!(err.contains("`yesterday` is not a time"), "{err}");
        assert!(parse_time("2026-13-45").is_err());
        assert!(parse_duration("30 parsecs").is_err());
        assert_eq!(parse_duration("1m 30s"), Ok(Duration::from_secs(90)));
    }
}
