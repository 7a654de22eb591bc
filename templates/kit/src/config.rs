//! Typed configuration, loaded from the environment.
//!
//! [`Config`] is composed of one section per concern; each field names its
//! environment variable and default. A missing or malformed value is an
//! error that names the variable, the value and the expected form. Secrets
//! (the database password, the Valkey password) never appear in `Debug`
//! output or in errors.
//!
//! The service's own configuration type nests [`Config`] beside settings of
//! its own and is loaded with [`load`], so that adding a setting never
//! touches the kit. Queue names (`QueueNames`, `QueueWeights`, feature
//! `worker`) are settings too, and live here for the queue to use.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Deserializer};
use sqlx::postgres::PgConnectOptions;

#[cfg(feature = "worker")]
mod queue_names;
#[cfg(feature = "worker")]
mod queue_weights;

#[cfg(feature = "worker")]
pub(crate) use queue_names::DEFAULT_QUEUE;
#[cfg(feature = "worker")]
pub use queue_names::QueueNames;
#[cfg(feature = "worker")]
pub use queue_weights::QueueWeights;

/// The whole service configuration.
#[derive(Debug, confique::Config)]
pub struct Config {
    /// The Postgres connection (`DATABASE_*`).
    #[config(nested)]
    pub database: DatabaseConfig,
    /// The HTTP server (`HTTP_*`).
    #[config(nested)]
    pub http: HttpConfig,
    /// Valkey, the queue's store (`VALKEY_*`).
    #[config(nested)]
    pub valkey: ValkeyConfig,
    /// The outbox and its relay (`OUTBOX_*`).
    #[config(nested)]
    pub outbox: OutboxConfig,
    /// The worker: listeners, inbox and metrics (`WORKER_*`, `INBOX_RETENTION`).
    #[cfg(feature = "worker")]
    #[config(nested)]
    pub worker: WorkerConfig,
    /// The scheduler (`SCHEDULER_*`).
    #[cfg(feature = "worker")]
    #[config(nested)]
    pub scheduler: SchedulerConfig,
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

/// Valkey (or Redis), where events are queued, in one of four forms:
/// `VALKEY_ADDR` (with `VALKEY_USERNAME`, `VALKEY_PASSWORD`, `VALKEY_DB`),
/// `VALKEY_URL`, a Sentinel group (`VALKEY_SENTINEL_ADDRS` and
/// `VALKEY_SENTINEL_MASTER`), or a cluster (`VALKEY_CLUSTER_ADDRS`).
/// Setting two forms is an error naming both.
#[derive(Debug, Default, confique::Config)]
#[config(validate = Self::validate)]
pub struct ValkeyConfig {
    /// host:port of the Valkey server (default localhost:6379)
    #[config(env = "VALKEY_ADDR")]
    pub addr: Option<String>,
    /// ACL user, if the server has users (default: the `default` user)
    #[config(env = "VALKEY_USERNAME")]
    pub username: Option<String>,
    /// Password, if the server requires one
    #[config(env = "VALKEY_PASSWORD")]
    pub password: Option<SecretString>,
    /// Logical database number (default 0)
    #[config(env = "VALKEY_DB")]
    pub db: Option<u32>,
    /// Connection URL instead of VALKEY_ADDR, such as rediss://user:password@host:6380/0
    #[config(env = "VALKEY_URL")]
    pub url: Option<ValkeyUrl>,
    /// TLS to VALKEY_ADDR, the sentinels and their master, or the cluster's nodes (default false)
    #[config(env = "VALKEY_TLS")]
    pub tls: Option<bool>,
    /// PEM file of the CA that signs the server's TLS certificate (default: the public web roots)
    #[config(env = "VALKEY_CA_CERT")]
    pub ca_cert: Option<PathBuf>,
    /// Sentinels to ask for the master, such as sentinel-1:26379,sentinel-2:26379
    #[config(env = "VALKEY_SENTINEL_ADDRS")]
    pub sentinel_addrs: Option<AddrList>,
    /// Name of the master the sentinels monitor, such as mymaster
    #[config(env = "VALKEY_SENTINEL_MASTER")]
    pub sentinel_master: Option<String>,
    /// ACL user on the sentinels, if they have users
    #[config(env = "VALKEY_SENTINEL_USERNAME")]
    pub sentinel_username: Option<String>,
    /// Password of the sentinels, if they require one
    #[config(env = "VALKEY_SENTINEL_PASSWORD")]
    pub sentinel_password: Option<SecretString>,
    /// Valkey Cluster: some of its nodes, such as node-1:6379,node-2:6379
    #[config(env = "VALKEY_CLUSTER_ADDRS")]
    pub cluster_addrs: Option<AddrList>,
    /// How long to wait for a connection to Valkey (default 5s)
    #[config(env = "VALKEY_CONNECT_TIMEOUT", deserialize_with = duration::deserialize)]
    pub connect_timeout: Option<Duration>,
    /// How long to wait for Valkey's answer to one command (default 10s)
    #[config(env = "VALKEY_RESPONSE_TIMEOUT", deserialize_with = duration::deserialize)]
    pub response_timeout: Option<Duration>,
}

impl ValkeyConfig {
    /// One form at a time, each complete; a CA only where TLS is on.
    fn validate(&self) -> Result<(), String> {
        let url = self.url.is_some().then_some("VALKEY_URL");
        let addr = [
            ("VALKEY_ADDR", given(&self.addr)),
            ("VALKEY_USERNAME", given(&self.username)),
            ("VALKEY_PASSWORD", self.password.is_some()),
            ("VALKEY_DB", self.db.is_some()),
        ]
        .into_iter()
        .find_map(|(name, set)| set.then_some(name));
        let sentinel = self.sentinel_addrs.is_some() || given(&self.sentinel_master);
        let sentinel_credentials =
            given(&self.sentinel_username) || self.sentinel_password.is_some();
        if let (Some(url), Some(addr)) = (url, addr) {
            return Err(format!(
                "{url} and {addr} are both set; use either VALKEY_URL alone or VALKEY_ADDR \
                 with VALKEY_USERNAME, VALKEY_PASSWORD and VALKEY_DB"
            ));
        }
        if let (true, Some(other)) = (sentinel, url.or(given(&self.addr).then_some("VALKEY_ADDR")))
        {
            return Err(format!(
                "VALKEY_SENTINEL_ADDRS and {other} are both set; with Sentinel the sentinels \
                 name the server: unset {other}"
            ));
        }
        if self.cluster_addrs.is_some() {
            let other = [
                ("VALKEY_URL", self.url.is_some()),
                ("VALKEY_ADDR", given(&self.addr)),
                ("VALKEY_SENTINEL_ADDRS", sentinel),
                ("VALKEY_DB", self.db.is_some_and(|db| db != 0)),
            ]
            .into_iter()
            .find_map(|(name, set)| set.then_some(name));
            if let Some(other) = other {
                return Err(format!(
                    "VALKEY_CLUSTER_ADDRS and {other} are both set; a cluster is named by \
                     VALKEY_CLUSTER_ADDRS alone (with VALKEY_USERNAME and VALKEY_PASSWORD), \
                     and has database 0 only"
                ));
            }
        }
        if sentinel && self.sentinel_addrs.is_none() {
            return Err(String::from(
                "VALKEY_SENTINEL_MASTER is set but VALKEY_SENTINEL_ADDRS is not; expected the \
                 sentinels' addresses, such as sentinel-1:26379,sentinel-2:26379",
            ));
        }
        if sentinel && !given(&self.sentinel_master) {
            return Err(String::from(
                "VALKEY_SENTINEL_ADDRS is set but VALKEY_SENTINEL_MASTER is not; expected the \
                 name of the master the sentinels monitor",
            ));
        }
        if sentinel_credentials && !sentinel {
            return Err(String::from(
                "VALKEY_SENTINEL_USERNAME or VALKEY_SENTINEL_PASSWORD is set without \
                 VALKEY_SENTINEL_ADDRS",
            ));
        }
        if self.tls.is_some() && url.is_some() {
            return Err(String::from(
                "VALKEY_TLS and VALKEY_URL are both set; with VALKEY_URL the scheme says \
                 whether TLS is on: use rediss:// or valkeys:// and unset VALKEY_TLS",
            ));
        }
        if self.ca_cert.is_some() && !self.is_tls() {
            return Err(String::from(
                "VALKEY_CA_CERT is set but TLS is off; expected VALKEY_TLS=true, or VALKEY_URL \
                 with rediss:// or valkeys://",
            ));
        }
        Ok(())
    }

