//! For tests, the service's (`tests/`) and the kit's: a configuration that
//! needs no environment. (`migrate::testing` brings a test database up to
//! date.)

use std::time::Duration;

use crate::config::{self, Config};

/// [`config()`] as the service's settings type `S` (its own `Settings`, which
/// nests the kit's configuration, or the kit's [`Config`] itself), inferred
/// from where it goes: `Application::build(&kit::testing::settings(url))`.
pub fn settings<S: From<Config>>(database_url: &str) -> S {
    S::from(config(database_url))
}

/// The configuration a test starts from, read from no environment:
/// `database_url`, the HTTP server and the metrics endpoint on free ports
/// (`127.0.0.1:0`), the relay's wake-ups off, and fixed values of a test's
/// size for the rest (5 connections, a 1 s relay poll).
///
/// # Panics
///
/// If `database_url` is not a Postgres URL.
pub fn config(database_url: &str) -> Config {
    Config {
        database: config::DatabaseConfig {
            url: database_url
                .parse()
                .expect("the test's DATABASE_URL is a Postgres URL"),
            max_connections: 5,
            connect_timeout: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(30),
        },
        http: config::HttpConfig {
            addr: "127.0.0.1:0".parse().unwrap(),
        },
        valkey: config::ValkeyConfig::default(),
        outbox: config::OutboxConfig {
            poll_interval: Duration::from_secs(1),
            batch_size: 100,
            retention: Duration::from_secs(168 * 3600),
            cleanup_interval: Duration::from_secs(3600),
            task_retention: Duration::from_secs(24 * 3600),
            #[cfg(feature = "worker")]
            wake: config::WakeMode::Off,
            #[cfg(feature = "worker")]
            queues: Default::default(),
        },
        #[cfg(feature = "worker")]
        worker: config::WorkerConfig {
            concurrency: 10,
            queues: "default=1".parse().unwrap(),
            shutdown_timeout: Duration::from_secs(30),
            metrics_addr: "127.0.0.1:0".parse().unwrap(),
            inbox_retention: Duration::from_secs(168 * 3600),
        },
        #[cfg(feature = "worker")]
        scheduler: config::SchedulerConfig {
            enabled: true,
            lease_ttl: Duration::from_secs(15),
        },
    }
}
