//! How the service reaches Valkey. [`Target`] turns the `VALKEY_*` settings
//! into a single server (plain TCP or TLS, optionally with an ACL user), a
//! Sentinel group or a cluster; [`Connection`] is the one shared, self-healing
//! connection every command goes through, and [`Target::subscribe`] opens
//! the dedicated pub/sub connections (outbox wake-ups, task cancellations).
//! Every connection of the process is made here, with the same options.
//!
//! # Sentinel
//!
//! The `redis` crate's `ConnectionManager` reconnects to the address it was
//! given and knows nothing of sentinels. So under Sentinel, a command that
//! fails as if the master were gone (a dropped or refused connection, a
//! timeout, or `READONLY` from a demoted master) makes [`Connection`] ask
//! the sentinels for the master again and swap in a connection to it. The
//! failed command still reports its error: the relay and the consumer retry
//! on their own schedule, and every script is safe to run again.
//!
//! # Cluster
//!
//! The `redis` crate's cluster connection routes each command, and each
//! script by its first key, to the node that owns the slot. Every key of a
//! queue carries the `{queue}` hash tag, so each script touches one slot;
//! a pipeline must stay within one slot too, so the client splits its
//! batches by queue in cluster mode ([`Connection::is_cluster`]). Pub/sub
//! messages reach every node of a cluster, so subscriptions connect to the
//! first node that answers.
//!
//! # TLS
//!
//! `rediss://` and `valkeys://` URLs use TLS, and so do `VALKEY_ADDR`, the
//! sentinels and their master, and a cluster's nodes with `VALKEY_TLS=true`
//! (rustls, with the `ring` provider: nothing to install). The server's
//! certificate must chain to the public web roots (webpki-roots), or to
//! `VALKEY_CA_CERT` when set. Sentinels name the master, and a cluster its
//! nodes, by the address they announce (an IP unless they are set to
//! announce host names), so that is the name the certificate must carry.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig, PubSub};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    Cmd, ConnectionAddr, IntoConnectionInfo, Pipeline, RedisConnectionInfo, RedisError,
    RedisFuture, RedisResult, TlsCertificates, TlsMode, Value,
};
use secrecy::ExposeSecret;

use super::QueueError;
use crate::config::{ValkeyConfig, ValkeyUrl};

/// The default server when no form is configured.
const DEFAULT_ADDR: &str = "localhost:6379";

/// Where Valkey is, and how to connect and authenticate.
#[derive(Clone)]
pub(crate) struct Target {
    kind: Kind,
    /// `VALKEY_CONNECT_TIMEOUT` and `VALKEY_RESPONSE_TIMEOUT`.
    timeouts: (Duration, Duration),
    /// What errors and logs call it: `host:port`, never a credential.
    shown: String,
    db: i64,
}

#[derive(Clone)]
enum Kind {
    /// One server; `redis::Client` holds its address, TLS and credentials.
    Server(Box<redis::Client>),
    /// A Sentinel group: the master is looked up when connecting.
    Sentinel(Arc<tokio::sync::Mutex<SentinelClient>>),
    /// A cluster: its client for commands, and one client per node given,
    /// for subscriptions.
    Cluster(Box<ClusterClient>, Vec<redis::Client>),
}

impl Target {
    /// The target the `VALKEY_*` settings name. Fails on an address that is
    /// not `host:port` or a CA file that cannot be read; the configuration
    /// itself checked that only one form is set.
    pub(crate) fn from_config(config: &ValkeyConfig) -> Result<Self, QueueError> {
        if let (Some(addrs), Some(master)) = (&config.sentinel_addrs, &config.sentinel_master) {
            return Self::sentinel(config, &addrs.0, master);
        }
        if let Some(addrs) = &config.cluster_addrs {
            return Self::cluster(config, &addrs.0);
        }
        if let Some(url) = &config.url {
            return Self::url(config, url);
        }
        let addr = config
            .addr
            .as_deref()
            .filter(|addr| !addr.is_empty())
            .unwrap_or(DEFAULT_ADDR);
        Ok(Self {
            timeouts: timeouts(config),
            kind: Kind::Server(Box::new(node(config, addr)?)),
            shown: addr.to_string(),
            db: i64::from(config.db.unwrap_or(0)),
        })
    }

