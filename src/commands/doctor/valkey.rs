//! The Valkey check: the queue server that the project's settings name
//! (`VALKEY_URL`, or `VALKEY_ADDR`/`VALKEY_PASSWORD`/`VALKEY_DB`; the
//! sentinels or cluster nodes when those are set) answers `PING`.

use std::time::Duration;

use super::environment::Settings;
use super::report::Finding;

const CHECK: &str = "valkey";

/// How long a server may take to answer before it counts as unreachable.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Pings the server (or each sentinel or cluster node) the settings name.
pub fn check(settings: &Settings) -> Finding {
    if settings
        .get("VALKEY_TLS")
        .is_some_and(|tls| tls.trim().eq_ignore_ascii_case("true"))
    {
        return Finding::warn(
            CHECK,
            "not checked: VALKEY_TLS asks for TLS",
            "doctor checks plaintext connections only; start the worker to check this one",
        );
    }
    for (list, role) in [
        ("VALKEY_SENTINEL_ADDRS", "sentinel"),
        ("VALKEY_CLUSTER_ADDRS", "cluster node"),
    ] {
        if let Some(addrs) = settings.get(list) {
            return check_each(settings, list, role, addrs);
        }
    }
    if let Some(url) = settings.get("VALKEY_URL") {
        if settings.get("VALKEY_ADDR").is_some() {
            return Finding::fail(
                CHECK,
                "both VALKEY_URL and VALKEY_ADDR are set",
                "keep one of them: VALKEY_URL, or VALKEY_ADDR with VALKEY_PASSWORD and VALKEY_DB",
            );
        }
        let url = url
            .replacen("valkeys://", "rediss://", 1)
            .replacen("valkey://", "redis://", 1);
        let shown = without_password(&url);
        if url.starts_with("rediss://") {
            return Finding::warn(
                CHECK,
                format!("{shown}: not checked, it asks for TLS"),
                "doctor checks plaintext connections only; start the worker to check this one",
            );
        }
        return ping(&url, &shown, "VALKEY_URL", settings);
    }
    let addr = settings.get("VALKEY_ADDR").unwrap_or("localhost:6379");
    let db = settings.get("VALKEY_DB").unwrap_or("0");
    let password = settings
        .get("VALKEY_PASSWORD")
        .map(|p| format!(":{}@", encode(p)))
        .unwrap_or_default();
    let url = format!("redis://{password}{addr}/{db}");
    ping(&url, addr, "VALKEY_ADDR", settings)
}

/// Pings each address of the comma-separated list `addrs`.
fn check_each(settings: &Settings, list: &str, role: &str, addrs: &str) -> Finding {
    let mut answered = Vec::new();
    for addr in addrs.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        let finding = ping(&format!("redis://{addr}"), addr, list, settings);
        if finding.status != super::report::Status::Ok {
            return finding;
        }
        answered.push(addr);
    }
    Finding::ok(
        CHECK,
        format!(
            "every {role} in {list} answered PING: {}",
            answered.join(", ")
        ),
    )
}

/// PINGs the server at `url`; `shown` names it in messages.
fn ping(url: &str, shown: &str, variable: &str, settings: &Settings) -> Finding {
    let where_set = settings.where_set(variable);
    let answer = redis::Client::open(url).and_then(|client| {
        let mut connection = client.get_connection_with_timeout(TIMEOUT)?;
        connection.set_read_timeout(Some(TIMEOUT))?;
        let _: String = redis::cmd("PING").query(&mut connection)?;
        let info: String = redis::cmd("INFO").arg("server").query(&mut connection)?;
        Ok(server_version(&info))
    });
    match answer {
        Ok(version) => Finding::ok(CHECK, format!("{shown} answered PING ({version})")),
        Err(err) if is_auth(&err) => Finding::fail(
            CHECK,
            format!(
                "{shown} refused the credentials: {}",
                err.detail().unwrap_or("")
            ),
            format!("correct the user or password ({variable} or VALKEY_PASSWORD, in {where_set})"),
        ),
        Err(err) if err.is_connection_refusal() || err.is_timeout() || err.is_io_error() => {
            Finding::fail(
                CHECK,
                format!("cannot connect to {shown}: {err}"),
                format!("start Valkey, or correct {variable} in {where_set}"),
            )
        }
        Err(err) => Finding::fail(
            CHECK,
            format!("{shown}: {err}"),
            format!("check {variable} in {where_set}"),
        ),
    }
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

/// Percent-encodes a password for the user-info part of a URL.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
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
        assert_eq!(encode("p@ss:w/rd"), "p%40ss%3Aw%2Frd");
    }
}
