//! TLS for the checks' connections, made as the project's binaries make
//! theirs: rustls with the `ring` provider (nothing to install), trusting
//! the public web roots (webpki-roots) and the CA the settings name; and
//! what a failed handshake means, in words, for the findings.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

/// rustls's `ring` provider, made the process's default too: the redis
/// crate builds its TLS configuration with the default provider.
///
/// rustls 0.23.48 deprecated `ring::default_provider` (ring has no
/// post-quantum key exchange) with no ring-based successor, as the kit's
/// `install_crypto_provider` says; the call stays, allowed, so that
/// `cargo install --path .` (which resolves the newest rustls, not
/// Cargo.lock's) builds gpkit without a warning.
#[allow(deprecated)]
pub(crate) fn provider() -> Arc<CryptoProvider> {
    // An error means one is installed already, which is as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
    Arc::new(rustls::crypto::ring::default_provider())
}

/// How much of the server's certificate a connection checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verify {
    /// Nothing: encrypted, but any certificate is accepted.
    Nothing,
    /// The chain to a trusted CA and the host name.
    Certificate,
}

/// A client configuration that verifies as `verify` says, trusting the
/// public web roots and `ca`, with `client` as the client's certificate.
pub(crate) fn client_config(
    verify: Verify,
    ca: &[CertificateDer<'static>],
    client: Option<ClientIdentity>,
) -> Result<ClientConfig, String> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|err| err.to_string())?;
    let builder = match verify {
        Verify::Nothing => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate { provider })),
        Verify::Certificate => {
            let mut roots =
                RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            for cert in ca {
                roots
                    .add(cert.clone())
                    .map_err(|err| format!("the CA certificate is not usable: {err}"))?;
            }
            builder.with_root_certificates(roots)
        }
    };
    match client {
        Some(identity) => builder
            .with_client_auth_cert(identity.chain, identity.key)
            .map_err(|err| format!("the client certificate is not usable: {err}")),
        None => Ok(builder.with_no_client_auth()),
    }
}

/// A client certificate chain and its private key.
pub(crate) struct ClientIdentity {
    pub(crate) chain: Vec<CertificateDer<'static>>,
    pub(crate) key: PrivateKeyDer<'static>,
}

/// The PEM certificates of the file `path` (relative to `root`), or why
/// they cannot be used; `what` names the setting in the message.
pub(crate) fn read_certificates(
    root: &Path,
    path: &str,
    what: &str,
) -> Result<Vec<CertificateDer<'static>>, String> {
    read_pem_certificates(root, path, what).map(|(certs, _)| certs)
}

/// The PEM file `path` (relative to `root`) as it is, once it is known to
/// hold certificates; `what` names the setting in the message.
pub(crate) fn read_pem(root: &Path, path: &str, what: &str) -> Result<Vec<u8>, String> {
    read_pem_certificates(root, path, what).map(|(_, data)| data)
}

fn read_pem_certificates(
    root: &Path,
    path: &str,
    what: &str,
) -> Result<(Vec<CertificateDer<'static>>, Vec<u8>), String> {
    let data = read(root, path, what)?;
    let certs = CertificateDer::pem_slice_iter(&data)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| format!("{what} `{path}` is not a PEM certificate file: {err}"))?;
    if certs.is_empty() {
        return Err(format!(
            "{what} `{path}` holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
        ));
    }
    Ok((certs, data))
}

/// The PEM private key of the file `path` (relative to `root`).
pub(crate) fn read_key(
    root: &Path,
    path: &str,
    what: &str,
) -> Result<PrivateKeyDer<'static>, String> {
    let data = read(root, path, what)?;
    PrivateKeyDer::from_pem_slice(&data)
        .map_err(|err| format!("{what} `{path}` holds no usable PEM private key: {err}"))
}

/// The file `path`, relative to the project directory `root` (where the
/// project's binaries run) unless absolute.
pub(crate) fn resolve(root: &Path, path: &str) -> PathBuf {
    root.join(path)
}

fn read(root: &Path, path: &str, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(resolve(root, path)).map_err(|err| format!("cannot read {what} `{path}`: {err}"))
}

/// What went wrong in a TLS handshake, found in an error's chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Problem {
    /// The certificate does not chain to a trusted CA.
    UnknownCa,
    /// The certificate is not issued for the host name connected to; the
    /// names it carries.
    WrongName(Vec<String>),
    /// The certificate has expired or is not valid yet.
    Expired,
    NotYetValid,
    /// Another certificate problem, in rustls's words.
    Certificate(String),
    /// What answered is not a TLS server (a plaintext port?).
    NotTls,
    /// The server ended the handshake with this alert (such as a client
    /// certificate it requires).
    Alert(String),
    /// Another TLS error, in rustls's words.
    Other(String),
}