    /// `VALKEY_SENTINEL_*`: the master `master` of the sentinels at `addrs`.
    fn sentinel(config: &ValkeyConfig, addrs: &[String], master: &str) -> Result<Self, QueueError> {
        let sentinels = addrs
            .iter()
            .map(|addr| split_addr(addr).map(|(host, port)| tcp(config, host, port)))
            .collect::<Result<Vec<_>, _>>()?;
        let db = i64::from(config.db.unwrap_or(0));
        let mut builder = SentinelClientBuilder::new(sentinels, master, SentinelServerType::Master)
            .map_err(QueueError::Redis)?
            .set_client_to_redis_db(db);
        if let Some(username) = username(config) {
            builder = builder.set_client_to_redis_username(username);
        }
        if let Some(password) = &config.password {
            builder = builder.set_client_to_redis_password(password.expose_secret());
        }
        if let Some(username) = config.sentinel_username.as_deref() {
            builder = builder.set_client_to_sentinel_username(username);
        }
        if let Some(password) = &config.sentinel_password {
            builder = builder.set_client_to_sentinel_password(password.expose_secret());
        }
        if config.is_tls() {
            builder = builder
                .set_client_to_sentinel_tls_mode(TlsMode::Secure)
                .set_client_to_redis_tls_mode(TlsMode::Secure);
            if let Some(certificates) = certificates(config)? {
                builder = builder
                    .set_client_to_sentinel_certificates(certificates.clone())
                    .set_client_to_redis_certificates(certificates);
            }
        }
        let client = builder.build().map_err(QueueError::Redis)?;
        Ok(Self {
            timeouts: timeouts(config),
            kind: Kind::Sentinel(Arc::new(tokio::sync::Mutex::new(client))),
            shown: format!("master `{master}` of the sentinels {}", addrs.join(",")),
            db,
        })
    }

    /// `VALKEY_CLUSTER_ADDRS`: the cluster some of whose nodes are `addrs`.
    fn cluster(config: &ValkeyConfig, addrs: &[String]) -> Result<Self, QueueError> {
        let nodes = addrs
            .iter()
            .map(|addr| node(config, addr))
            .collect::<Result<Vec<_>, _>>()?;
        let mut builder =
            ClusterClientBuilder::new(nodes.iter().map(|node| node.get_connection_info().clone()))
                .connection_timeout(config.connect_timeout())
                .response_timeout(config.response_timeout());
        if let Some(username) = username(config) {
            builder = builder.username(username);
        }
        if let Some(password) = &config.password {
            builder = builder.password(password.expose_secret());
        }
        if config.is_tls() {
            builder = builder.tls(TlsMode::Secure);
            if let Some(certificates) = certificates(config)? {
                builder = builder.certs(certificates);
            }
        }
        let client = builder.build().map_err(QueueError::Redis)?;
        Ok(Self {
            timeouts: timeouts(config),
            kind: Kind::Cluster(Box::new(client), nodes),
            shown: format!("the cluster of {}", addrs.join(",")),
            db: 0,
        })
    }

    /// `VALKEY_URL`, with TLS for `rediss://` and `valkeys://`, trusting
    /// `VALKEY_CA_CERT` when set.
    fn url(config: &ValkeyConfig, url: &ValkeyUrl) -> Result<Self, QueueError> {
        let parsed = url::Url::parse(url.expose()).map_err(|_| QueueError::Url)?;
        let shown = format!(
            "{}:{}",
            parsed.host_str().unwrap_or_default(),
            parsed.port().unwrap_or(6379)
        );
        let info = url
            .expose()
            .into_connection_info()
            .map_err(|_| QueueError::Url)?;
        let db = info.redis_settings().db();
        let client = open(config, info).map_err(|err| match err {
            QueueError::Redis(source) => QueueError::Connect {
                addr: shown.clone(),
                source,
            },
            other => other,
        })?;
        Ok(Self {
            timeouts: timeouts(config),
            kind: Kind::Server(Box::new(client)),
            shown,
            db,
        })
    }

