//! Unit tests of the limits' settings, metrics and keys.

use std::time::Duration;

use prometheus_client::registry::Registry;

use super::limiter::member;
use super::metrics::{LimitLabels, LimitMetrics};
use super::settings::{LimitOverrides, Limits, Rate, WAKE_MARGIN, parse_overrides};

fn overrides(text: &str) -> LimitOverrides {
    parse_overrides(text).unwrap_or_else(|err| panic!("{err}"))
}

fn key(event: &str, listener: &str) -> (String, String) {
    (event.to_string(), listener.to_string())
}

#[test]
fn rates_read_per_second_minute_and_hour_with_an_optional_burst() {
    assert_eq!(Rate::parse("10/s").unwrap(), Rate::per_second(10));
    assert_eq!(Rate::parse("100/m").unwrap(), Rate::per_minute(100));
    assert_eq!(Rate::parse(" 5000/h ").unwrap(), Rate::per_hour(5000));
    assert_eq!(
        Rate::parse("10/s,burst:20").unwrap(),
        Rate::per_second(10).with_burst(20)
    );
    assert_eq!(
        Rate::parse("3/5s").unwrap(),
        Rate::new(3, Duration::from_secs(5))
    );
    assert_eq!(Rate::per_second(10).burst, 1, "evenly spaced unless said");
}

#[test]
fn rates_write_the_form_they_read() {
    for text in [
        "10/s",
        "100/m",
        "5000/h",
        "10/s,burst:20",
        "3/5s",
        "7/1m 30s",
    ] {
        let rate = Rate::parse(text).unwrap();
        assert_eq!(rate.to_string(), text);
        assert_eq!(Rate::parse(&rate.to_string()).unwrap(), rate);
    }
}

#[test]
fn a_wrong_rate_says_what_is_wrong_and_the_form_expected() {
    for (text, says) in [
        ("10", "`10` is not a rate; expected N/s, N/m or N/h"),
        ("10/x", "`x` is not a period; expected N/s, N/m or N/h"),
        ("0/s", "`0` is not a whole number of at least 1"),
        ("-1/s", "`-1` is not a whole number of at least 1"),
        ("ten/s", "`ten` is not a whole number"),
        ("10/0s", "the period must be longer than zero"),
        ("10/s,burst:0", "`0` is not a whole number of at least 1"),
        ("10/s,20", "`20` is not a burst"),
    ] {
        let err = Rate::parse(text).unwrap_err().to_string();
        assert!(err.contains(says), "{text}: {err}");
    }
}

#[test]
fn the_rate_spaces_runs_by_its_interval_and_bursts_ahead_by_its_tolerance() {
    let rate = Rate::per_second(50).with_burst(5);
    assert_eq!(rate.interval_micros(), 20_000.0);
    assert_eq!(rate.tolerance_micros(), 80_000.0);
    assert_eq!(Rate::per_minute(3).tolerance_micros(), 0.0);
}

#[test]
fn a_deferred_run_is_woken_two_intervals_early_within_15_to_90_ms_and_sleeps_the_rest() {
    let lead = |rate: Rate| rate.wake_lead().as_millis();
    assert_eq!(lead(Rate::per_second(50)), 40);
    assert_eq!(lead(Rate::per_second(20)), 90);
    assert_eq!(lead(Rate::per_minute(1)), 90);
    assert_eq!(lead(Rate::per_second(1_000)), 15);
    // A run woken early finds its turn within its short wait.
    let rate = Rate::per_second(20);
    assert_eq!(rate.short_wait(), rate.wake_lead() + WAKE_MARGIN);
}

#[test]
fn worker_limits_reads_each_listeners_limits() {
    let parsed = overrides(
        "orderPlaced.email=concurrency:5,rate:10/s,burst:10;orderPlaced.audit=rate:100/m",
    );
    assert_eq!(
        parsed,
        LimitOverrides::from([
            (
                key("orderPlaced", "email"),
                Limits {
                    concurrency: Some(5),
                    rate: Some(Rate::per_second(10).with_burst(10)),
                },
            ),
            (
                key("orderPlaced", "audit"),
                Limits {
                    concurrency: None,
                    rate: Some(Rate::per_minute(100)),
                },
            ),
        ])
    );
}

