//! `gpkit doctor` over TLS, against servers that speak only TLS with a
//! certificate from a test CA: a Postgres cluster of the test's own
//! (`sslmode`, `sslrootcert`, `PGSSLMODE`/`PGSSLROOTCERT`, a client
//! certificate) and a Valkey (Debian's redis-server: `rediss://`,
//! `valkeys://`, `VALKEY_TLS` with `VALKEY_CA_CERT`, for a server, sentinels
//! and cluster nodes). The right CA connects, and another CA, a host name
//! the certificate does not carry, or a server without TLS fail with what
//! is wrong and the fix. No project is built.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{doctor, finding};
use crate::e2e::{database_url, psql};
use crate::own_postgres::{OwnPostgres, give_to_owner};
use crate::support::new_project;
use crate::test_ca::{make_ca, make_server_cert};
use crate::worker_e2e::free_port;

/// The `check` finding of `gpkit doctor --format json` with `env`: its
/// status, detail and fix.
fn check(project: &Path, check: &str, env: &[(&str, &str)]) -> (String, String, String) {
    let (_, json) = doctor(project, env, &["--format", "json"]);
    finding(&json, check)
}

/// `test-ca` and `other-ca` in `dir`, and `server.pem` (signed by
/// `test-ca`) issued for `localhost` only, so that connecting to 127.0.0.1
/// is a host name the certificate does not carry.
fn certificates(dir: &Path) -> (String, String) {
    make_ca(dir, "test-ca");
    make_ca(dir, "other-ca");
    make_server_cert(dir, "test-ca", "server", "localhost", "DNS:localhost");
    let path = |name: &str| dir.join(name).display().to_string();
    (path("test-ca.pem"), path("other-ca.pem"))
}