    /// Connects (to the current master, under Sentinel) and PINGs, so that
    /// a wrong address, certificate or password fails at start-up.
    pub(crate) async fn connect(&self) -> Result<Connection, QueueError> {
        let connect = async {
            let mut link = match &self.kind {
                Kind::Cluster(cluster, _) => Link::Cluster(cluster.get_async_connection().await?),
                _ => Link::Server(manager(self.client().await?, self.timeouts).await?),
            };
            redis::cmd("PING").query_async::<String>(&mut link).await?;
            Ok(link)
        };
        let conn = connect.await.map_err(|source| self.connect_error(source))?;
        Ok(Connection {
            shared: Arc::new(Shared {
                target: self.clone(),
                current: RwLock::new((0, conn)),
                resolving: tokio::sync::Mutex::new(()),
            }),
        })
    }

    /// A dedicated connection subscribed to `channel`.
    pub(crate) async fn subscribe(&self, channel: &str) -> Result<PubSub, QueueError> {
        let subscribe = async {
            let mut pubsub = self.client().await?.get_async_pubsub().await?;
            pubsub.subscribe(channel).await?;
            Ok(pubsub)
        };
        subscribe.await.map_err(|source| self.connect_error(source))
    }

    /// A client for the server, for the master the sentinels name now, or
    /// for the first node of a cluster that answers.
    async fn client(&self) -> RedisResult<redis::Client> {
        match &self.kind {
            Kind::Server(client) => Ok(client.as_ref().clone()),
            Kind::Sentinel(sentinel) => sentinel.lock().await.async_get_client().await,
            Kind::Cluster(_, nodes) => {
                let mut last = None;
                for node in nodes {
                    match node.get_multiplexed_async_connection().await {
                        Ok(_) => return Ok(node.clone()),
                        Err(err) => last = Some(err),
                    }
                }
                Err(last.unwrap_or_else(|| {
                    RedisError::from((redis::ErrorKind::InvalidClientConfig, "no cluster node"))
                }))
            }
        }
    }

    fn connect_error(&self, source: RedisError) -> QueueError {
        QueueError::Connect {
            addr: self.shown.clone(),
            source,
        }
    }
}

/// A multiplexed, self-reconnecting connection with the project's timeouts
/// (connect, response).
async fn manager(
    client: redis::Client,
    (connect, response): (Duration, Duration),
) -> RedisResult<ConnectionManager> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(connect))
        .set_response_timeout(Some(response))
        .set_number_of_retries(3)
        .set_max_delay(Duration::from_secs(2));
    ConnectionManager::new_with_config(client, config).await
}

/// A client for the server at `addr` (`host:port`), with the user,
/// password and database of `config`.
fn node(config: &ValkeyConfig, addr: &str) -> Result<redis::Client, QueueError> {
    let (host, port) = split_addr(addr)?;
    let mut redis = RedisConnectionInfo::default().set_db(i64::from(config.db.unwrap_or(0)));
    if let Some(username) = username(config) {
        redis = redis.set_username(username);
    }
    if let Some(password) = &config.password {
        redis = redis.set_password(password.expose_secret());
    }
    let info = tcp(config, host, port)
        .into_connection_info()
        .map_err(QueueError::Redis)?
        .set_redis_settings(redis);
    open(config, info)
}