impl Problem {
    /// The TLS problem in the chain of `err`, if any: rustls's errors come
    /// wrapped in `std::io::Error`s, whose `source` skips them.
    pub(crate) fn find(err: &(dyn std::error::Error + 'static)) -> Option<Self> {
        let mut current = Some(err);
        while let Some(err) = current {
            if let Some(tls) = err.downcast_ref::<rustls::Error>() {
                return Some(Self::from_rustls(tls));
            }
            // The redis crate keeps its cause as an `Arc`, which hides the
            // cause's type.
            if let Some(shared) = err.downcast_ref::<Arc<dyn std::error::Error + Send + Sync>>() {
                current = Some(shared.as_ref());
                continue;
            }
            if let Some(io) = err.downcast_ref::<std::io::Error>()
                && let Some(tls) = io
                    .get_ref()
                    .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            {
                return Some(Self::from_rustls(tls));
            }
            current = err.source();
        }
        None
    }

    fn from_rustls(err: &rustls::Error) -> Self {
        match err {
            rustls::Error::InvalidCertificate(cert) => match cert {
                CertificateError::UnknownIssuer => Self::UnknownCa,
                CertificateError::NotValidForName => Self::WrongName(Vec::new()),
                CertificateError::NotValidForNameContext { presented, .. } => {
                    Self::WrongName(presented.iter().map(|name| plain_name(name)).collect())
                }
                CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                    Self::Expired
                }
                CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                    Self::NotYetValid
                }
                other => Self::Certificate(other.to_string()),
            },
            rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
                Self::NotTls
            }
            rustls::Error::AlertReceived(alert) => Self::Alert(format!("{alert:?}")),
            other => Self::Other(other.to_string()),
        }
    }

    /// The problem as the end of a sentence about the server, whose host
    /// name is `host`.
    pub(crate) fn detail(&self, host: &str) -> String {
        match self {
            // The caller says which CAs are trusted, after "(unknown issuer".
            Self::UnknownCa => "its TLS certificate is not signed by a trusted CA".to_string(),
            Self::WrongName(names) if names.is_empty() => {
                format!("its TLS certificate is not issued for the host name `{host}`")
            }
            Self::WrongName(names) => format!(
                "its TLS certificate is not issued for the host name `{host}` (it names {})",
                names.join(", ")
            ),
            Self::Expired => "its TLS certificate has expired".to_string(),
            Self::NotYetValid => "its TLS certificate is not valid yet".to_string(),
            Self::Certificate(reason) => format!("its TLS certificate was refused: {reason}"),
            Self::NotTls => "it does not answer in TLS (a plaintext port?)".to_string(),
            Self::Alert(alert) => format!("it ended the TLS handshake ({alert})"),
            Self::Other(reason) => format!("the TLS handshake failed: {reason}"),
        }
    }
}

/// `localhost` for webpki's `DnsName("localhost")`, `127.0.0.1` for
/// `IpAddress(127.0.0.1)`.
fn plain_name(name: &str) -> String {
    name.strip_prefix("DnsName(\"")
        .and_then(|rest| rest.strip_suffix("\")"))
        .or_else(|| {
            name.strip_prefix("IpAddress(")
                .and_then(|rest| rest.strip_suffix(')'))
        })
        .unwrap_or(name)
        .to_string()
}

/// The host part of `host:port` (an IPv6 address without its brackets).
pub(crate) fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// Accepts any certificate, as libpq's and sqlx's `sslmode=require` do;
/// the handshake's signatures are still checked.
#[derive(Debug)]
struct AnyCertificate {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rustls_errors_are_found_behind_io_errors_and_named() {
        let wrapped = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
        );
        assert_eq!(Problem::find(&wrapped), Some(Problem::UnknownCa));
        let shared: Arc<dyn std::error::Error + Send + Sync> = Arc::new(wrapped);
        assert_eq!(Problem::find(&shared), Some(Problem::UnknownCa));
        let plain = std::io::Error::other("connection reset");
        assert_eq!(Problem::find(&plain), None);
        assert_eq!(plain_name("DnsName(\"localhost\")"), "localhost");
        assert_eq!(plain_name("IpAddress(127.0.0.1)"), "127.0.0.1");
        let name = Problem::WrongName(vec!["localhost".into()]);
        assert_eq!(
            name.detail("127.0.0.1"),
            "its TLS certificate is not issued for the host name `127.0.0.1` (it names localhost)"
        );
        assert_eq!(host_of("[::1]:6379"), "::1");
        assert_eq!(host_of("cache:6380"), "cache");
    }
}
