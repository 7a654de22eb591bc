//! The `nightly_report` schedule: dispatches `reportDue` on every tick.

use kit::scheduler;

use crate::events::report_due::ReportDue;

/// The schedule, registered in `super::register`.
pub struct Schedule;

impl scheduler::ScheduledEvent for Schedule {
    type Event = ReportDue;
    const NAME: &'static str = "nightly_report";
    /// When it ticks: 5 cron fields (6 with seconds first), @hourly,
    /// @daily, @weekly, @monthly, or `@every <duration>`.
    const CRON: &'static str = "30 2 * * *";
    /// The IANA time zone `CRON` is read in. On the day a local time is
    /// skipped it runs once at the next valid time; on the day it repeats,
    /// once.
    const TIME_ZONE: &'static str = "Europe/Paris";
    /// Missed ticks (no leader, downtime) a new leader enqueues: 0 skips them.
    const CATCH_UP: u32 = 0;

    /// The event of one tick. The scheduler dispatches it through the
    /// outbox with `tick.id` as its event id, once per tick.
    fn build(&self, _tick: &scheduler::Tick) -> Self::Event {
        ReportDue {
            day: Default::default(),
        }
    }
}
