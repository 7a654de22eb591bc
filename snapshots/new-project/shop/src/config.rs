//! Typed configuration, loaded from the environment.
//!
//! [`Config`] is composed of one section per concern; each field names its
//! environment variable and default. A missing or malformed value is an
//! error that names the variable, the value and the expected form. Secrets
//! (the database password, the Valkey password) never appear in `Debug`
//! output or in errors.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use confique::Config as _;
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Deserializer};
use sqlx::postgres::PgConnectOptions;

use crate::queue::{QueueNames, QueueWeights};

/// The whole service configuration.
#[derive(Debug, confique::Config)]
pub struct Config {
    #[config(nested)]
    pub database: DatabaseConfig,
    #[config(nested)]
    pub http: HttpConfig,
    #[config(nested)]
    pub valkey: ValkeyConfig,
    #[config(nested)]
    pub outbox: OutboxConfig,
    #[config(nested)]
    pub worker: WorkerConfig,
}

/// Postgres.
#[derive(Debug, confique::Config)]
pub struct DatabaseConfig {
    /// Postgres connection URL, such as postgres://user:password@localhost:5432/app
    #[config(env = "DATABASE_URL")]
    pub url: DatabaseUrl,
    /// Maximum number of pooled connections
    #[config(env = "DATABASE_MAX_CONNECTIONS", default = 10)]
    pub max_connections: u32,
    /// How long to wait for a connection to Postgres (a new one, or one from the pool)
    #[config(env = "DATABASE_CONNECT_TIMEOUT", default = "5s", deserialize_with = duration::deserialize)]
    pub connect_timeout: Duration,
    /// How long one SQL statement may run before Postgres cancels it; 0 for no limit
    #[config(env = "DATABASE_STATEMENT_TIMEOUT", default = "30s", deserialize_with = duration::deserialize)]
    pub statement_timeout: Duration,
}

/// The HTTP server.
#[derive(Debug, confique::Config)]
pub struct HttpConfig {
    /// Address to listen on, such as 0.0.0.0:8080
    #[config(env = "HTTP_ADDR", default = "0.0.0.0:8080")]
    pub addr: SocketAddr,
}

/// Valkey (or Redis), where events are queued.
#[derive(Debug, confique::Config)]
pub struct ValkeyConfig {
    /// host:port of the Valkey server
    #[config(env = "VALKEY_ADDR", default = "localhost:6379")]
    pub addr: String,
    /// Password, if the server requires one
    #[config(env = "VALKEY_PASSWORD")]
    pub password: Option<SecretString>,
    /// Logical database number
    #[config(env = "VALKEY_DB", default = 0)]
    pub db: u32,
}

/// The outbox relay and its housekeeping.
#[derive(Debug, confique::Config)]
pub struct OutboxConfig {
    /// How often the relay looks for unpublished events when idle
    #[config(env = "OUTBOX_POLL_INTERVAL", default = "1s", deserialize_with = duration::deserialize)]
    pub poll_interval: Duration,
    /// How many events the relay claims per round
    #[config(env = "OUTBOX_BATCH_SIZE", default = 100)]
    pub batch_size: u32,
    /// How long published events stay in the outbox table
    #[config(env = "OUTBOX_RETENTION", default = "168h", deserialize_with = duration::deserialize)]
    pub retention: Duration,
    /// How often published events past the retention are deleted
    #[config(env = "OUTBOX_CLEANUP_INTERVAL", default = "1h", deserialize_with = duration::deserialize)]
    pub cleanup_interval: Duration,
    /// How long a delivered task id keeps deduplicating in the queue
    #[config(env = "OUTBOX_TASK_RETENTION", default = "24h", deserialize_with = duration::deserialize)]
    pub task_retention: Duration,
    /// Wake the workers' relays right after a commit: off or valkey
    #[config(env = "OUTBOX_WAKE", default = "off", deserialize_with = from_str::deserialize)]
    pub wake: WakeMode,
    /// Queues every event is published to, such as default or shop,billing
    #[config(env = "OUTBOX_QUEUES", default = "default", deserialize_with = from_str::deserialize)]
    pub queues: QueueNames,
}

