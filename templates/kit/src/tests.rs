//! The kit's tests against real servers (Postgres at `DATABASE_URL`, Valkey
//! at `VALKEY_ADDR`), inside the crate so that they can reach the internals a
//! service never names (the queue's wire format, the migrator, the relay).
//! `cargo test -p <kit> --all-features --lib` runs them in one binary. The
//! binaries' test program, which runs as the binaries, is `tests/binaries.rs`.

mod cancel;
mod config;
mod database;
mod inbox;
mod later;
mod limits;
mod migrate;
mod ordering;
mod ordering_held;
mod ordering_losses;
mod ordering_neighbours;
mod ordering_protocol;
mod ordering_scenarios;
mod ordering_stall;
mod ordering_upgrade;
mod outbox;
mod outbox_seaorm;
mod queue;
mod relay;
mod relay_seaorm;
mod retries;
mod scheduler;
mod script_keys;
mod support;
mod testing;
mod unique;
