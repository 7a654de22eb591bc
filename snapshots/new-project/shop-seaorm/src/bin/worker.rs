//! The worker: consumes queued tasks (event fan-out, listeners and
//! scheduled jobs), relays the outbox to the queue, runs the scheduler, and
//! cleans up published events.

use std::process::ExitCode;

use kit::scheduler::Schedules;
use kit::signals::shutdown_signal;
use kit::worker::{self, listeners::Listeners};

use shop::listeners::register as register_listeners;
use shop::schedules::register as register_schedules;
use shop::settings::Settings;

fn main() -> ExitCode {
    kit::binary::run("worker", async |settings: Settings| {
        let mut listeners = Listeners::new();
        register_listeners(&mut listeners);
        let mut schedules = Schedules::new();
        register_schedules(&mut schedules);
        worker::run(&settings.kit, listeners, schedules, shutdown_signal()).await
    })
}