/// How a commit that stored events reaches the relays of other processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeMode {
    /// Relays find events at their next poll (`OUTBOX_POLL_INTERVAL`).
    Off,
    /// Each commit publishes a wake-up on Valkey; relays wake at once.
    Valkey,
}

impl FromStr for WakeMode {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        match raw.trim() {
            "off" => Ok(Self::Off),
            "valkey" => Ok(Self::Valkey),
            _ => Err("expected off or valkey".to_string()),
        }
    }
}

/// The worker process: task consumption and its metrics endpoint.
#[derive(Debug, confique::Config)]
pub struct WorkerConfig {
    /// How many tasks run at once
    #[config(env = "WORKER_CONCURRENCY", default = 10)]
    pub concurrency: usize,
    /// Queues to consume and their weights, such as default=1 or critical=6,default=3
    #[config(env = "WORKER_QUEUES", default = "default=1", deserialize_with = from_str::deserialize)]
    pub queues: QueueWeights,
    /// How long running tasks may take to finish at shutdown
    #[config(env = "WORKER_SHUTDOWN_TIMEOUT", default = "30s", deserialize_with = duration::deserialize)]
    pub shutdown_timeout: Duration,
    /// Address of the worker's metrics endpoint, such as 0.0.0.0:9090
    #[config(env = "WORKER_METRICS_ADDR", default = "0.0.0.0:9090")]
    pub metrics_addr: SocketAddr,
    /// How long the inbox remembers that a listener handled an event
    #[config(env = "INBOX_RETENTION", default = "168h", deserialize_with = duration::deserialize)]
    pub inbox_retention: Duration,
}

/// Why the configuration could not be loaded. The message names the
/// variable and what it expects, and never contains a secret.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(String);

impl Config {
    /// Loads the configuration from the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::builder()
            .env()
            .load()
            .map_err(|err| ConfigError(explain(&err.to_string())))
    }
}

/// confique reports a missing value by its field path (`database.url`);
/// users know it by its variable, so name that and what it should hold.
fn explain(message: &str) -> String {
    let missing = message
        .strip_prefix("required configuration value is missing: '")
        .and_then(|rest| rest.strip_suffix('\''));
    match missing.and_then(|path| leaf(&Config::META, path)) {
        Some((env, doc)) => format!("{env} is not set; expected {}", doc.trim()),
        None => message.to_string(),
    }
}

/// The environment variable and doc line of the field at `path`.
fn leaf(meta: &confique::meta::Meta, path: &str) -> Option<(&'static str, &'static str)> {
    let (head, rest) = match path.split_once('.') {
        Some((head, rest)) => (head, Some(rest)),
        None => (path, None),
    };
    let field = meta.fields.iter().find(|f| f.name == head)?;
    match (&field.kind, rest) {
        (confique::meta::FieldKind::Nested { meta }, Some(rest)) => leaf(meta, rest),
        (confique::meta::FieldKind::Leaf { env: Some(env), .. }, None) => {
            Some((env, field.doc.first().copied().unwrap_or("a value")))
        }
        _ => None,
    }
}

/// The Postgres URL. Its `Debug` form hides the password.
#[derive(Clone)]
pub struct DatabaseUrl(SecretString);

impl DatabaseUrl {
    /// Connection options for sqlx; the only place the URL is parsed for use.
    pub fn connect_options(&self) -> PgConnectOptions {
        PgConnectOptions::from_str(self.0.expose_secret())
            .expect("DATABASE_URL was validated when the configuration was loaded")
    }

    /// The URL with every credential replaced by `***`, for logs: the
    /// password of `user:password@` and query parameters such as
    /// `?password=` or `?sslpassword=`.
    pub fn redacted(&self) -> String {
        redact_url(self.0.expose_secret())
    }
}

/// `raw` with its credentials masked; `<invalid url>` when it is not a URL.
pub fn redact_url(raw: &str) -> String {
    let Ok(mut url) = url::Url::parse(raw) else {
        return "<invalid url>".to_string();
    };
    if url.password().is_some() {
        let _ = url.set_password(Some("***"));
    }
    let is_secret = |key: &str| key.to_ascii_lowercase().contains("password");
    if url.query_pairs().any(|(key, _)| is_secret(&key)) {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(key, value)| {
                let value = if is_secret(&key) {
                    "***".to_string()
                } else {
                    value.into_owned()
                };
                (key.into_owned(), value)
            })
            .collect();
        url.query_pairs_mut().clear().extend_pairs(pairs);
    }
    url.to_string()
}