#[test]
fn worker_limits_allows_spaces_blank_entries_none_and_dotted_events() {
    let parsed = overrides(
        " orderPlaced.email = burst:2 , rate:10/s ; ; orderPlaced.audit=none;shop.order.placed.audit=concurrency:1;",
    );
    assert_eq!(
        parsed[&key("orderPlaced", "email")].rate,
        Some(Rate::per_second(10).with_burst(2))
    );
    assert!(parsed[&key("orderPlaced", "audit")].is_none());
    assert_eq!(
        parsed[&key("shop.order.placed", "audit")].concurrency,
        Some(1)
    );
    assert!(overrides("").is_empty());
    assert!(overrides(" ; ").is_empty());
}

#[test]
fn a_wrong_worker_limits_entry_is_named_with_what_is_wrong_and_the_form_expected() {
    for (text, entry, says) in [
        ("orderPlaced.email", "orderPlaced.email", "has no `=`"),
        (
            "email=rate:10/s",
            "email=rate:10/s",
            "does not name a listener as <event>.<listener>: `email`",
        ),
        (
            ".email=rate:10/s",
            ".email=rate:10/s",
            "does not name a listener",
        ),
        ("a.b=", "a.b=", "names no limit (write `none`"),
        ("a.b=rate:10/x", "a.b=rate:10/x", "`x` is not a period"),
        (
            "a.b=concurrency:0",
            "a.b=concurrency:0",
            "`concurrency:0`: `0` is not a whole number of at least 1",
        ),
        (
            "a.b=concurrency",
            "a.b=concurrency",
            "`concurrency` is not a limit: it needs a name and a value",
        ),
        (
            "a.b=speed:3",
            "a.b=speed:3",
            "`speed` is not a limit; the limits are concurrency, rate and burst",
        ),
        ("a.b=burst:3", "a.b=burst:3", "`burst` needs a rate"),
        (
            "a.b=rate:1/s,rate:2/s",
            "a.b=rate:1/s,rate:2/s",
            "`rate` is given twice",
        ),
        (
            "a.b=rate:1/s;x.y=none;a.b=none",
            "a.b=none",
            "names `a.b` again",
        ),
    ] {
        let err = parse_overrides(text).unwrap_err();
        assert_eq!(err.entry, entry, "{text}");
        let message = err.to_string();
        assert!(
            message.starts_with(&format!("WORKER_LIMITS: the entry `{entry}` ")),
            "{message}"
        );
        assert!(message.contains(says), "{text}: {message}");
        assert!(
            message.contains("expected <event>.<listener>=concurrency:N,rate:N/s|N/m|N/h,burst:N"),
            "{message}"
        );
    }
}

#[test]
fn limits_write_the_form_worker_limits_reads() {
    for text in [
        "none",
        "concurrency:5",
        "rate:10/s",
        "concurrency:5,rate:10/s,burst:10",
    ] {
        let limits: Limits = text.parse().unwrap();
        assert_eq!(limits.to_string(), text);
    }
}

#[test]
fn the_metrics_are_exported_under_their_names() {
    let metrics = LimitMetrics::default();
    let mut registry = Registry::default();
    metrics.register(registry.sub_registry_with_prefix("outbox"));
    let labels = LimitLabels {
        event: "orderPlaced".into(),
        listener: "email".into(),
        limit: "rate".into(),
    };
    metrics.deferred.get_or_create(&labels).inc();
    metrics.waited.get_or_create(&labels).observe(0.25);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains(
            r#"outbox_listener_limit_deferred_total{event="orderPlaced",listener="email",limit="rate"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains(
            r#"outbox_listener_limit_wait_seconds_count{event="orderPlaced",listener="email",limit="rate"} 1"#
        ),
        "{text}"
    );
}

#[test]
fn a_run_is_known_by_its_queue_and_task_id() {
    assert_eq!(member("default", "abc"), r#"["default","abc"]"#);
    assert_ne!(member("a:b", "c"), member("a", "b:c"));
}
