//! Limits on how fast and how wide a listener runs, across every worker
//! (replica) sharing the queue: at most N runs at once (`concurrency`) and
//! at most R runs started per period (`rate`, with a burst), each for the
//! whole listener or per partition (a string key of the event, such as a
//! tenant). This module owns the limits' state in Valkey, the scripts that
//! change it, the [`Limiter`] a listener's handler asks before it runs, the
//! `WORKER_LIMITS` override and the limits' metrics ([`LimitMetrics`]).
//!
//! # Waiting holds no worker slot, and no one polls
//!
//! A run that may not start yet (but for the last moments before a rate
//! turn, its rate's short wait, slept in the handler) is not slept on:
//! [`Limiter::acquire`] answers [`Acquired::Wait`] and the handler returns
//! `HandlerError::defer(until)`; the consumer moves the task from active to
//! `:scheduled` (no retry counted, its error and retry count unchanged) and
//! frees its worker slot at once. The task comes back when its turn comes,
//! woken, not polling:
//!
//! - **rate**: one script (GCRA on Valkey's clock, `TIME`, as a queue)
//!   gives every run a turn: now, or the first turn free, turns spaced by
//!   the rate's interval (`per / count`), bursts as the burst allows. A
//!   run whose turn is further off than the short wait is deferred to just
//!   before it, by its rate's wake lead (two intervals, within 15-90 ms;
//!   the consumer that deferred the task moves it back to pending then, to
//!   the millisecond, see `crate::queue::consumer`), so waiting runs wake
//!   one by one, never as a herd, and a loaded worker slow to run them
//!   still has them back before their turns. A run back at its turn
//!   (or whose turn is within the short wait) sleeps what is left of it in
//!   the handler and starts on the turn; one back more than a quarter of
//!   an interval late has lost its turn and takes a new one (the turn is
//!   wasted, never given twice). So starts are the turns, late by less than
//!   a quarter of an interval: no window of one period holds more than
//!   `count + burst` starts, with three quarters of an interval to spare
//!   for the start's own delay. The bound holds on Valkey's clock, whatever
//!   the workers' clocks say: they are only told how long to wait.
//! - **concurrency**: a slot is a member of a sorted set scored by its
//!   lease's expiry, taken and freed by scripts, the lease renewed while the
//!   run lives. A run that finds no slot joins the listener's waiters (a
//!   sorted set, oldest first); whoever frees a slot hands it to the oldest
//!   waiter and wakes its task ([`crate::queue::Client::promote`]), which
//!   finds its slot held for it when it runs. A waiter whose task is gone
//!   passes its turn on. In case the waker dies between the two steps, a
//!   waiter also wakes after one slot lease by itself.
//!
//! With both, the slot is taken first; a run the rate then makes wait
//! frees it at once, to the next waiter.
//!
//! A listener without limits pays nothing: no Valkey call.
//!
//! # Crashes
//!
//! A worker killed with SIGKILL holds its slots until their leases run out
//! ([`SLOT_LEASE`](limiter::SLOT_LEASE), 30 s; renewed every third of it
//! while runs live), then they free themselves; its waiting tasks sit in `:scheduled` and any
//! worker's forwarder moves them to pending when due (`forward_interval`
//! late at worst, 5 s by default); a task it was running is recovered as
//! any (and takes its slot back if its lease is still held). Rate limits
//! keep no state per run.
//!
//! # Go asynq
//!
//! To a Go asynq server sharing the queue, a deferred task is an ordinary
//! scheduled task: asynqmon shows it under Scheduled, and Go's forwarder
//! moves it to pending when due (its score is the due time in whole
//! seconds, rounded up). A Go worker that handles the listener's task
//! type runs it without asking the limits: its runs are not limited, nor
//! counted in them. The limits' keys (`limits:{<task type>}:...`) are
//! outside asynq's namespace.
//!
//! # Keys
//!
//! Per listener (its task type `listener:<event>:<name>`, the hash tag of
//! all its keys, so that a script's keys share a cluster slot) and
//! partition (`""` for none): `slots` and `slot_waiters` (sorted sets of
//! `["<queue>","<task id>"]`), `rate` (a hash: `tat`, the GCRA's
//! theoretical arrival time, one interval past the last turn given, in µs
//! of Valkey's clock), `rate_turns` (deferred runs by turn) and
//! `rate_since` (deferred runs by when they first waited). Every key
//! expires once idle.
//!
//! # Where it lives
//!
//! The worker wires it in: `worker::run` reads `WORKER_LIMITS`
//! ([`overrides_from_env`]), each listener with limits gets a [`Limiter`]
//! that its handler asks before every run, and [`LimitMetrics`] joins the
//! worker's metrics. [`settings`] reads the limits, [`limiter`] asks them,
//! [`scripts`] holds the Lua that changes their state in Valkey and
//! [`metrics`] counts what they made wait.

mod limiter;
mod metrics;
mod scripts;
mod settings;
#[cfg(test)]
mod tests;

pub(crate) use self::limiter::{Acquired, Limiter, Permit};
pub(crate) use self::metrics::LimitMetrics;
#[cfg(test)]
pub(crate) use self::metrics::{LimitKind, LimitLabels};
#[cfg(test)]
pub(crate) use self::scripts::scripts;
pub(crate) use self::settings::Limits;
#[cfg(test)]
pub(crate) use self::settings::parse_overrides;
pub use self::settings::{InvalidLimit, Rate};
pub(crate) use self::settings::{LimitOverrides, overrides_from_env};