    /// `VALKEY_CONNECT_TIMEOUT`, 5 s unless set.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout.unwrap_or(Duration::from_secs(5))
    }

    /// `VALKEY_RESPONSE_TIMEOUT`, 10 s unless set.
    pub fn response_timeout(&self) -> Duration {
        self.response_timeout.unwrap_or(Duration::from_secs(10))
    }

    /// Whether connections use TLS: `VALKEY_URL`'s scheme, or `VALKEY_TLS`
    /// for the other forms.
    pub(crate) fn is_tls(&self) -> bool {
        match &self.url {
            Some(url) => url.is_tls(),
            None => self.tls.unwrap_or(false),
        }
    }
}

/// Whether an optional setting holds something (an empty variable is unset).
fn given(value: &Option<String>) -> bool {
    value
        .as_deref()
        .is_some_and(|value| !value.trim().is_empty())
}

/// `VALKEY_URL`: `redis://`, `rediss://` (TLS), `valkey://` or `valkeys://`
/// (TLS), with an optional user, password and database. Its `Debug` form
/// hides the password.
#[derive(Clone)]
pub struct ValkeyUrl(SecretString);

impl ValkeyUrl {
    /// The URL, password included, for the connection only.
    pub(crate) fn expose(&self) -> &str {
        self.0.expose_secret()
    }