#[test]
fn postgres_sslmode_require_connects_over_tls_and_verify_full_checks_the_ca_and_the_name() {
    let dir = tempfile::tempdir().unwrap();
    let project = new_project(dir.path(), &["--no-input"]);
    let certs = tempfile::tempdir().unwrap();
    let (ca, other_ca) = certificates(certs.path());
    // A client certificate for the user `certuser`, who must show it.
    make_server_cert(
        certs.path(),
        "test-ca",
        "client",
        "certuser",
        "DNS:certuser",
    );
    give_to_owner(certs.path());
    let file = |name: &str| certs.path().join(name).display().to_string();
    // TLS connections only: a plaintext connection is rejected.
    let server = OwnPostgres::start(
        &[
            ("ssl", "on"),
            ("ssl_cert_file", &file("server.pem")),
            ("ssl_key_file", &file("server.key")),
            ("ssl_ca_file", &ca),
        ],
        Some(
            "local all all trust\n\
             hostssl all certuser 127.0.0.1/32 cert\n\
             hostssl all all 127.0.0.1/32 trust\n\
             hostnossl all all 127.0.0.1/32 reject\n",
        ),
    );
    let url = |host: &str, query: &str| {
        format!(
            "postgres://postgres@{host}:{}/postgres?{query}",
            server.port
        )
    };
    let postgres = |url: &str, env: &[(&str, &str)]| {
        let mut all = vec![("DATABASE_URL", url)];
        all.extend_from_slice(env);
        check(&project, "postgres", &all)
    };
    let connects = |url: &str, env: &[(&str, &str)], how: &str| {
        let (status, detail, _) = postgres(url, env);
        assert_eq!(status, "ok", "{url}: {detail}");
        assert!(detail.contains(how), "{url}: {detail}");
    };

    // require encrypts, without checking the certificate (127.0.0.1 is not
    // its name), as the project's sqlx does.
    connects(
        &url("127.0.0.1", "sslmode=require"),
        &[],
        "over TLS (TLSv1.3; certificate not verified, sslmode=require)",
    );
    // verify-full with the CA, by the certificate's name.
    connects(
        &url(
            "localhost",
            &format!("sslmode=verify-full&sslrootcert={ca}"),
        ),
        &[],
        "over TLS (TLSv1.3; certificate and host name verified, sslmode=verify-full)",
    );
    // The same from PGSSLMODE and PGSSLROOTCERT, which sqlx reads too.
    connects(
        &url("localhost", ""),
        &[("PGSSLMODE", "verify-full"), ("PGSSLROOTCERT", &ca)],
        "host name verified, sslmode=verify-full",
    );
    // A client certificate, from sslcert and sslkey.
    psql(
        &url("127.0.0.1", "sslmode=require"),
        "CREATE ROLE certuser LOGIN",
    );
    let as_certuser = url("localhost", "sslmode=verify-full").replace("postgres@", "certuser@");
    connects(
        &format!(
            "{as_certuser}&sslrootcert={ca}&sslcert={}&sslkey={}",
            file("client.pem"),
            file("client.key")
        ),
        &[],
        "as certuser over TLS",
    );
    let (status, detail, fix) = postgres(&format!("{as_certuser}&sslrootcert={ca}"), &[]);
    assert_eq!(status, "fail");
    assert!(detail.contains("client certificate"), "{detail}");
    assert!(fix.contains("sslcert and sslkey"), "{fix}");
    // Plaintext is rejected by this server: proof that the above used TLS.
    let (status, detail, _) = postgres(&url("127.0.0.1", "sslmode=disable"), &[]);
    assert_eq!(status, "fail");
    assert!(detail.contains("no encryption"), "{detail}");

    // Another CA: the certificate is not trusted, and the fix names sslrootcert.
    let (status, detail, fix) = postgres(
        &url(
            "localhost",
            &format!("sslmode=verify-full&sslrootcert={other_ca}"),
        ),
        &[],
    );
    assert_eq!(status, "fail");
    assert!(
        detail.contains(
            "its TLS certificate is not signed by a trusted CA (unknown issuer; trusted: the \
             public web roots and sslrootcert"
        ),
        "{detail}"
    );
    assert!(
        fix.starts_with("point sslrootcert at the PEM file of the CA"),
        "{fix}"
    );
    // No CA given: only the public roots are trusted.
    let (status, detail, fix) = postgres(&url("localhost", "sslmode=verify-full"), &[]);
    assert_eq!(status, "fail");
    assert!(detail.contains("unknown issuer"), "{detail}");
    assert!(fix.starts_with("add sslrootcert="), "{fix}");
    // The right CA, but a host name the certificate does not carry.
    let (status, detail, fix) = postgres(
        &url(
            "127.0.0.1",
            &format!("sslmode=verify-full&sslrootcert={ca}"),
        ),
        &[],
    );
    assert_eq!(status, "fail");
    assert!(
        detail.contains(
            "its TLS certificate is not issued for the host name `127.0.0.1` (it names localhost)"
        ),
        "{detail}"
    );
    assert!(fix.contains("(localhost)"), "{fix}");
    // verify-ca fails there too, as the project's sqlx 0.8 does, and says why.
    let (status, detail, _) = postgres(
        &url("127.0.0.1", &format!("sslmode=verify-ca&sslrootcert={ca}")),
        &[],
    );
    assert_eq!(status, "fail");
    assert!(
        detail.contains("checks the host name under verify-ca too"),
        "{detail}"
    );
    // A CA file that is not there.
    let (status, detail, fix) = postgres(
        &url(
            "localhost",
            "sslmode=verify-full&sslrootcert=no-such-ca.pem",
        ),
        &[],
    );
    assert_eq!(status, "fail");
    assert!(
        detail.contains("cannot read sslrootcert `no-such-ca.pem`"),
        "{detail}"
    );
    assert!(
        fix.starts_with("correct sslrootcert (DATABASE_URL in the environment)"),
        "{fix}"
    );

    // A server without TLS (the tests' shared Postgres) and sslmode=require.
    let plain = format!("{}?sslmode=require", database_url("postgres"));
    let (status, detail, fix) = postgres(&plain, &[]);
    assert_eq!(status, "fail");
    assert!(
        detail.contains("the server does not support TLS, which sslmode=require requires"),
        "{detail}"
    );
    assert!(fix.contains("sslmode=prefer"), "{fix}");
}

