//! What the service's tests share: a migrated database per test, from the
//! testing kit (`kit::testing`), which has the rest; the README's "Tests"
//! shows its calls. (The kit's own tests are in `kit/tests/`; `cargo test
//! -p shop-kit --all-features` runs them.)

pub use kit::testing::TestDatabase;