    /// Whether the scheme asks for TLS.
    pub(crate) fn is_tls(&self) -> bool {
        self.expose().starts_with("rediss://") || self.expose().starts_with("valkeys://")
    }

    /// The URL with its password replaced by `***`, for logs and errors.
    pub fn redacted(&self) -> String {
        redact_url(self.expose())
    }
}

impl FromStr for ValkeyUrl {
    type Err = String;

    /// The error never repeats the URL, which may hold a password.
    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        const EXPECTED: &str = "expected redis://, rediss:// (TLS), valkey:// or valkeys:// (TLS), \
                                such as rediss://user:password@host:6380/0";
        let url =
            url::Url::parse(raw).map_err(|err| format!("not a valid URL ({err}); {EXPECTED}"))?;
        if !matches!(url.scheme(), "redis" | "rediss" | "valkey" | "valkeys") {
            return Err(format!("the scheme is `{}`; {EXPECTED}", url.scheme()));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(format!("the URL names no host; {EXPECTED}"));
        }
        let path = url.path().trim_matches('/');
        if !path.is_empty() && path.parse::<u32>().is_err() {
            return Err(format!(
                "the path `/{path}` is not a database number; {EXPECTED}"
            ));
        }
        if url.fragment().is_some() || url.query().is_some() {
            return Err(format!(
                "the URL has a query or a fragment (such as #insecure), which this service \
                 does not use; {EXPECTED}"
            ));
        }
        Ok(Self(SecretString::from(raw)))
    }
}

impl<'de> Deserialize<'de> for ValkeyUrl {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        raw.parse().map_err(serde::de::Error::custom)
    }
}

impl fmt::Debug for ValkeyUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ValkeyUrl").field(&self.redacted()).finish()
    }
}

/// A comma-separated list of `host:port` addresses, such as
/// `VALKEY_SENTINEL_ADDRS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddrList(pub Vec<String>);

impl FromStr for AddrList {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let addrs: Vec<String> = raw
            .split(',')
            .map(str::trim)
            .filter(|addr| !addr.is_empty())
            .map(str::to_string)
            .collect();
        if addrs.is_empty() {
            return Err("expected host:port addresses separated by commas".to_string());
        }
        Ok(Self(addrs))
    }
}

impl<'de> Deserialize<'de> for AddrList {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        raw.parse()
            .map_err(|err| serde::de::Error::custom(format!("`{raw}`: {err}")))
    }
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
    /// Wake the workers' relays right after a commit: valkey or off
    #[cfg(feature = "worker")]
    #[config(env = "OUTBOX_WAKE", default = "valkey", deserialize_with = from_str::deserialize)]
    pub wake: WakeMode,
    /// Queues every event is published to, such as default or shop,billing
    #[cfg(feature = "worker")]
    #[config(env = "OUTBOX_QUEUES", default = "default", deserialize_with = from_str::deserialize)]
    pub queues: QueueNames,
}

/// How a commit that stored events reaches the relays of other processes.
#[cfg(feature = "worker")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeMode {
    /// Relays find events at their next poll (`OUTBOX_POLL_INTERVAL`).
    Off,
    /// Each commit publishes a wake-up on Valkey; relays wake at once.
    Valkey,
}

#[cfg(feature = "worker")]
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
#[cfg(feature = "worker")]
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
    /// How long a listener's failure stays in `listener_failures` once it no
    /// longer holds its key (default: OUTBOX_RETENTION)
    #[config(env = "WORKER_FAILURE_RETENTION", deserialize_with = duration::deserialize)]
    pub failure_retention: Option<Duration>,
    /// This service's id among those sharing its Valkey (default: the id
    /// the kit's migration gave its database); set it apart for two copies
    /// of one database
    #[config(env = "WORKER_SERVICE_ID")]
    pub service_id: Option<String>,
}