/// A server that speaks only TLS, with `server.pem`/`server.key` of `dir`;
/// killed on drop. Debian's redis-server: the valkey-server of the tests
/// (`VALKEY_SERVER`, from PyPI) is built without TLS.
struct TlsServer {
    child: Child,
    port: u16,
}

impl TlsServer {
    /// Starts the server on a free port, and waits until it answers PING
    /// over TLS with the test CA: the port may be taken by another process
    /// between the look-up and the start, and then the server exits and
    /// another port is tried.
    fn start(dir: &Path) -> Self {
        let file = |name: &str| dir.join(name).display().to_string();
        for _ in 0..3 {
            let port = free_port();
            let mut child = Command::new("redis-server")
                .args(["--bind", "127.0.0.1", "--port", "0", "--save", ""])
                .args(["--appendonly", "no", "--tls-port", &port.to_string()])
                .args(["--tls-cert-file", &file("server.pem")])
                .args(["--tls-key-file", &file("server.key")])
                .args(["--tls-ca-cert-file", &file("test-ca.pem")])
                .args(["--tls-auth-clients", "no"])
                .arg("--dir")
                .arg(dir)
                .stdout(Stdio::null())
                .spawn()
                .expect("redis-server runs (Debian: redis-server)");
            let started = Instant::now();
            while child.try_wait().unwrap().is_none() {
                if tls_ping(dir, port) {
                    return Self { child, port };
                }
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "the TLS server does not answer"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        panic!("the TLS server exited at start three times");
    }
}

/// Whether the server on `port` answers PING over TLS, trusting only the
/// test CA of `dir`.
fn tls_ping(dir: &Path, port: u16) -> bool {
    let ca = dir.join("test-ca.pem");
    Command::new("redis-cli")
        .args(["--tls", "--cacert"])
        .arg(&ca)
        .args(["-h", "localhost", "-p", &port.to_string(), "PING"])
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "PONG")
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn valkey_over_tls_answers_ping_with_the_private_ca_and_a_wrong_ca_or_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let project = new_project(dir.path(), &["--no-input"]);
    let certs = tempfile::tempdir().unwrap();
    let (ca, other_ca) = certificates(certs.path());
    let server = TlsServer::start(certs.path());
    let port = server.port;
    let localhost = format!("localhost:{port}");
    let valkey = |env: &[(&str, &str)]| check(&project, "valkey", env);
    let answers = |env: &[(&str, &str)], shown: &str| {
        let (status, detail, _) = valkey(env);
        assert_eq!(status, "ok", "{env:?}: {detail}");
        assert!(
            detail.starts_with(shown) && detail.contains("answered PING over TLS"),
            "{env:?}: {detail}"
        );
        detail
    };

    // rediss:// and valkeys:// URLs, trusting the CA of VALKEY_CA_CERT.
    let url = format!("rediss://{localhost}/0");
    let detail = answers(&[("VALKEY_URL", &url), ("VALKEY_CA_CERT", &ca)], &url);
    assert!(
        detail.starts_with(&format!("{url} answered PING over TLS (Redis ")),
        "{detail}"
    );
    let url = format!("rediss://{localhost}/0");
    answers(
        &[
            ("VALKEY_URL", &format!("valkeys://{localhost}/0")),
            ("VALKEY_CA_CERT", &ca),
        ],
        &url,
    );
    // VALKEY_TLS=true for VALKEY_ADDR, the sentinels and the cluster nodes.
    let tls = [("VALKEY_TLS", "true"), ("VALKEY_CA_CERT", ca.as_str())];
    answers(
        &[&[("VALKEY_ADDR", localhost.as_str())], &tls[..]].concat(),
        &localhost,
    );
    answers(
        &[&[("VALKEY_SENTINEL_ADDRS", localhost.as_str())], &tls[..]].concat(),
        "every sentinel in VALKEY_SENTINEL_ADDRS",
    );
    answers(
        &[&[("VALKEY_CLUSTER_ADDRS", localhost.as_str())], &tls[..]].concat(),
        "every cluster node in VALKEY_CLUSTER_ADDRS",
    );

    // Plaintext to a server that speaks only TLS: the fix says how to ask for TLS.
    let (status, _, fix) = valkey(&[("VALKEY_ADDR", &localhost)]);
    assert_eq!(status, "fail");
    assert!(
        fix.ends_with("needs rediss:// in VALKEY_URL, or VALKEY_TLS=true"),
        "{fix}"
    );

    // Another CA: refused, naming the CA trusted and the fix.
    let (status, detail, fix) = valkey(&[
        ("VALKEY_ADDR", &localhost),
        ("VALKEY_TLS", "true"),
        ("VALKEY_CA_CERT", &other_ca),
    ]);
    assert_eq!(status, "fail");
    assert_eq!(
        detail,
        format!(
            "{localhost}: its TLS certificate is not signed by a trusted CA (unknown issuer; \
             trusted: VALKEY_CA_CERT `{other_ca}`)"
        )
    );
    assert!(
        fix.starts_with("point VALKEY_CA_CERT (the environment) at the PEM file"),
        "{fix}"
    );
    // No CA: only the public roots are trusted, and the fix names VALKEY_CA_CERT.
    let (status, detail, fix) = valkey(&[("VALKEY_URL", &format!("rediss://{localhost}"))]);
    assert_eq!(status, "fail");
    assert!(
        detail.ends_with("(unknown issuer; trusted: the public web roots)"),
        "{detail}"
    );
    assert!(
        fix.starts_with("set VALKEY_CA_CERT in .env to the PEM file"),
        "{fix}"
    );
    // The right CA, but 127.0.0.1 is not a name of the certificate.
    let (status, detail, fix) = valkey(&[
        ("VALKEY_URL", &format!("rediss://127.0.0.1:{port}")),
        ("VALKEY_CA_CERT", &ca),
    ]);
    assert_eq!(status, "fail");
    assert!(
        detail.ends_with(
            "its TLS certificate is not issued for the host name `127.0.0.1` (it names localhost)"
        ),
        "{detail}"
    );
    assert!(fix.contains("(localhost) in VALKEY_URL"), "{fix}");

    // TLS to a server that answers in plaintext (as Valkey answers a line
    // it cannot parse; Valkey itself waits for a line end that a TLS
    // handshake need not send).
    let plain = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let plain_addr = plain.local_addr().unwrap().to_string();
    let answering = std::thread::spawn(move || {
        use std::io::{Read as _, Write as _};
        let (mut stream, _) = plain.accept().unwrap();
        let _ = stream.read(&mut [0; 512]);
        let _ = stream.write_all(b"-ERR unknown command\r\n");
    });
    let (status, detail, fix) = valkey(&[("VALKEY_ADDR", &plain_addr), ("VALKEY_TLS", "true")]);
    answering.join().unwrap();
    assert_eq!(status, "fail");
    assert_eq!(
        detail,
        format!("{plain_addr}: it does not answer in TLS (a plaintext port?)")
    );
    assert!(fix.contains("connect without TLS"), "{fix}");

    // Settings the project's configuration refuses, refused here too.
    for (env, says) in [
        (
            vec![("VALKEY_URL", url.as_str()), ("VALKEY_TLS", "true")],
            "both VALKEY_TLS and VALKEY_URL are set",
        ),
        (
            vec![
                ("VALKEY_ADDR", localhost.as_str()),
                ("VALKEY_CA_CERT", ca.as_str()),
            ],
            "VALKEY_CA_CERT is set but TLS is off",
        ),
        (
            vec![("VALKEY_URL", &format!("{url}#insecure"))],
            "VALKEY_URL has a query or a fragment",
        ),
        (
            vec![("VALKEY_ADDR", localhost.as_str()), ("VALKEY_TLS", "maybe")],
            "VALKEY_TLS is `maybe`, not true or false",
        ),
    ] {
        let (status, detail, _) = valkey(&env);
        assert_eq!(status, "fail", "{env:?}");
        assert!(detail.starts_with(says), "{env:?}: {detail}");
    }
}
