//! The configuration in the process: its `Debug` output never shows a
//! secret. (How the binaries report a configuration error is checked on
//! real processes in `binaries.rs`.)

const SECRET: &str = "hunter2";

#[test]
fn debug_output_hides_every_secret() {
    let mut config = crate::testing::config(&format!("postgres://app:{SECRET}@db:5432/app"));
    config.valkey.password = Some(SECRET.to_string().into());

    let shown = format!("{config:?}");

    assert!(!shown.contains(SECRET), "{shown}");
    assert!(shown.contains("postgres://app:***@db:5432/app"), "{shown}");

    // The `?password=` form that sqlx accepts too.
    let config = crate::testing::config(&format!("postgres://app@db:5432/app?password={SECRET}"));
    let shown = format!("{config:?}");
    assert!(!shown.contains(SECRET), "{shown}");
    assert!(shown.contains("password=***"), "{shown}");
}