#[cfg(feature = "worker")]
impl WorkerConfig {
    /// How long a failure that no longer holds its key is kept: the
    /// setting, or the outbox's retention.
    pub fn failure_retention(&self, outbox: &OutboxConfig) -> Duration {
        self.failure_retention.unwrap_or(outbox.retention)
    }
}

/// The worker's scheduler (`src/schedules/`): one replica leads at a time.
#[cfg(feature = "worker")]
#[derive(Debug, confique::Config)]
#[config(validate = Self::validate)]
pub struct SchedulerConfig {
    /// Whether this worker takes part in running the schedules
    #[config(env = "SCHEDULER_ENABLED", default = true)]
    pub enabled: bool,
    /// How long the leader's lease on Valkey lasts without renewal: the
    /// longest a dead leader's ticks go missing
    #[config(env = "SCHEDULER_LEASE_TTL", default = "15s", deserialize_with = duration::deserialize)]
    pub lease_ttl: Duration,
}

#[cfg(feature = "worker")]
impl SchedulerConfig {
    /// The leader renews every third of the TTL: at least a second leaves
    /// room for a round trip to Valkey.
    fn validate(&self) -> Result<(), String> {
        if self.lease_ttl < Duration::from_secs(1) {
            return Err(format!(
                "SCHEDULER_LEASE_TTL is {:?}; it must be at least 1s, such as 15s",
                self.lease_ttl
            ));
        }
        Ok(())
    }
}

/// Why the configuration could not be loaded. The message names the
/// variable and what it expects, and never contains a secret.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(String);

impl Config {
    /// Loads the kit's configuration from the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        load()
    }
}

/// Loads any configuration type from the process environment, with the
/// kit's errors (the variable named, never a secret): the service's own
/// type, which nests the kit's [`Config`] beside settings of its own.
///
/// ```no_run
/// #[derive(Debug, confique::Config)]
/// pub struct Settings {
///     #[config(nested)]
///     pub kit: kit::config::Config,
///     /// The greeting `GET /hello` answers with.
///     #[config(env = "SHOP_GREETING", default = "hello")]
///     pub greeting: String,
/// }
///
/// let settings: Settings = kit::config::load()?;
/// println!("{}", settings.greeting);
/// # Ok::<_, kit::config::ConfigError>(())
/// ```
pub fn load<C: confique::Config>() -> Result<C, ConfigError> {
    C::builder()
        .env()
        .load()
        .map_err(|err| ConfigError(explain(&C::META, &err.to_string())))
}

