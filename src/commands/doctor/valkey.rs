//! The Valkey check: the queue server that the project's settings name
//! (`VALKEY_URL`, or `VALKEY_ADDR`/`VALKEY_USERNAME`/`VALKEY_PASSWORD`/
//! `VALKEY_DB`; the sentinels or cluster nodes when those are set) answers
//! `PING`, with the credentials the worker would give it: the sentinels'
//! own (`VALKEY_SENTINEL_USERNAME`/`VALKEY_SENTINEL_PASSWORD`), the
//! server's for the cluster nodes.
//!
//! TLS as the project's binaries make it: for `rediss://` and `valkeys://`
//! URLs, and for `VALKEY_ADDR`, the sentinels and the cluster nodes with
//! `VALKEY_TLS=true`, trusting the public web roots, or only the CA of
//! `VALKEY_CA_CERT` when it is set (the redis crate with rustls, as the
//! project's). The settings the project's configuration refuses (both
//! `VALKEY_TLS` and `VALKEY_URL`, a CA without TLS, a URL with a query or a
//! fragment such as `#insecure`) fail here too.

use std::path::Path;
use std::time::Duration;

use redis::TlsCertificates;

use super::environment::Settings;
use super::report::Finding;
use super::tls::{self, Problem};
use crate::domain::url_part::encode;

const CHECK: &str = "valkey";

/// How long a server may take to answer before it counts as unreachable.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Whether and how connections use TLS.
struct Tls {
    on: bool,
    /// The PEM file of `VALKEY_CA_CERT`, as given and as read.
    ca: Option<(String, Vec<u8>)>,
}

/// Pings the server (or each sentinel or cluster node) the settings name;
/// `VALKEY_CA_CERT` is relative to the project directory `root`.
pub(crate) fn check(root: &Path, settings: &Settings) -> Finding {
    let tls_flag = match settings.get("VALKEY_TLS").map(str::trim) {
        None | Some("") => None,
        Some(value) => match parse_bool(value) {
            Some(flag) => Some(flag),
            None => {
                return Finding::fail(
                    CHECK,
                    format!("VALKEY_TLS is `{value}`, not true or false"),
                    format!(
                        "set VALKEY_TLS to true or false in {}",
                        settings.where_set("VALKEY_TLS")
                    ),
                );
            }
        },
    };
    let url = settings.get("VALKEY_URL").map(|url| {
        url.replacen("valkeys://", "rediss://", 1)
            .replacen("valkey://", "redis://", 1)
    });
    if let Some(refused) = url
        .as_deref()
        .and_then(|url| refused_url(url, tls_flag, settings))
    {
        return refused;
    }
    let on = match &url {
        Some(url) => url.starts_with("rediss://"),
        None => tls_flag.unwrap_or(false),
    };
    let tls = match tls_settings(root, on, settings) {
        Ok(tls) => tls,
        Err(finding) => return finding,
    };
    for (list, role, user, password) in [
        (
            "VALKEY_SENTINEL_ADDRS",
            "sentinel",
            "VALKEY_SENTINEL_USERNAME",
            "VALKEY_SENTINEL_PASSWORD",
        ),
        (
            "VALKEY_CLUSTER_ADDRS",
            "cluster node",
            "VALKEY_USERNAME",
            "VALKEY_PASSWORD",
        ),
    ] {
        if let Some(addrs) = settings.get(list) {
            let credentials = Credentials {
                userinfo: userinfo(settings, user, password),
                variables: [user, password],
            };
            return check_each(settings, list, role, addrs, &credentials, &tls);
        }
    }
    if let Some(url) = url {
        let shown = without_password(&url);
        let target = Target {
            shown: &shown,
            host: url_host(&url),
            variable: "VALKEY_URL",
        };
        return ping(&url, &target, &URL_CREDENTIALS, settings, &tls);
    }
    let addr = settings.get("VALKEY_ADDR").unwrap_or("localhost:6379");
    let db = settings.get("VALKEY_DB").unwrap_or("0");
    let credentials = Credentials {
        userinfo: userinfo(settings, "VALKEY_USERNAME", "VALKEY_PASSWORD"),
        variables: ["VALKEY_USERNAME", "VALKEY_PASSWORD"],
    };
    let url = format!("{}://{}{addr}/{db}", scheme(&tls), credentials.userinfo);
    let target = Target {
        shown: addr,
        host: tls::host_of(addr),
        variable: "VALKEY_ADDR",
    };
    ping(&url, &target, &credentials, settings, &tls)
}

