//! A listener's retry policy ([`RetryPolicy`]): how many retries follow its
//! first failed run, how long one run may take, how long it waits before
//! each retry ([`Backoff`]), and how many times a run may put itself off
//! ([`Snooze`]). Given through
//! [`ListenerOptions`](super::listeners::ListenerOptions), overridden at
//! deploy time by `WORKER_RETRIES` (`super::retry_settings`), and written
//! into every task of the listener (asynq's `retry` and `timeout`).

use std::fmt;
use std::time::Duration;

use crate::outbox::relay::{MAX_RETRY, TASK_TIMEOUT};
use crate::queue::NewTask;

/// How many times a run may snooze before a snooze counts as a failure,
/// unless [`ListenerOptions::max_snoozes`](super::listeners::ListenerOptions::max_snoozes)
/// says otherwise.
pub(crate) const MAX_SNOOZES: u32 = 100;

/// How long a listener's task waits before each retry, from the number of
/// failed runs before it (0 before the first retry).
///
/// ```
/// use std::time::Duration;
/// use kit::worker::listeners::Backoff;
///
/// // Go asynq's (the default): about 15–45 s, then 1 min, 2 min, ...
/// let asynq = Backoff::asynq();
/// // 1 s, 2 s, 4 s, ... at most 5 min, each jittered down to half.
/// let exponential = Backoff::exponential(Duration::from_secs(1), Duration::from_secs(300));
/// assert!(exponential.delay(3) <= Duration::from_secs(8));
/// assert!(exponential.delay(3) >= Duration::from_secs(4));
/// // Always 10 s.
/// assert_eq!(Backoff::fixed(Duration::from_secs(10)).delay(7), Duration::from_secs(10));
/// # let _ = asynq;
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Backoff(Kind);

#[derive(Clone, Copy, Debug)]
enum Kind {
    Asynq,
    Exponential { base: Duration, max: Duration },
    Fixed(Duration),
    Custom(fn(u32) -> Duration),
}

impl Backoff {
    /// Go asynq's default (`DefaultRetryDelayFunc`, Sidekiq's formula):
    /// before retry n + 1, n failed runs so far, `n⁴ + 15 + rand(0..30)·(n + 1)`
    /// seconds; so between `n⁴ + 15` and `n⁴ + 15 + 29·(n + 1)` seconds:
    /// 15–44 s first, about 1 min, 2 min, ..., 4.5 days at n = 25.
    pub fn asynq() -> Self {
        Self(Kind::Asynq)
    }

    /// Exponential with jitter: before retry n + 1 (n failed runs so far),
    /// a delay drawn evenly between `d / 2` and `d`, both included, where
    /// `d = min(base · 2ⁿ, max)`. So the first retry waits between
    /// `base / 2` and `base`, and no retry waits longer than `max`.
    pub fn exponential(base: Duration, max: Duration) -> Self {
        Self(Kind::Exponential { base, max })
    }

    /// The same delay before every retry.
    pub fn fixed(delay: Duration) -> Self {
        Self(Kind::Fixed(delay))
    }

    /// The delay `delay(n)` before retry n + 1, n failed runs so far.
    /// `WORKER_RETRIES` cannot write it (its `Display` is `custom`).
    pub fn custom(delay: fn(u32) -> Duration) -> Self {
        Self(Kind::Custom(delay))
    }

    /// Whether it is Go asynq's: the consumer's own retry delay then
    /// applies (Go asynq's too, unless the consumer's options say).
    pub(crate) fn is_asynq(&self) -> bool {
        matches!(self.0, Kind::Asynq)
    }

    /// The delay before the retry that follows `retried` failed runs
    /// (0 before the first retry).
    pub fn delay(&self, retried: u32) -> Duration {
        match self.0 {
            Kind::Asynq => crate::queue::default_retry_delay(retried),
            Kind::Exponential { base, max } => {
                let full = 2u32
                    .checked_pow(retried)
                    .map_or(max, |factor| base.saturating_mul(factor))
                    .min(max);
                let half = full / 2;
                let spread = u64::try_from((full - half).as_nanos()).unwrap_or(u64::MAX);
                half + Duration::from_nanos(fastrand::u64(0..=spread))
            }
            Kind::Fixed(delay) => delay,
            Kind::Custom(delay) => delay(retried),
        }
    }
}

