//! The listeners' tests: one module per listener, in one test binary, so
//! they build once. `gpkit add event <name> --listener <listener>` writes a
//! module and declares it between the markers below; declare your own
//! modules outside them. Each test gets a database of its own
//! (`kit::testing::TestDatabase`): see `kit/README.md`, "The testing kit".

// gpkit:begin modules
mod order_placed_audit;
mod order_placed_email;
// gpkit:end modules