/// The server a check PINGs: how messages name it, its host (for TLS
/// messages), and the variable that names it.
struct Target<'a> {
    shown: &'a str,
    host: &'a str,
    variable: &'a str,
}

/// The user and password a connection gives, and the variables that set them.
struct Credentials {
    /// `user:password@`, `:password@` or nothing, encoded for a URL.
    userinfo: String,
    /// The variables of the user and of the password.
    variables: [&'static str; 2],
}

/// `VALKEY_URL` holds its own credentials.
const URL_CREDENTIALS: Credentials = Credentials {
    userinfo: String::new(),
    variables: ["VALKEY_URL", "VALKEY_URL"],
};

/// The user-info part of a URL for the user `user` and password
/// `password` (variable names) of the settings; a user alone sends no AUTH.
fn userinfo(settings: &Settings, user: &str, password: &str) -> String {
    let user = settings.get(user).filter(|u| !u.trim().is_empty());
    match settings.get(password) {
        Some(password) => format!("{}:{}@", encode(user.unwrap_or("")), encode(password)),
        None => String::new(),
    }
}

/// The finding for a `VALKEY_URL` that the project's configuration refuses
/// along with the other settings, if it does.
fn refused_url(url: &str, tls_flag: Option<bool>, settings: &Settings) -> Option<Finding> {
    let where_set = settings.where_set("VALKEY_URL");
    if settings.get("VALKEY_ADDR").is_some() {
        return Some(Finding::fail(
            CHECK,
            "both VALKEY_URL and VALKEY_ADDR are set",
            "keep one of them: VALKEY_URL, or VALKEY_ADDR with VALKEY_PASSWORD and VALKEY_DB",
        ));
    }
    if tls_flag.is_some() {
        return Some(Finding::fail(
            CHECK,
            "both VALKEY_TLS and VALKEY_URL are set",
            "with VALKEY_URL the scheme says whether TLS is on: use rediss:// or valkeys:// \
             and unset VALKEY_TLS",
        ));
    }
    if url.contains('?') || url.contains('#') {
        return Some(Finding::fail(
            CHECK,
            "VALKEY_URL has a query or a fragment (such as #insecure), which the project does \
             not accept",
            format!("remove it from VALKEY_URL in {where_set}"),
        ));
    }
    None
}

/// TLS as the settings ask, with `VALKEY_CA_CERT` read when set.
fn tls_settings(root: &Path, on: bool, settings: &Settings) -> Result<Tls, Finding> {
    let Some(path) = settings.get("VALKEY_CA_CERT") else {
        return Ok(Tls { on, ca: None });
    };
    let where_set = settings.where_set("VALKEY_CA_CERT");
    if !on {
        return Err(Finding::fail(
            CHECK,
            "VALKEY_CA_CERT is set but TLS is off",
            "set VALKEY_TLS=true, or use rediss:// in VALKEY_URL, or unset VALKEY_CA_CERT",
        ));
    }
    match tls::read_pem(root, path, "VALKEY_CA_CERT") {
        Ok(pem) => Ok(Tls {
            on,
            ca: Some((path.to_string(), pem)),
        }),
        Err(err) => Err(Finding::fail(
            CHECK,
            err,
            format!(
                "set VALKEY_CA_CERT in {where_set} to the PEM file of the CA that signed the \
                 server's certificate"
            ),
        )),
    }
}

fn scheme(tls: &Tls) -> &'static str {
    if tls.on { "rediss" } else { "redis" }
}