impl Default for Backoff {
    /// [`Backoff::asynq`].
    fn default() -> Self {
        Self::asynq()
    }
}

/// `asynq`, `fixed:10s`, `exponential:1s:5m` (the form `WORKER_RETRIES`
/// reads), or `custom`.
impl fmt::Display for Backoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Kind::Asynq => f.write_str("asynq"),
            Kind::Exponential { base, max } => write!(
                f,
                "exponential:{}:{}",
                DurationText(base),
                DurationText(max)
            ),
            Kind::Fixed(delay) => write!(f, "fixed:{}", DurationText(delay)),
            Kind::Custom(_) => f.write_str("custom"),
        }
    }
}

/// What a listener returns to be run again later without it counting as a
/// failure: `Err(Snooze::after(d).into())`, for a partner that said "try
/// again in 90 s" (HTTP 429 with `Retry-After`). It is recognised anywhere
/// in the error's chain (also under `anyhow`'s context).
///
/// The run spends no attempt: its task waits `d` in the queue's `scheduled`
/// set, holding no worker slot, and runs again with its retry count
/// unchanged and no backoff. An ordered listener's run keeps its key's
/// turn meanwhile, as a retry does. A task may snooze at most
/// [`ListenerOptions::max_snoozes`](super::listeners::ListenerOptions::max_snoozes)
/// times (100 unless said); a snooze past that counts as a failure: it
/// spends an attempt and waits the listener's backoff.
///
/// ```
/// use std::time::Duration;
/// use kit::worker::listeners::{ListenerContext, ListenerError, Snooze};
///
/// # #[derive(serde::Deserialize)]
/// # struct OrderPlaced;
/// async fn notify_partner(_: OrderPlaced, _: ListenerContext) -> Result<(), ListenerError> {
///     let retry_after: Option<Duration> = Some(Duration::from_secs(90)); // from a 429
///     if let Some(after) = retry_after {
///         return Err(Snooze::after(after).into());
///     }
///     Ok(())
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("snoozed for {}", DurationText(*.after))]
pub struct Snooze {
    after: Duration,
}

impl Snooze {
    /// Run the task again `after` from now.
    pub fn after(after: Duration) -> Self {
        Self { after }
    }

    /// How long the task waits.
    pub fn duration(&self) -> Duration {
        self.after
    }

    /// The snooze in `error`'s chain, if any.
    pub(crate) fn find(error: &anyhow::Error) -> Option<Self> {
        error
            .chain()
            .find_map(|cause| cause.downcast_ref::<Self>())
            .copied()
    }
}

/// One listener's retries, timeout, backoff and bound on snoozes. The
/// default is what every listener task had before listeners had their own:
/// 25 retries, a 30-minute timeout, Go asynq's backoff, and 100 snoozes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RetryPolicy {
    /// Retries after the first failed run; archived after that.
    pub(crate) retries: u32,
    /// The longest one run may take (whole seconds in the task, rounded
    /// up).
    pub(crate) timeout: Duration,
    /// The wait before each retry.
    pub(crate) backoff: Backoff,
    /// How many times a task may snooze before a snooze is a failure.
    pub(crate) max_snoozes: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            retries: MAX_RETRY,
            timeout: TASK_TIMEOUT,
            backoff: Backoff::asynq(),
            max_snoozes: MAX_SNOOZES,
        }
    }
}

impl RetryPolicy {
    /// `task` with the policy's retries and timeout (asynq's `retry` and
    /// `timeout`, which Go's Inspector and asynqmon show).
    pub(crate) fn apply(&self, task: NewTask) -> NewTask {
        task.max_retry(self.retries).timeout(self.timeout)
    }

    /// How long the worker lets one run take: the timeout as a task stores
    /// it, in whole seconds rounded up, at least 1 s.
    pub(crate) fn run_timeout(&self) -> Duration {
        let timeout = self.timeout;
        let seconds = timeout.as_secs() + u64::from(timeout.subsec_nanos() > 0);
        Duration::from_secs(seconds.max(1))
    }
}

/// `retries:25,timeout:30m,backoff:asynq`: the form of a `WORKER_RETRIES`
/// entry's right side.
impl fmt::Display for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "retries:{},timeout:{},backoff:{}",
            self.retries,
            DurationText(self.timeout),
            self.backoff
        )
    }
}

