//! TLS to Postgres as the project's sqlx (0.8, rustls) makes it, for the
//! `postgres` check. `sslmode` `disable` and `allow` connect in plaintext;
//! `prefer` (the default) uses TLS when the server offers it and `require`
//! insists on it, neither checking the certificate (so `sslrootcert` is
//! not read there); `verify-ca` and `verify-full` check that the
//! certificate chains to the public web roots or to `sslrootcert`, and the
//! host name, which sqlx 0.8 checks under `verify-ca` too (sqlx issue
//! #3793). `sslcert` and `sslkey` give a client certificate. `PGSSLMODE`,
//! `PGSSLROOTCERT`, `PGSSLCERT` and `PGSSLKEY` apply where the URL does
//! not say, as in sqlx.
//!
//! The postgres crate knows neither `verify-ca`/`verify-full` nor the file
//! parameters, so they are taken out of the URL here and applied through
//! the TLS connector.

use std::path::Path;

use postgres::Client;
use postgres::config::SslMode as WireMode;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::environment::Settings;
use super::tls::{self, ClientIdentity, Problem, Verify};

/// `sslmode`, as sqlx reads it (in any case).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Option<Self> {
        Some(match value.to_ascii_lowercase().as_str() {
            "disable" => Self::Disable,
            "allow" => Self::Allow,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            _ => return None,
        })
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Allow => "allow",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }

    /// What the postgres crate is told: sqlx's `allow` is plaintext, and
    /// the verifying modes insist on TLS (the connector verifies).
    fn wire(self) -> WireMode {
        match self {
            Self::Disable | Self::Allow => WireMode::Disable,
            Self::Prefer => WireMode::Prefer,
            Self::Require | Self::VerifyCa | Self::VerifyFull => WireMode::Require,
        }
    }

    fn verifies(self) -> bool {
        matches!(self, Self::VerifyCa | Self::VerifyFull)
    }

    fn uses_tls(self) -> bool {
        !matches!(self, Self::Disable | Self::Allow)
    }
}

/// A file setting (`sslrootcert` and the like).
pub(crate) struct FileSetting {
    pub(crate) value: String,
    /// The name it was given by: the URL parameter or the `PGSSL*` variable.
    pub(crate) name: &'static str,
    /// Where it is changed, for a fix: `DATABASE_URL in .env`, `the environment`.
    pub(crate) place: String,
}

/// DATABASE_URL's TLS settings, over the `PGSSL*` variables.
pub(crate) struct TlsSettings {
    pub(crate) mode: SslMode,
    pub(crate) root_cert: Option<FileSetting>,
    client_cert: Option<FileSetting>,
    client_key: Option<FileSetting>,
}

/// A setting that cannot be used: the detail and the fix of the finding.
pub(crate) type Unusable = (String, String);

