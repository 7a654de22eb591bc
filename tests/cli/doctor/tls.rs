//! `gpkit doctor` over TLS, against servers that speak only TLS with a
//! certificate from a test CA: a Postgres cluster of the test's own
//! (`sslmode`, `sslrootcert`, `PGSSLMODE`/`PGSSLROOTCERT`, a client
//! certificate). The right CA connects, and another CA, a host name the
//! certificate does not carry, or a server without TLS fail with what is
//! wrong and the fix. No project is built.

use std::path::Path;

use super::{doctor, finding};
use crate::e2e::{database_url, psql};
use crate::own_postgres::{OwnPostgres, give_to_owner};
use crate::support::new_project;
use crate::test_ca::{make_ca, make_server_cert};

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
