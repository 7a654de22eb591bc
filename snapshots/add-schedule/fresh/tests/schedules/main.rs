//! The schedules' tests: one module per schedule, in one test binary, so
//! they build once. `gpkit add schedule <name>` writes a module and
//! declares it between the markers below; declare your own modules outside
//! them. Each test gets a database of its own
//! (`kit::testing::TestDatabase`): see `kit/README.md`, "The testing kit".

// gpkit:begin modules
mod heartbeat;
mod nightly_report;
// gpkit:end modules
