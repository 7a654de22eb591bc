//! The limits' settings: a listener's [`Limits`] and [`Rate`] as the code
//! gives them and as `WORKER_LIMITS` reads and writes them, and the
//! override of every listener's limits at deploy time.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The environment variable that overrides listeners' limits at deploy
/// time (see [`parse_overrides`]).
const LIMITS_VAR: &str = "WORKER_LIMITS";
/// The least and the most a deferred run is woken before its rate turn
/// ([`Rate::wake_lead`]).
const WAKE_LEAD_RANGE: (Duration, Duration) =
    (Duration::from_millis(15), Duration::from_millis(90));
/// How much earlier than its rate's wake lead a run may be back and still
/// sleep until its turn rather than wait again ([`Rate::short_wait`]).
pub(super) const WAKE_MARGIN: Duration = Duration::from_millis(10);
/// The expected form of a `WORKER_LIMITS` entry, for errors.
const ENTRY_FORM: &str = "<event>.<listener>=concurrency:N,rate:N/s|N/m|N/h,burst:N \
     (any of the three, or `none`), entries separated by `;`, such as \
     orderPlaced.email=concurrency:5,rate:10/s,burst:10;orderPlaced.audit=rate:100/m";

/// The limits of one listener. [`Limits::default`] has none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Limits {
    /// At most this many runs at once, across every worker (per partition
    /// when the listener has one).
    pub(crate) concurrency: Option<u32>,
    /// At most this many runs started per period, across every worker (per
    /// partition when the listener has one).
    pub(crate) rate: Option<Rate>,
}

impl Limits {
    /// Whether there is no limit at all.
    pub(crate) fn is_none(&self) -> bool {
        self.concurrency.is_none() && self.rate.is_none()
    }
}

/// `concurrency:5,rate:10/s,burst:10`, or `none`: the form of a
/// `WORKER_LIMITS` entry's right side.
impl fmt::Display for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.concurrency, self.rate) {
            (None, None) => f.write_str("none"),
            (Some(n), None) => write!(f, "concurrency:{n}"),
            (None, Some(rate)) => write!(f, "rate:{rate}"),
            (Some(n), Some(rate)) => write!(f, "concurrency:{n},rate:{rate}"),
        }
    }
}

impl FromStr for Limits {
    type Err = InvalidLimit;

    /// `concurrency:N`, `rate:N/s|N/m|N/h`, `burst:N` (with a rate),
    /// separated by commas, any of them; or `none`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("none") {
            return Ok(Self::default());
        }
        if text.is_empty() {
            return Err(InvalidLimit(
                "names no limit (write `none` for a listener without limits)".into(),
            ));
        }
        let mut limits = Self::default();
        let mut burst = None;
        for setting in text.split(',').map(str::trim) {
            let Some((name, value)) = setting.split_once(':') else {
                return Err(InvalidLimit(format!(
                    "`{setting}` is not a limit: it needs a name and a value, \
                     such as concurrency:5, rate:10/s or burst:10"
                )));
            };
            let (name, value) = (name.trim(), value.trim());
            let duplicate = || InvalidLimit(format!("`{name}` is given twice"));
            match name {
                "concurrency" => {
                    if limits.concurrency.is_some() {
                        return Err(duplicate());
                    }
                    limits.concurrency = Some(positive(setting, value)?);
                }
                "rate" => {
                    if limits.rate.is_some() {
                        return Err(duplicate());
                    }
                    let (count, per) = parse_count_per(value)?;
                    limits.rate = Some(Rate::new(count, per));
                }
                "burst" => {
                    if burst.is_some() {
                        return Err(duplicate());
                    }
                    burst = Some(positive(setting, value)?);
                }
                _ => {
                    return Err(InvalidLimit(format!(
                        "`{name}` is not a limit; the limits are concurrency, rate and burst"
                    )));
                }
            }
        }
        match (burst, &mut limits.rate) {
            (Some(burst), Some(rate)) => rate.burst = burst,
            (Some(_), None) => {
                return Err(InvalidLimit(
                    "`burst` needs a rate, such as rate:10/s,burst:10".into(),
                ));
            }
            (None, _) => {}
        }
        Ok(limits)
    }
}