/// A duration as `WORKER_RETRIES` reads it: `500ms`, `30s`, `10m`, `1h`
/// (the largest unit that divides it), else as `humantime` writes it.
pub(crate) struct DurationText(pub(crate) Duration);

impl fmt::Display for DurationText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let duration = self.0;
        if !duration.subsec_nanos().is_multiple_of(1_000_000) {
            return write!(f, "{}", humantime::format_duration(duration));
        }
        let millis = duration.as_millis();
        match millis {
            0 => f.write_str("0s"),
            _ if millis.is_multiple_of(3_600_000) => write!(f, "{}h", millis / 3_600_000),
            _ if millis.is_multiple_of(60_000) => write!(f, "{}m", millis / 60_000),
            _ if millis.is_multiple_of(1000) => write!(f, "{}s", millis / 1000),
            _ => write!(f, "{millis}ms"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLES: u32 = 2000;

    #[test]
    fn exponential_delays_stay_within_half_and_all_of_the_capped_doubling() {
        let (base, max) = (Duration::from_millis(100), Duration::from_secs(5));
        let backoff = Backoff::exponential(base, max);
        for retried in 0..40 {
            let full = (base * 2u32.saturating_pow(retried.min(31))).min(max);
            let (mut least, mut most) = (Duration::MAX, Duration::ZERO);
            for _ in 0..SAMPLES {
                let delay = backoff.delay(retried);
                least = least.min(delay);
                most = most.max(delay);
            }
            assert!(
                least >= full / 2 && most <= full,
                "retry {retried}: delays {least:?}..{most:?} outside [{:?}, {full:?}]",
                full / 2
            );
            // Jittered: the samples spread over most of the range.
            assert!(
                most - least >= (full - full / 2) / 2,
                "retry {retried}: delays {least:?}..{most:?} barely jittered"
            );
        }
    }

    #[test]
    fn asynq_delays_stay_within_go_asynqs_bounds() {
        let backoff = Backoff::asynq();
        for retried in 0..26u32 {
            let n = u64::from(retried);
            let least = Duration::from_secs(n.pow(4) + 15);
            let most = Duration::from_secs(n.pow(4) + 15 + 29 * (n + 1));
            for _ in 0..SAMPLES / 10 {
                let delay = backoff.delay(retried);
                assert!(
                    (least..=most).contains(&delay),
                    "retry {retried}: {delay:?} outside [{least:?}, {most:?}]"
                );
            }
        }
    }

    #[test]
    fn fixed_and_custom_delays_are_what_they_say() {
        let fixed = Backoff::fixed(Duration::from_secs(10));
        let custom = Backoff::custom(|retried| Duration::from_secs(u64::from(retried) * 3));
        for retried in 0..30 {
            assert_eq!(fixed.delay(retried), Duration::from_secs(10));
            assert_eq!(
                custom.delay(retried),
                Duration::from_secs(u64::from(retried) * 3)
            );
        }
    }

    #[test]
    fn a_snooze_is_found_under_context() {
        let error = anyhow::Error::from(Snooze::after(Duration::from_millis(200)))
            .context("the partner said later");
        assert_eq!(
            Snooze::find(&error),
            Some(Snooze::after(Duration::from_millis(200)))
        );
        assert_eq!(Snooze::find(&anyhow::anyhow!("boom")), None);
    }

    #[test]
    fn the_default_policy_is_the_one_every_listener_had() {
        let policy = RetryPolicy::default();
        assert_eq!(
            (policy.retries, policy.timeout, policy.max_snoozes),
            (25, Duration::from_secs(1800), 100)
        );
        assert_eq!(policy.to_string(), "retries:25,timeout:30m,backoff:asynq");
    }

    #[test]
    fn a_runs_timeout_is_the_one_its_task_stores() {
        for (timeout, seconds) in [(1500, 2), (1000, 1), (0, 1), (7000, 7)] {
            let policy = RetryPolicy {
                timeout: Duration::from_millis(timeout),
                ..RetryPolicy::default()
            };
            let task = policy.apply(NewTask::new("listener:a:b", "id", Vec::new()));
            assert_eq!(policy.run_timeout(), Duration::from_secs(seconds));
            assert_eq!(task.to_message().unwrap().timeout, seconds as i64);
        }
    }
}