/// The address of `host:port`, over TLS when `config` asks for it.
fn tcp(config: &ValkeyConfig, host: String, port: u16) -> ConnectionAddr {
    if config.is_tls() {
        ConnectionAddr::TcpTls {
            host,
            port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(host, port)
    }
}

/// A client for `info`; over TLS, trusting `VALKEY_CA_CERT` when set.
fn open(config: &ValkeyConfig, info: redis::ConnectionInfo) -> Result<redis::Client, QueueError> {
    let client = match certificates(config)? {
        Some(certificates) => redis::Client::build_with_tls(info, certificates),
        None if config.is_tls() => redis::Client::build_with_tls(
            info,
            TlsCertificates {
                client_tls: None,
                root_cert: None,
            },
        ),
        None => redis::Client::open(info),
    };
    client.map_err(QueueError::Redis)
}

/// The CA of `VALKEY_CA_CERT` to trust instead of the public web roots,
/// once TLS is on; also installs rustls' crypto provider.
fn certificates(config: &ValkeyConfig) -> Result<Option<TlsCertificates>, QueueError> {
    if !config.is_tls() {
        return Ok(None);
    }
    install_crypto_provider();
    let Some(path) = &config.ca_cert else {
        return Ok(None);
    };
    let root_cert = std::fs::read(path).map_err(|source| QueueError::CaCert {
        path: path.display().to_string(),
        source,
    })?;
    Ok(Some(TlsCertificates {
        client_tls: None,
        root_cert: Some(root_cert),
    }))
}

/// `VALKEY_CONNECT_TIMEOUT` and `VALKEY_RESPONSE_TIMEOUT`.
fn timeouts(config: &ValkeyConfig) -> (Duration, Duration) {
    (config.connect_timeout(), config.response_timeout())
}

/// `VALKEY_USERNAME`, unless empty.
fn username(config: &ValkeyConfig) -> Option<&str> {
    config.username.as_deref().filter(|name| !name.is_empty())
}

/// rustls needs a process-wide crypto provider when more than one is
/// compiled in (another dependency may bring `aws-lc-rs`); use `ring`.
///
/// rustls 0.23.48 deprecated `ring::default_provider` (ring has no
/// post-quantum key exchange) with no ring-based successor; the other
/// provider, `aws-lc-rs`, compiles AWS-LC from C sources (a C compiler, and
/// a longer first build). Until the kit moves to it, the call stays,
/// allowed, so that a project resolving rustls 0.23.48 or later builds
/// without a warning (gpkit's end-to-end tests build generated projects on
/// the newest rustls, and fail on a warning).
#[allow(deprecated)]
fn install_crypto_provider() {
    // An error means one is installed already, which is as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The shared connection: cheap to clone, clones share one socket (one per
/// node in a cluster). Under Sentinel it follows the master (see the
/// module docs).
#[derive(Clone)]
pub(crate) struct Connection {
    shared: Arc<Shared>,
}

/// The connection proper: to one server, or to a cluster.
#[derive(Clone)]
enum Link {
    Server(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Server(conn) => conn.req_packed_command(cmd),
            Self::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Server(conn) => conn.req_packed_commands(pipeline, offset, count),
            Self::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Server(conn) => conn.get_db(),
            Self::Cluster(conn) => conn.get_db(),
        }
    }
}

struct Shared {
    target: Target,
    /// The connection in use and its generation, counted up at each swap.
    current: RwLock<(u64, Link)>,
    /// Held while the master is looked up, so that one lookup runs at once.
    resolving: tokio::sync::Mutex<()>,
}

impl Connection {
    /// What this connects to, for logs: `host:port` or the Sentinel master.
    pub(crate) fn target(&self) -> &Target {
        &self.shared.target
    }

    /// Whether this is a cluster connection, where a pipeline must stay
    /// within one slot.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.shared.target.kind, Kind::Cluster(..))
    }

    fn current(&self) -> (u64, Link) {
        let current = self
            .shared
            .current
            .read()
            .unwrap_or_else(|e| e.into_inner());
        (current.0, current.1.clone())
    }

    /// After a command that failed as if the master were gone: under
    /// Sentinel, ask the sentinels for the master and switch to it, unless
    /// another command did already (its generation moved on).
    async fn follow_master(&self, failed_generation: u64) {
        if !matches!(self.shared.target.kind, Kind::Sentinel(_)) {
            return;
        }
        let _one_at_a_time = self.shared.resolving.lock().await;
        if self.current().0 != failed_generation {
            return;
        }
        let found = async {
            let client = self.shared.target.client().await?;
            manager(client, self.shared.target.timeouts).await
        };
        match found.await {
            Ok(conn) => {
                let mut current = self
                    .shared
                    .current
                    .write()
                    .unwrap_or_else(|e| e.into_inner());
                *current = (failed_generation + 1, Link::Server(conn));
                tracing::info!(valkey = %self.shared.target.shown, "connected to the master the sentinels name");
            }
            Err(err) => {
                tracing::warn!(valkey = %self.shared.target.shown, error = %err, "the sentinels name no reachable master yet");
            }
        }
    }
}