impl TlsSettings {
    /// The settings of `url` (whose TLS parameters are returned by
    /// [`take_sqlx_params`] as `params`), then of the variables, as sqlx
    /// reads them: a `PGSSLMODE` it does not know is ignored, as sqlx does.
    pub(crate) fn read(
        params: &[(String, String)],
        settings: &Settings,
        config: &postgres::Config,
    ) -> Result<Self, Unusable> {
        let url_place = format!("DATABASE_URL in {}", settings.where_set("DATABASE_URL"));
        let param = |keys: &[&str]| {
            params
                .iter()
                .rev()
                .find(|(key, _)| keys.contains(&key.as_str()))
                .map(|(_, value)| value.clone())
        };
        let file = |keys: &[&'static str], variable: &'static str| match param(keys) {
            Some(value) => Some(FileSetting {
                value,
                name: keys[0],
                place: url_place.clone(),
            }),
            None => settings.get(variable).map(|value| FileSetting {
                value: value.to_string(),
                name: variable,
                place: settings.where_set(variable).to_string(),
            }),
        };
        let mode = match param(&["sslmode", "ssl-mode"]) {
            Some(value) => SslMode::parse(&value).ok_or_else(|| {
                (
                    format!(
                        "sslmode `{value}` is not one of disable, allow, prefer, require, \
                         verify-ca, verify-full"
                    ),
                    format!("correct sslmode ({url_place})"),
                )
            })?,
            None => match settings.get("PGSSLMODE").and_then(SslMode::parse) {
                Some(mode) => mode,
                // A `key=value` string has its own `sslmode`, parsed already.
                None => match config.get_ssl_mode() {
                    WireMode::Disable => SslMode::Disable,
                    WireMode::Require => SslMode::Require,
                    _ => SslMode::Prefer,
                },
            },
        };
        Ok(Self {
            mode,
            root_cert: file(&["sslrootcert", "ssl-root-cert", "ssl-ca"], "PGSSLROOTCERT"),
            client_cert: file(&["sslcert", "ssl-cert"], "PGSSLCERT"),
            client_key: file(&["sslkey", "ssl-key"], "PGSSLKEY"),
        })
    }

    /// The mode to give the postgres crate.
    pub(crate) fn wire_mode(&self) -> WireMode {
        self.mode.wire()
    }

    /// The TLS connector of these settings, reading the files it needs as
    /// sqlx does: the CA only where the certificate is verified, the
    /// client's certificate wherever TLS may be used (relative paths from
    /// the project directory `root`).
    pub(crate) fn connector(&self, root: &Path) -> Result<MakeRustlsConnect, Unusable> {
        let unusable = |detail: String, setting: &FileSetting| {
            (
                detail,
                format!("correct {} ({})", setting.name, setting.place),
            )
        };
        let ca = match &self.root_cert {
            Some(setting) if self.mode.verifies() => {
                certificates(root, setting).map_err(|err| unusable(err, setting))?
            }
            _ => Vec::new(),
        };
        let client = match (&self.client_cert, &self.client_key) {
            _ if !self.mode.uses_tls() => None,
            (None, None) => None,
            (Some(cert), Some(key)) => Some(ClientIdentity {
                chain: certificates(root, cert).map_err(|err| unusable(err, cert))?,
                key: tls::read_key(root, &key.value, key.name).map_err(|err| unusable(err, key))?,
            }),
            (Some(one), None) | (None, Some(one)) => {
                return Err(unusable(
                    format!(
                        "{} is set alone: a client certificate needs sslcert and sslkey",
                        one.name
                    ),
                    one,
                ));
            }
        };
        let verify = if self.mode.verifies() {
            Verify::Certificate
        } else {
            Verify::Nothing
        };
        tls::client_config(verify, &ca, client)
            .map(MakeRustlsConnect::new)
            .map_err(|err| match &self.root_cert {
                Some(setting) => unusable(err, setting),
                None => (err, "check the TLS settings in DATABASE_URL".to_string()),
            })
    }

    /// How `client` is connected, as the end of the finding: ` over TLS
    /// (TLSv1.3; ...)`, or nothing for plaintext.
    pub(crate) fn describe_connection(&self, client: &mut Client) -> String {
        let row = client.query_opt(
            "SELECT version FROM pg_stat_ssl WHERE pid = pg_backend_pid() AND ssl",
            &[],
        );
        let Ok(Some(row)) = row else {
            return String::new();
        };
        let version = row
            .get::<_, Option<String>>(0)
            .unwrap_or_else(|| "TLS".to_string());
        let mode = self.mode.name();
        let checked = if self.mode.verifies() {
            format!("certificate and host name verified, sslmode={mode}")
        } else {
            let mut text = format!("certificate not verified, sslmode={mode}");
            if let Some(root_cert) = &self.root_cert {
                text += &format!(
                    "; {} is used by verify-ca and verify-full only",
                    root_cert.name
                );
            }
            text
        };
        format!(" over TLS ({version}; {checked})")
    }

    /// The detail (after the target) and the fix of a connection that
    /// failed for TLS, if it did; `host` is the name connected to.
    pub(crate) fn refused(
        &self,
        err: &postgres::Error,
        reason: &str,
        host: &str,
        where_set: &str,
    ) -> Option<Unusable> {
        let mode = self.mode.name();
        if reason == "server does not support TLS" {
            return Some((
                format!("the server does not support TLS, which sslmode={mode} requires"),
                format!(
                    "turn on TLS in the server (ssl = on, with a certificate), or set \
                     sslmode=prefer in DATABASE_URL ({where_set}) to allow plaintext"
                ),
            ));
        }
        let problem = Problem::find(err)?;
        let mut detail = problem.detail(host);
        let fix = match &problem {
            Problem::UnknownCa => match &self.root_cert {
                Some(root_cert) => {
                    detail += &format!(
                        " (unknown issuer; trusted: the public web roots and {} `{}`)",
                        root_cert.name, root_cert.value
                    );
                    format!(
                        "point {} at the PEM file of the CA that signed the server's \
                         certificate ({})",
                        root_cert.name, root_cert.place
                    )
                }
                None => {
                    detail += " (unknown issuer; trusted: the public web roots)";
                    format!(
                        "add sslrootcert=<PEM file of the CA that signed the server's \
                         certificate> to DATABASE_URL ({where_set})"
                    )
                }
            },
            Problem::WrongName(names) => {
                if self.mode == SslMode::VerifyCa {
                    detail += "; the project's sqlx 0.8 checks the host name under verify-ca too";
                }
                let names = match names.as_slice() {
                    [] => String::new(),
                    names => format!(" ({})", names.join(", ")),
                };
                format!(
                    "connect by a name the certificate is issued for{names} in DATABASE_URL \
                     ({where_set}), or issue the server's certificate for `{host}`"
                )
            }
            Problem::Expired | Problem::NotYetValid => {
                "renew the server's certificate, and check this machine's clock".to_string()
            }
            Problem::Alert(_) => format!(
                "check the server's TLS settings, and sslcert and sslkey in DATABASE_URL \
                 ({where_set}) if it asks for a client certificate"
            ),
            Problem::Certificate(_) | Problem::NotTls | Problem::Other(_) => format!(
                "check the server's TLS settings, and the host and port in DATABASE_URL \
                 ({where_set})"
            ),
        };
        Some((detail, fix))
    }
}

/// The certificates of a setting: inline PEM (as sqlx takes it), or the
/// file it names.
fn certificates(
    root: &Path,
    setting: &FileSetting,
) -> Result<Vec<CertificateDer<'static>>, String> {
    let value = setting.value.trim();
    if value.starts_with("-----BEGIN") {
        CertificateDer::pem_slice_iter(value.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|err| format!("{} is not a PEM certificate: {err}", setting.name))
    } else {
        tls::read_certificates(root, &setting.value, setting.name)
    }
}