/// `1`, `true`, `yes`, `0`, `false`, `no` (in any case), as the project's
/// configuration reads a flag.
fn parse_bool(value: &str) -> Option<bool> {
    match value.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" => Some(true),
        "0" | "false" | "no" => Some(false),
        _ => None,
    }
}

/// The host of a `redis://` URL, for TLS messages.
fn url_host(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = &rest[..rest.find('/').unwrap_or(rest.len())];
    let host_port = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    if host_port.contains(':') {
        tls::host_of(host_port)
    } else {
        host_port
    }
}

/// Pings each address of the comma-separated list `addrs`.
fn check_each(
    settings: &Settings,
    list: &str,
    role: &str,
    addrs: &str,
    credentials: &Credentials,
    tls: &Tls,
) -> Finding {
    let mut answered = Vec::new();
    for addr in addrs.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        let url = format!("{}://{}{addr}", scheme(tls), credentials.userinfo);
        let target = Target {
            shown: addr,
            host: tls::host_of(addr),
            variable: list,
        };
        let finding = ping(&url, &target, credentials, settings, tls);
        if finding.status != super::report::Status::Ok {
            return finding;
        }
        answered.push(addr);
    }
    let over = if tls.on { " over TLS" } else { "" };
    Finding::ok(
        CHECK,
        format!(
            "every {role} in {list} answered PING{over}: {}",
            answered.join(", ")
        ),
    )
}

/// PINGs the server at `url`, the `target`'s, with `credentials`.
fn ping(
    url: &str,
    target: &Target,
    credentials: &Credentials,
    settings: &Settings,
    tls: &Tls,
) -> Finding {
    let Target {
        shown,
        host,
        variable,
    } = *target;
    let where_set = settings.where_set(variable);
    let client = if tls.on {
        tls::provider();
        redis::Client::build_with_tls(
            url,
            TlsCertificates {
                client_tls: None,
                root_cert: tls.ca.as_ref().map(|(_, pem)| pem.clone()),
            },
        )
    } else {
        redis::Client::open(url)
    };
    let answer = client.and_then(|client| {
        let mut connection = client.get_connection_with_timeout(TIMEOUT)?;
        connection.set_read_timeout(Some(TIMEOUT))?;
        let _: String = redis::cmd("PING").query(&mut connection)?;
        let info: String = redis::cmd("INFO").arg("server").query(&mut connection)?;
        Ok(server_version(&info))
    });
    if let Err(err) = &answer
        && tls.on
        && let Some(problem) = Problem::find(err)
    {
        return tls_refused(&problem, shown, host, variable, settings, tls);
    }
    let over = if tls.on { " over TLS" } else { "" };
    match answer {
        Ok(version) => Finding::ok(CHECK, format!("{shown} answered PING{over} ({version})")),
        Err(err) if is_auth(&err) => {
            let [user, password] = credentials.variables;
            let named = if user == password {
                user.to_string()
            } else {
                format!("{user} or {password}")
            };
            let where_set = settings.where_set(password);
            Finding::fail(
                CHECK,
                format!(
                    "{shown} refused the credentials: {}",
                    err.detail().unwrap_or("")
                ),
                format!("correct the user or password ({named}, in {where_set})"),
            )
        }
        Err(err) if err.is_connection_refusal() || err.is_timeout() || err.is_io_error() => {
            // A server without TLS waits for the end of a command line that
            // a TLS handshake need not send; a server that speaks only TLS
            // drops a plaintext connection.
            let hint = if err.is_connection_refusal() {
                ""
            } else if tls.on {
                "; a server without TLS on that port does not answer a TLS handshake"
            } else if err.is_connection_dropped() {
                "; a server that speaks only TLS needs rediss:// in VALKEY_URL, or VALKEY_TLS=true"
            } else {
                ""
            };
            Finding::fail(
                CHECK,
                format!("cannot connect to {shown}{over}: {err}"),
                format!("start Valkey, or correct {variable} in {where_set}{hint}"),
            )
        }
        Err(err) => Finding::fail(
            CHECK,
            format!("{shown}: {err}"),
            format!("check {variable} in {where_set}"),
        ),
    }
}