impl FromStr for DatabaseUrl {
    type Err = String;

    /// Accepts what sqlx accepts. The error never repeats the URL, which may
    /// hold a password.
    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let url = url::Url::parse(raw).map_err(|err| {
            format!("not a valid URL ({err}); expected postgres://user:password@host:5432/database")
        })?;
        if !matches!(url.scheme(), "postgres" | "postgresql") {
            return Err(format!(
                "the scheme is `{}`; expected postgres://user:password@host:5432/database",
                url.scheme()
            ));
        }
        // sqlx logs an unknown parameter with its value: refuse a secret one.
        if let Some((key, _)) = url.query_pairs().find(|(key, _)| {
            key.to_ascii_lowercase().contains("password") && key.as_ref() != "password"
        }) {
            return Err(format!(
                "the parameter `{key}` is not one sqlx uses; give the password as \
                 postgres://user:password@host/database or ?password="
            ));
        }
        PgConnectOptions::from_str(raw).map_err(|_| {
            "sqlx cannot use this URL; expected postgres://user:password@host:5432/database"
                .to_string()
        })?;
        Ok(Self(SecretString::from(raw)))
    }
}

impl<'de> Deserialize<'de> for DatabaseUrl {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        raw.parse().map_err(serde::de::Error::custom)
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("DatabaseUrl")
            .field(&self.redacted())
            .finish()
    }
}

/// Durations in the humantime form: `500ms`, `1s`, `5m`, `1h30m`, `168h`.
pub mod duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let raw = String::deserialize(deserializer)?;
        humantime::parse_duration(&raw).map_err(|err| {
            serde::de::Error::custom(format!(
                "`{raw}` is not a duration ({err}); expected a number with a unit, such as 500ms, 1s, 5m or 168h"
            ))
        })
    }
}

/// Values that parse with `FromStr`, such as `WORKER_QUEUES`.
pub mod from_str {
    use std::fmt::Display;
    use std::str::FromStr;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D, T>(deserializer: D) -> Result<T, D::Error>
    where
        D: Deserializer<'de>,
        T: FromStr,
        T::Err: Display,
    {
        let raw = String::deserialize(deserializer)?;
        raw.parse()
            .map_err(|err| serde::de::Error::custom(format!("`{raw}`: {err}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_debug_form_of_a_database_url_hides_the_password() {
        let url: DatabaseUrl = "postgres://app:hunter2@db:5432/shop".parse().unwrap();
        let shown = format!("{url:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("postgres://app:***@db:5432/shop"), "{shown}");
    }

    #[test]
    fn every_form_of_password_in_a_url_is_masked() {
        for raw in [
            "postgres://app:hunter2@db:5432/shop",
            "postgres://app@db:5432/shop?password=hunter2",
            "postgres://app@db/shop?sslmode=require&password=hunter2&application_name=x",
        ] {
            let url: DatabaseUrl = raw.parse().unwrap();
            for shown in [url.redacted(), format!("{url:?}")] {
                assert!(!shown.contains("hunter2"), "{raw}: {shown}");
                assert!(shown.contains("***"), "{raw}: {shown}");
            }
        }
        let url: DatabaseUrl = "postgres://app@db/shop?application_name=x".parse().unwrap();
        assert_eq!(url.redacted(), "postgres://app@db/shop?application_name=x");
        // sqlx would log an unknown parameter's value as a warning.
        let err = "postgres://app@db/shop?sslpassword=hunter2"
            .parse::<DatabaseUrl>()
            .unwrap_err();
        assert!(
            err.contains("`sslpassword`") && !err.contains("hunter2"),
            "{err}"
        );
    }

    #[test]
    fn a_bad_database_url_is_explained_without_repeating_it() {
        let err = "mysql://app:hunter2@db/shop"
            .parse::<DatabaseUrl>()
            .unwrap_err();
        assert!(err.contains("scheme is `mysql`"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn missing_values_are_named_by_their_variable() {
        let message = explain("required configuration value is missing: 'database.url'");
        assert!(message.starts_with("DATABASE_URL is not set; expected Postgres connection URL"));
    }
}