/// Whether `err` suggests the master moved: the connection is gone or
/// refused, timed out, or the server is now a read-only replica.
fn master_lost(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_timeout()
        || err.code() == Some("READONLY")
}

/// Whether one reply of a pipeline is a `READONLY` error.
fn read_only_reply(value: &Value) -> bool {
    matches!(value, Value::ServerError(err) if err.code() == "READONLY")
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (generation, mut conn) = self.current();
            let reply = conn.req_packed_command(cmd).await;
            let lost = match &reply {
                Ok(value) => read_only_reply(value),
                Err(err) => master_lost(err),
            };
            if lost {
                self.follow_master(generation).await;
            }
            reply
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (generation, mut conn) = self.current();
            let replies = conn.req_packed_commands(pipeline, offset, count).await;
            let lost = match &replies {
                Ok(values) => values.iter().any(read_only_reply),
                Err(err) => master_lost(err),
            };
            if lost {
                self.follow_master(generation).await;
            }
            replies
        })
    }

    fn get_db(&self) -> i64 {
        self.shared.target.db
    }
}

/// `host:port`, `[v6]:port`, or a bare host (port 6379).
pub(super) fn split_addr(addr: &str) -> Result<(String, u16), QueueError> {
    let invalid = || QueueError::Address(addr.to_string());
    let (host, port) = match addr.rsplit_once(':') {
        Some((host, port))
            if !host.is_empty() && (!host.contains(':') || host.starts_with('[')) =>
        {
            (host, port.parse().map_err(|_| invalid())?)
        }
        None if !addr.is_empty() => (addr, 6379),
        _ => return Err(invalid()),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Ok((host.to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_host_and_port() {
        assert_eq!(
            split_addr("localhost:6379").unwrap(),
            ("localhost".into(), 6379)
        );
        assert_eq!(split_addr("[::1]:7000").unwrap(), ("::1".into(), 7000));
        assert_eq!(split_addr("valkey").unwrap(), ("valkey".into(), 6379));
        assert!(split_addr("valkey:port").is_err());
        assert!(split_addr(":6379").is_err());
    }

    fn config(url: &str) -> ValkeyConfig {
        ValkeyConfig {
            url: Some(url.parse().unwrap()),
            ..ValkeyConfig::default()
        }
    }

    #[test]
    fn a_url_gives_the_user_password_database_and_tls() {
        for (url, tls) in [
            ("redis://app:hunter2@cache:6380/3", false),
            ("valkey://app:hunter2@cache:6380/3", false),
            ("rediss://app:hunter2@cache:6380/3", true),
            ("valkeys://app:hunter2@cache:6380/3", true),
        ] {
            let target = Target::from_config(&config(url)).unwrap();
            assert_eq!(target.shown, "cache:6380", "{url}");
            assert_eq!(target.db, 3, "{url}");
            let Kind::Server(client) = &target.kind else {
                panic!("{url}: not a single server");
            };
            let info = client.get_connection_info();
            assert_eq!(info.redis_settings().username(), Some("app"), "{url}");
            assert_eq!(info.redis_settings().password(), Some("hunter2"), "{url}");
            assert_eq!(
                matches!(info.addr(), ConnectionAddr::TcpTls { .. }),
                tls,
                "{url}"
            );
        }
    }

    #[test]
    fn an_unreadable_ca_file_is_named() {
        let mut config = config("rediss://cache:6380");
        config.ca_cert = Some("/nonexistent/ca.pem".into());
        let err = match Target::from_config(&config) {
            Ok(_) => panic!("a missing CA file was accepted"),
            Err(err) => err.to_string(),
        };
        assert!(err.contains("/nonexistent/ca.pem"), "{err}");
    }
}