/// The finding for a TLS handshake that failed.
fn tls_refused(
    problem: &Problem,
    shown: &str,
    host: &str,
    variable: &str,
    settings: &Settings,
    tls: &Tls,
) -> Finding {
    let where_set = settings.where_set(variable);
    let ca_where = settings.where_set("VALKEY_CA_CERT");
    let mut detail = format!("{shown}: {}", problem.detail(host));
    let fix = match problem {
        Problem::UnknownCa => match &tls.ca {
            Some((path, _)) => {
                detail += &format!(" (unknown issuer; trusted: VALKEY_CA_CERT `{path}`)");
                format!(
                    "point VALKEY_CA_CERT ({ca_where}) at the PEM file of the CA that signed \
                     the server's certificate"
                )
            }
            None => {
                detail += " (unknown issuer; trusted: the public web roots)";
                format!(
                    "set VALKEY_CA_CERT in {ca_where} to the PEM file of the CA that signed the \
                     server's certificate"
                )
            }
        },
        Problem::WrongName(names) => {
            let names = match names.as_slice() {
                [] => String::new(),
                names => format!(" ({})", names.join(", ")),
            };
            format!(
                "connect by a name the certificate is issued for{names} in {variable} \
                 ({where_set}), or issue the server's certificate for `{host}`"
            )
        }
        Problem::Expired | Problem::NotYetValid => {
            "renew the server's certificate, and check this machine's clock".to_string()
        }
        Problem::NotTls => format!(
            "name the server's TLS port in {variable} ({where_set}), or connect without TLS \
             (redis://, VALKEY_TLS unset) if the server has none"
        ),
        Problem::Alert(_) => "check the server's TLS settings: if it asks for client \
                              certificates (tls-auth-clients), make that optional, as the \
                              project sends none"
            .to_string(),
        Problem::Certificate(_) | Problem::Other(_) => {
            format!("check the server's TLS settings, and {variable} in {where_set}")
        }
    };
    Finding::fail(CHECK, detail, fix)
}

fn is_auth(err: &redis::RedisError) -> bool {
    matches!(err.kind(), redis::ErrorKind::AuthenticationFailed)
        || matches!(err.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM"))
}

/// `Valkey 8.0.1` or `Redis 7.0.15`, from `INFO server`.
fn server_version(info: &str) -> String {
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name))
            .map(str::trim)
    };
    match (field("valkey_version:"), field("redis_version:")) {
        (Some(version), _) => format!("Valkey {version}"),
        (None, Some(version)) => format!("Redis {version}"),
        (None, None) => "version unknown".to_string(),
    }
}

/// The URL with its password, if any, replaced by `***`.
fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{host}{path}")
        }
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_hidden_and_encoded() {
        assert_eq!(
            without_password("redis://app:s3cret@cache:6379/2"),
            "redis://app:***@cache:6379/2"
        );
        assert_eq!(without_password("redis://cache:6379"), "redis://cache:6379");
    }

    #[test]
    fn the_server_and_the_sentinels_each_get_their_own_credentials() {
        let mut settings = Settings::default();
        settings.use_dev_run("VALKEY_USERNAME", "app");
        settings.use_dev_run("VALKEY_PASSWORD", "p@ss");
        settings.use_dev_run("VALKEY_SENTINEL_PASSWORD", "s:cret");
        assert_eq!(
            userinfo(&settings, "VALKEY_USERNAME", "VALKEY_PASSWORD"),
            "app:p%40ss@"
        );
        assert_eq!(
            userinfo(
                &settings,
                "VALKEY_SENTINEL_USERNAME",
                "VALKEY_SENTINEL_PASSWORD"
            ),
            ":s%3Acret@"
        );
        let user_alone = {
            let mut settings = Settings::default();
            settings.use_dev_run("VALKEY_USERNAME", "app");
            settings
        };
        assert_eq!(
            userinfo(&user_alone, "VALKEY_USERNAME", "VALKEY_PASSWORD"),
            ""
        );
    }
}
