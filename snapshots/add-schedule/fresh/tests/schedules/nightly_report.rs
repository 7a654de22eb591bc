//! The test of the `nightly_report` schedule: one tick dispatches `reportDue`.
//!
//! `gpkit add schedule` wrote it with the schedule; it is yours to change.

use shop::events::report_due::ReportDue;
use shop::schedules::nightly_report;

#[tokio::test]
async fn nightly_report_dispatches_a_report_due() {
    let db = kit::testing::TestDatabase::new().await;
    let at = "2026-01-01T00:00:00Z".parse().expect("a tick's time");

    let new = kit::testing::dispatch_tick(db.pool(), nightly_report::Schedule, at)
        .await
        .expect("dispatch the tick's event");

    assert!(new, "the tick's event was in the outbox already");
    let outbox = db.dispatched().await;
    outbox.assert_dispatched::<ReportDue>(|_| true);
}
