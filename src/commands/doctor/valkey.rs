//! The Valkey check: the queue server that the project's settings name
//! (`VALKEY_URL`, or `VALKEY_ADDR`/`VALKEY_USERNAME`/`VALKEY_PASSWORD`/
//! `VALKEY_DB`; the sentinels or cluster nodes when those are set) answers
//! `PING`, with the credentials the worker would give it: the sentinels'
//! own (`VALKEY_SENTINEL_USERNAME`/`VALKEY_SENTINEL_PASSWORD`), the
//! server's for the cluster nodes.

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
            return check_each(settings, list, role, addrs, &credentials);
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
        return ping(&url, &shown, "VALKEY_URL", &URL_CREDENTIALS, settings);
    }
    let addr = settings.get("VALKEY_ADDR").unwrap_or("localhost:6379");
    let db = settings.get("VALKEY_DB").unwrap_or("0");
    let credentials = Credentials {
        userinfo: userinfo(settings, "VALKEY_USERNAME", "VALKEY_PASSWORD"),
        variables: ["VALKEY_USERNAME", "VALKEY_PASSWORD"],
    };
    let url = format!("redis://{}{addr}/{db}", credentials.userinfo);
    ping(&url, addr, "VALKEY_ADDR", &credentials, settings)
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

/// Pings each address of the comma-separated list `addrs`.
fn check_each(
    settings: &Settings,
    list: &str,
    role: &str,
    addrs: &str,
    credentials: &Credentials,
) -> Finding {
    let mut answered = Vec::new();
    for addr in addrs.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        let url = format!("redis://{}{addr}", credentials.userinfo);
        let finding = ping(&url, addr, list, credentials, settings);
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
fn ping(
    url: &str,
    shown: &str,
    variable: &str,
    credentials: &Credentials,
    settings: &Settings,
) -> Finding {
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