/// confique reports a missing value by its field path (`database.url`);
/// users know it by its variable, so name that and what it should hold.
fn explain(meta: &confique::meta::Meta, message: &str) -> String {
    let missing = message
        .strip_prefix("required configuration value is missing: '")
        .and_then(|rest| rest.strip_suffix('\''));
    if let Some((env, doc)) = missing.and_then(|path| leaf(meta, path)) {
        return format!("{env} is not set; expected {}", doc.trim());
    }
    // A check across settings (`ValkeyConfig::validate`) says it all itself.
    match message
        .strip_prefix("config validation of `")
        .and_then(|rest| rest.split_once("` failed: "))
    {
        Some((_, reason)) => reason.to_string(),
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
    pub(crate) fn connect_options(&self) -> PgConnectOptions {
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
pub(crate) fn redact_url(raw: &str) -> String {
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

    /// Parses a humantime string; the error names the value and the expected form.
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
#[cfg(feature = "worker")]
pub mod from_str {
    use std::fmt::Display;
    use std::str::FromStr;

    use serde::{Deserialize, Deserializer};

    /// Parses a string with `T::from_str`; the error names the value.
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
    use confique::Config as _;

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
    fn a_valkey_url_hides_its_password_and_refuses_other_schemes() {
        for raw in [
            "redis://app:hunter2@cache:6379/0",
            "rediss://app:hunter2@cache:6380",
            "valkey://:hunter2@cache",
            "valkeys://app:hunter2@cache:6380/2",
        ] {
            let url: ValkeyUrl = raw.parse().unwrap();
            let shown = format!("{url:?}");
            assert!(
                !shown.contains("hunter2") && shown.contains("***"),
                "{shown}"
            );
            let tls = raw.starts_with("rediss:") || raw.starts_with("valkeys:");
            assert_eq!(url.is_tls(), tls, "{raw}");
        }
        for raw in [
            "http://app:hunter2@cache",
            "rediss://app:hunter2@cache/zero",
            "rediss://app:hunter2@cache#insecure",
        ] {
            let err = raw.parse::<ValkeyUrl>().unwrap_err();
            assert!(!err.contains("hunter2"), "{err}");
        }
    }

    #[test]
    fn two_valkey_forms_are_an_error_naming_both() {
        let both = ValkeyConfig {
            url: Some("redis://cache:6379".parse().unwrap()),
            addr: Some("cache:6379".into()),
            ..ValkeyConfig::default()
        };
        let err = both.validate().unwrap_err();
        assert!(
            err.contains("VALKEY_URL") && err.contains("VALKEY_ADDR"),
            "{err}"
        );

        let with_password = ValkeyConfig {
            url: Some("redis://cache:6379".parse().unwrap()),
            password: Some(SecretString::from("hunter2")),
            ..ValkeyConfig::default()
        };
        let err = with_password.validate().unwrap_err();
        assert!(
            err.contains("VALKEY_PASSWORD") && !err.contains("hunter2"),
            "{err}"
        );

        let sentinel_and_url = ValkeyConfig {
            url: Some("redis://cache:6379".parse().unwrap()),
            sentinel_addrs: Some("s1:26379,s2:26379".parse().unwrap()),
            sentinel_master: Some("mymaster".into()),
            ..ValkeyConfig::default()
        };
        let err = sentinel_and_url.validate().unwrap_err();
        assert!(
            err.contains("VALKEY_SENTINEL_ADDRS") && err.contains("VALKEY_URL"),
            "{err}"
        );

        let no_master = ValkeyConfig {
            sentinel_addrs: Some("s1:26379".parse().unwrap()),
            ..ValkeyConfig::default()
        };
        assert!(
            no_master
                .validate()
                .unwrap_err()
                .contains("VALKEY_SENTINEL_MASTER")
        );

        let ca_without_tls = ValkeyConfig {
            url: Some("redis://cache:6379".parse().unwrap()),
            ca_cert: Some("ca.pem".into()),
            ..ValkeyConfig::default()
        };
        assert!(
            ca_without_tls
                .validate()
                .unwrap_err()
                .contains("VALKEY_CA_CERT")
        );

        let tls_and_url = ValkeyConfig {
            url: Some("redis://cache:6379".parse().unwrap()),
            tls: Some(true),
            ..ValkeyConfig::default()
        };
        let err = tls_and_url.validate().unwrap_err();
        assert!(
            err.contains("VALKEY_TLS") && err.contains("VALKEY_URL"),
            "{err}"
        );

        let tls_cluster_with_ca = ValkeyConfig {
            cluster_addrs: Some("n1:6379,n2:6379".parse().unwrap()),
            tls: Some(true),
            ca_cert: Some("ca.pem".into()),
            ..ValkeyConfig::default()
        };
        assert!(tls_cluster_with_ca.validate().is_ok());
        assert!(tls_cluster_with_ca.is_tls());

        let cluster_and_addr = ValkeyConfig {
            cluster_addrs: Some("n1:6379,n2:6379".parse().unwrap()),
            addr: Some("cache:6379".into()),
            ..ValkeyConfig::default()
        };
        let err = cluster_and_addr.validate().unwrap_err();
        assert!(
            err.contains("VALKEY_CLUSTER_ADDRS") && err.contains("VALKEY_ADDR"),
            "{err}"
        );

        assert!(ValkeyConfig::default().validate().is_ok());
        let explained = explain(
            &Config::META,
            &format!(
                "config validation of `ValkeyConfig` failed: {}",
                both.validate().unwrap_err()
            ),
        );
        assert!(
            explained.starts_with("VALKEY_URL and VALKEY_ADDR"),
            "{explained}"
        );
    }

    #[test]
    fn missing_values_are_named_by_their_variable() {
        let message = explain(
            &Config::META,
            "required configuration value is missing: 'database.url'",
        );
        assert!(message.starts_with("DATABASE_URL is not set; expected Postgres connection URL"));
    }

    /// A service's own configuration type, nesting the kit's.
    #[derive(Debug, confique::Config)]
    #[allow(dead_code)]
    struct Settings {
        #[config(nested)]
        kit: Config,
        /// A setting of the service's own.
        #[config(env = "TEST_GREETING", default = "hello")]
        greeting: String,
    }

    #[test]
    fn a_missing_kit_value_in_a_nesting_type_is_named_by_its_variable() {
        let message = explain(
            &Settings::META,
            "required configuration value is missing: 'kit.database.url'",
        );
        assert!(
            message.starts_with("DATABASE_URL is not set; expected Postgres connection URL"),
            "{message}"
        );
    }
}
