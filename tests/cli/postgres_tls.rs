//! TLS to Postgres: the generated project's sqlx is built with rustls, so
//! `DATABASE_URL`'s `sslmode` (`require`, `verify-ca`, `verify-full`) and
//! `sslrootcert` work with nothing to install. Checked with the project's
//! `migrate` binary against a cluster of the test's own that accepts TLS
//! connections only, with a certificate from a test CA issued for
//! `localhost` (not for 127.0.0.1, so that a host-name mismatch can be shown).

use std::process::{Command, Output};

use crate::e2e::binary;
use crate::own_postgres::{OwnPostgres, give_to_owner};
use crate::test_ca::{make_ca, make_server_cert};

/// `migrate status` with `url` as DATABASE_URL.
fn migrate_status(url: &str) -> Output {
    Command::new(binary("migrate"))
        .arg("status")
        .current_dir(crate::e2e::built_project())
        .env("DATABASE_URL", url)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

#[test]
#[ignore = "builds a generated project"]
fn sslmode_and_sslrootcert_are_honoured_and_a_bad_certificate_is_explained() {
    let certs = tempfile::tempdir().unwrap();
    make_ca(certs.path(), "test-ca");
    make_ca(certs.path(), "other-ca");
    make_server_cert(
        certs.path(),
        "test-ca",
        "server",
        "localhost",
        "DNS:localhost",
    );
    give_to_owner(certs.path());
    let cert = certs.path().join("server.pem").display().to_string();
    let key = certs.path().join("server.key").display().to_string();
    // TLS connections only: a plaintext connection is rejected.
    let server = OwnPostgres::start(
        &[
            ("ssl", "on"),
            ("ssl_cert_file", &cert),
            ("ssl_key_file", &key),
        ],
        Some(
            "local all all trust\n\
             hostssl all all 127.0.0.1/32 trust\n\
             hostnossl all all 127.0.0.1/32 reject\n",
        ),
    );
    let ca = certs.path().join("test-ca.pem").display().to_string();
    let other_ca = certs.path().join("other-ca.pem").display().to_string();
    let url = |host: &str, query: &str| {
        format!(
            "postgres://postgres@{host}:{}/postgres?{query}",
            server.port
        )
    };
    let succeeds = |url: &str| {
        let out = migrate_status(url);
        assert!(
            out.status.success(),
            "{url}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let fails = |url: &str, reason: &str| {
        let out = migrate_status(url);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{url} connected");
        assert!(
            stderr.contains(reason),
            "{url}: the error does not say `{reason}`:\n{stderr}"
        );
        stderr.to_string()
    };

    // The right CA and the certificate's name: connects (over TLS only).
    succeeds(&url(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    ));
    // verify-ca checks the CA; with the name in the certificate it connects.
    succeeds(&url(
        "localhost",
        &format!("sslmode=verify-ca&sslrootcert={ca}"),
    ));
    // require encrypts without verifying.
    succeeds(&url("127.0.0.1", "sslmode=require"));

    // Plaintext is rejected by this server: proof the above used TLS.
    fails(&url("127.0.0.1", "sslmode=disable"), "no encryption");
    // A certificate from another CA.
    let wrong_ca = fails(
        &url(
            "localhost",
            &format!("sslmode=verify-full&sslrootcert={other_ca}"),
        ),
        "localhost",
    );
    assert!(
        wrong_ca.to_lowercase().contains("certificate"),
        "{wrong_ca}"
    );
    // A host name the certificate was not issued for.
    let wrong_name = fails(
        &url(
            "127.0.0.1",
            &format!("sslmode=verify-full&sslrootcert={ca}"),
        ),
        "127.0.0.1",
    );
    assert!(
        wrong_name.to_lowercase().contains("certificate"),
        "{wrong_name}"
    );

    // The documented gap (kit/README.md, "TLS to Postgres"): sqlx 0.8.6
    // with rustls 0.23.24 and later checks the host name under verify-ca
    // too (sqlx #3793, fixed in sqlx 0.9): stricter than libpq, never
    // weaker. When this starts to connect, the fix has arrived: drop the
    // kit's note and make this a `succeeds`.
    fails(
        &url("127.0.0.1", &format!("sslmode=verify-ca&sslrootcert={ca}")),
        "not valid for name \"127.0.0.1\"",
    );
}