/// The URL with the query parameters that sqlx reads and the postgres
/// crate does not taken out: the TLS ones, returned decoded and in order,
/// and sqlx's own `statement-cache-capacity` and `options[..]`, which do
/// not change whether a connection can be made. Anything but a URL is
/// left as it is.
pub(crate) fn take_sqlx_params(url: &str) -> (String, Vec<(String, String)>) {
    const TLS: &[&str] = &[
        "sslmode",
        "ssl-mode",
        "sslrootcert",
        "ssl-root-cert",
        "ssl-ca",
        "sslcert",
        "ssl-cert",
        "sslkey",
        "ssl-key",
    ];
    let is_url = url.starts_with("postgres://") || url.starts_with("postgresql://");
    let Some((base, query)) = url.split_once('?').filter(|_| is_url) else {
        return (url.to_string(), Vec::new());
    };
    let (query, fragment) = match query.split_once('#') {
        Some((query, fragment)) => (query, Some(fragment)),
        None => (query, None),
    };
    let mut kept = Vec::new();
    let mut taken = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let key = decode(key);
        if TLS.contains(&key.as_str()) {
            taken.push((key, decode(value)));
        } else if key != "statement-cache-capacity" && !key.starts_with("options[") {
            kept.push(pair);
        }
    }
    let mut rest = base.to_string();
    if !kept.is_empty() {
        rest = format!("{rest}?{}", kept.join("&"));
    }
    if let Some(fragment) = fragment {
        rest = format!("{rest}#{fragment}");
    }
    (rest, taken)
}

/// A query component decoded as URL parsers decode it (`%XX`, and `+` for
/// a space); invalid UTF-8 is replaced.
fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tls_parameters_are_taken_out_of_the_url_and_decoded() {
        let (rest, taken) = take_sqlx_params(
            "postgres://app:pw@db:5432/shop?sslmode=verify-full&application_name=x\
             &sslrootcert=%2Fetc%2Fca%20file.pem&statement-cache-capacity=5&ssl-mode=Require",
        );
        assert_eq!(rest, "postgres://app:pw@db:5432/shop?application_name=x");
        assert_eq!(
            taken,
            [
                ("sslmode".to_string(), "verify-full".to_string()),
                ("sslrootcert".to_string(), "/etc/ca file.pem".to_string()),
                ("ssl-mode".to_string(), "Require".to_string()),
            ]
        );
        let (rest, taken) = take_sqlx_params("postgres://db/shop?sslmode=require");
        assert_eq!((rest.as_str(), taken.len()), ("postgres://db/shop", 1));
        let (rest, taken) = take_sqlx_params("host=db sslmode=require");
        assert_eq!((rest.as_str(), taken.len()), ("host=db sslmode=require", 0));
        assert_eq!(decode("a%2"), "a%2");
        assert_eq!(SslMode::parse("Verify-CA"), Some(SslMode::VerifyCa));
        assert_eq!(SslMode::parse("verify"), None);
    }
}
