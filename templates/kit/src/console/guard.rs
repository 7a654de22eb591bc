//! Who may see the console and act through it:
//!
//! - the token ([`super::Console::token`]): every request carries it, as
//!   `Authorization: Bearer <token>` or in the cookie a browser gets by
//!   opening any page with `?token=<token>` once; without it, 401;
//! - CSRF: every form carries a secret drawn when the console starts, and
//!   a POST without it, or from a page of another origin
//!   (`Sec-Fetch-Site`, `Origin`), is refused (403), so that another site
//!   open in the same browser cannot retry or replay anything;
//! - the read-only mode: every POST is refused (403).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};

use super::State as Console;
use super::page;

/// The cookie that carries the token in a browser.
const COOKIE: &str = "outbox_console_token";

/// The form field that carries the CSRF secret.
pub(crate) const CSRF_FIELD: &str = "csrf";

/// A secret no one can guess: 128 random bits, as hex.
pub(crate) fn new_secret() -> String {
    format!("{:032x}", uuid::Uuid::new_v4().as_u128())
}

/// The middleware in front of every page.
pub(crate) async fn check(
    State(console): State<Arc<Console>>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(token) = &console.options.token {
        if let Some(given) = token_in_query(request.uri().query())
            && same(given.as_bytes(), token.as_bytes())
        {
            // Into the cookie, out of the address bar and the history.
            let path = request.uri().path().to_string();
            let mut response = Redirect::to(&relative_self(&path)).into_response();
            let cookie = format!("{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/");
            if let Ok(value) = cookie.parse() {
                response.headers_mut().insert(header::SET_COOKIE, value);
            }
            return response;
        }
        if !carries(request.headers(), token) {
            return refuse(
                StatusCode::UNAUTHORIZED,
                "This console needs its token (OUTBOX_CONSOLE_TOKEN): open it with \
                 ?token=<token>, or send Authorization: Bearer <token>.",
            );
        }
    }
    if request.method() == Method::POST {
        if console.options.read_only {
            return refuse(
                StatusCode::FORBIDDEN,
                "This console is read-only: it shows, it does not act.",
            );
        }
        if from_another_site(request.headers()) {
            return refuse(
                StatusCode::FORBIDDEN,
                "Refused: the form was sent from another site.",
            );
        }
    }
    next.run(request).await
}

/// Whether a POST's form carried the CSRF secret; its handler calls this
/// with the field it read.
pub(crate) fn csrf_ok(console: &Console, given: Option<&str>) -> bool {
    given.is_some_and(|given| same(given.as_bytes(), console.csrf.as_bytes()))
}

/// The response to a POST without the CSRF secret.
pub(crate) fn csrf_refused() -> Response {
    refuse(
        StatusCode::FORBIDDEN,
        "Refused: the form did not carry the console's CSRF secret (reload the page and try again).",
    )
}

fn refuse(status: StatusCode, message: &str) -> Response {
    (status, page::plain("Refused", message)).into_response()
}

/// The value of `token=` in a query string.
fn token_in_query(query: Option<&str>) -> Option<String> {
    url::form_urlencoded::parse(query?.as_bytes())
        .find(|(name, _)| name == "token")
        .map(|(_, value)| value.into_owned())
}

/// The last segment of `path`, as a link relative to it (the console may be
/// nested under any path).
fn relative_self(path: &str) -> String {
    match path.rsplit('/').next() {
        Some("") | None => "./".to_string(),
        Some(last) => format!("./{last}"),
    }
}

/// Whether the request carries `token` as a bearer token or in the cookie.
fn carries(headers: &HeaderMap, token: &str) -> bool {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    if bearer.is_some_and(|given| same(given.as_bytes(), token.as_bytes())) {
        return true;
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .any(|(name, value)| name == COOKIE && same(value.as_bytes(), token.as_bytes()))
}

/// Whether the browser says the request comes from a page of another site.
fn from_another_site(headers: &HeaderMap) -> bool {
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    if let Some(site) = header("sec-fetch-site") {
        return !matches!(site, "same-origin" | "none");
    }
    match (header("origin"), header("host")) {
        (Some(origin), Some(host)) => {
            origin != "null"
                && origin
                    .split_once("://")
                    .is_none_or(|(_, authority)| authority != host)
        }
        (Some(origin), None) => origin == "null",
        _ => false,
    }
}

/// Compares in a time that does not depend on where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn the_token_is_taken_from_a_bearer_header_or_the_cookie() {
        assert!(carries(
            &headers(&[("authorization", "Bearer s3cret")]),
            "s3cret"
        ));
        assert!(carries(
            &headers(&[("cookie", "a=b; outbox_console_token=s3cret")]),
            "s3cret"
        ));
        assert!(!carries(
            &headers(&[("authorization", "Bearer s3cre")]),
            "s3cret"
        ));
        assert!(!carries(
            &headers(&[("cookie", "outbox_console_token=x")]),
            "s3cret"
        ));
        assert!(!carries(&headers(&[]), "s3cret"));
    }

    #[test]
    fn a_post_from_another_site_is_told_apart() {
        assert!(from_another_site(&headers(&[(
            "sec-fetch-site",
            "cross-site"
        )])));
        assert!(from_another_site(&headers(&[(
            "sec-fetch-site",
            "same-site"
        )])));
        assert!(!from_another_site(&headers(&[(
            "sec-fetch-site",
            "same-origin"
        )])));
        assert!(from_another_site(&headers(&[
            ("origin", "http://evil.example"),
            ("host", "127.0.0.1:9320")
        ])));
        assert!(!from_another_site(&headers(&[
            ("origin", "http://127.0.0.1:9320"),
            ("host", "127.0.0.1:9320")
        ])));
        assert!(!from_another_site(&headers(&[("host", "127.0.0.1:9320")])));
    }

    #[test]
    fn the_token_in_the_address_is_read_and_links_stay_relative() {
        assert_eq!(
            token_in_query(Some("a=1&token=s%20t")).as_deref(),
            Some("s t")
        );
        assert_eq!(token_in_query(Some("a=1")), None);
        assert_eq!(relative_self("/ops/outbox/"), "./");
        assert_eq!(relative_self("/events"), "./events");
    }
}