/// At most `count` runs started per `per`, `burst` of them at once after a
/// quiet spell (at least 1: then runs are spaced evenly, `per / count`
/// apart). No window of one period holds more than `count + burst` starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// Runs per period.
    pub count: u32,
    /// The period.
    pub per: Duration,
    /// How many runs may start at once after a quiet spell; 1 spaces them
    /// evenly.
    pub burst: u32,
}

impl Rate {
    /// `count` runs per `per`, evenly spaced (a burst of 1).
    pub fn new(count: u32, per: Duration) -> Self {
        Self {
            count,
            per,
            burst: 1,
        }
    }

    /// `count` runs per second.
    pub fn per_second(count: u32) -> Self {
        Self::new(count, Duration::from_secs(1))
    }

    /// `count` runs per minute.
    pub fn per_minute(count: u32) -> Self {
        Self::new(count, Duration::from_secs(60))
    }

    /// `count` runs per hour.
    pub fn per_hour(count: u32) -> Self {
        Self::new(count, Duration::from_secs(3600))
    }

    /// The same rate with a burst of `burst` runs at once.
    pub fn with_burst(self, burst: u32) -> Self {
        Self { burst, ..self }
    }

    /// `10/s`, `100/m`, `5000/h` (or `N/<duration>`, such as `10/5s`),
    /// optionally with a burst: `10/s,burst:20`. The form [`Rate`]'s
    /// `Display` writes.
    pub fn parse(text: &str) -> Result<Self, InvalidLimit> {
        let (rate, burst) = match text.split_once(',') {
            Some((rate, burst)) => (rate, Some(burst.trim())),
            None => (text, None),
        };
        let (count, per) = parse_count_per(rate.trim())?;
        let mut rate = Self::new(count, per);
        if let Some(burst) = burst {
            let value = burst.strip_prefix("burst:").ok_or_else(|| {
                InvalidLimit(format!(
                    "`{burst}` is not a burst; expected a rate such as 10/s, \
                     optionally with a burst: 10/s,burst:20"
                ))
            })?;
            rate.burst = positive(burst, value.trim())?;
        }
        Ok(rate)
    }

    /// The time between two runs at the steady rate, in µs.
    pub(super) fn interval_micros(&self) -> f64 {
        self.per.as_secs_f64() * 1e6 / f64::from(self.count.max(1))
    }

    /// How far ahead of the steady rate a burst may run, in µs.
    pub(super) fn tolerance_micros(&self) -> f64 {
        self.interval_micros() * f64::from(self.burst.max(1) - 1)
    }

    /// How long before its turn a deferred run is woken: two intervals,
    /// within [`WAKE_LEAD_RANGE`]. A run late back by more than the lead
    /// and a quarter of an interval loses its turn, and a worker starved of
    /// CPU wakes runs late by tens of milliseconds (15 ms ahead, a 20/s
    /// limit ran at 6/s on a loaded machine, scripts/bench/README.md); a
    /// woken run sleeps the lead in its handler, holding its worker slot, so
    /// about two runs of a listener sleep at once (fewer below 22/s, where
    /// the lead is its most; more above 133/s, where it is its least).
    pub(super) fn wake_lead(&self) -> Duration {
        let (least, most) = WAKE_LEAD_RANGE;
        Duration::from_secs_f64(2.0 * self.interval_micros() / 1e6).clamp(least, most)
    }

    /// How far off a turn may be for its run to sleep until it in the
    /// handler rather than be deferred: the wake lead and a margin, so that
    /// a woken run finds its turn within it. A deferral and its wake-up
    /// cost about as much as such a sleep.
    pub(super) fn short_wait(&self) -> Duration {
        self.wake_lead() + WAKE_MARGIN
    }

    /// How late a run may come back for its turn and still have it, in µs:
    /// a quarter of an interval. No period holds more than `count + burst`
    /// turns taken late by less than one interval; the rest of the
    /// interval is a margin for the delay between the grant and the start.
    pub(super) fn grace_micros(&self) -> f64 {
        self.interval_micros() / 4.0
    }
}

impl FromStr for Rate {
    type Err = InvalidLimit;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

/// `10/s`, `100/m`, `5000/h`, `10/5s`; `,burst:N` after it unless the
/// burst is 1.
impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/", self.count)?;
        match self.per.as_secs() {
            1 | 60 | 3600 if self.per.subsec_nanos() == 0 => {
                f.write_str(match self.per.as_secs() {
                    1 => "s",
                    60 => "m",
                    _ => "h",
                })?;
            }
            _ => write!(f, "{}", humantime::format_duration(self.per))?,
        }
        if self.burst != 1 {
            write!(f, ",burst:{}", self.burst)?;
        }
        Ok(())
    }
}

/// `N/s`, `N/m`, `N/h` or `N/<duration>`: a count of at least 1 per a
/// period longer than zero.
fn parse_count_per(text: &str) -> Result<(u32, Duration), InvalidLimit> {
    let expected = "expected N/s, N/m or N/h (or N/<duration>, such as 10/5s)";
    let Some((count, unit)) = text.split_once('/') else {
        return Err(InvalidLimit(format!("`{text}` is not a rate; {expected}")));
    };
    let count = positive(text, count.trim())?;
    let unit = unit.trim();
    let per = match unit {
        "s" => Duration::from_secs(1),
        "m" => Duration::from_secs(60),
        "h" => Duration::from_secs(3600),
        _ => humantime::parse_duration(unit)
            .map_err(|_| InvalidLimit(format!("`{text}`: `{unit}` is not a period; {expected}")))?,
    };
    if per.is_zero() {
        return Err(InvalidLimit(format!(
            "`{text}`: the period must be longer than zero"
        )));
    }
    Ok((count, per))
}

/// A whole number of at least 1, the value of `setting`.
fn positive(setting: &str, value: &str) -> Result<u32, InvalidLimit> {
    match value.parse::<u32>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(InvalidLimit(format!(
            "`{setting}`: `{value}` is not a whole number of at least 1"
        ))),
    }
}

/// Why a limit's text does not read: what is wrong and the form expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidLimit(String);

/// A `WORKER_LIMITS` entry that does not read: which, why, and the form
/// expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{LIMITS_VAR}: the entry `{entry}` {problem}; expected {ENTRY_FORM}")]
pub(crate) struct LimitsError {
    /// The entry as written.
    pub(crate) entry: String,
    /// What is wrong with it.
    pub(crate) problem: String,
}

/// The limits of listeners by (event, listener), as `WORKER_LIMITS` sets
/// them.
pub(crate) type LimitOverrides = BTreeMap<(String, String), Limits>;

/// Reads `WORKER_LIMITS`: entries separated by `;`, each
/// `<event>.<listener>=<limits>`, the limits as [`Limits`] reads them
/// (`concurrency:N`, `rate:N/s|N/m|N/h`, `burst:N`, comma-separated, or
/// `none`), such as
/// `orderPlaced.email=concurrency:5,rate:10/s,burst:10;orderPlaced.audit=rate:100/m`.
/// An entry replaces every limit the code gives its listener: what it does
/// not name, the listener does not have. Blank entries are ignored; a
/// listener named twice is an error.
pub(crate) fn parse_overrides(text: &str) -> Result<LimitOverrides, LimitsError> {
    let mut overrides = LimitOverrides::new();
    for entry in text.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let error = |problem: String| LimitsError {
            entry: entry.to_string(),
            problem,
        };
        let Some((name, limits)) = entry.split_once('=') else {
            return Err(error(
                "has no `=` between the listener and its limits".into(),
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
        let limits: Limits = limits.parse().map_err(|err: InvalidLimit| error(err.0))?;
        let key = (event.trim().to_string(), listener.trim().to_string());
        if overrides.insert(key, limits).is_some() {
            return Err(error(format!("names `{name}` again")));
        }
    }
    Ok(overrides)
}

/// [`parse_overrides`] of `WORKER_LIMITS`; none when it is unset or blank.
pub(crate) fn overrides_from_env() -> Result<LimitOverrides, LimitsError> {
    match std::env::var(LIMITS_VAR) {
        Ok(text) => parse_overrides(&text),
        Err(_) => Ok(LimitOverrides::new()),
    }
}
