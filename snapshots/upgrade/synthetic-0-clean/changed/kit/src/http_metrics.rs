//! The HTTP server's metrics: how long each request took, by method, route
//! and status (`http_server_request_duration_seconds`, the OpenTelemetry
//! HTTP convention's `http.server.request.duration` under Prometheus
//! naming), served in the Prometheus text format on `GET /metrics`.
//!
//! The route is the one the request matched (`/orders/{id}`, never the
//! path with its ids, so the labels stay few); a request that matched no
//! route counts as `unmatched`. The instruments are the process's own, so
//! the middleware and the route need no state:
//!
//! ```
//! use axum::Router;
//! use kit::http_metrics;
//!
//! let app: Router = Router::new()
//!     .merge(http_metrics::routes())
//!     .layer(axum::middleware::from_fn(http_metrics::track));
//! ```

use std::sync::LazyLock;
use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, Request};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// `method="GET",route="/healthz",status="200"`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: String,
    route: String,
    status: u16,
}

type Durations = Family<RequestLabels, Histogram, fn() -> Histogram>;

/// Buckets from 1 ms to about 33 s.
fn histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// The process's request durations and the registry that exports them.
struct Instruments {
    durations: Durations,
    registry: Registry,
}

static INSTRUMENTS: LazyLock<Instruments> = LazyLock::new(|| {
    let durations: Durations = Family::new_with_constructor(histogram);
    let mut registry = Registry::default();
    registry.sub_registry_with_prefix("http_server").register(
        "request_duration_seconds",
        "How long HTTP requests took, by method, matched route and status",
        durations.clone(),
    );
    Instruments {
        durations,
        registry,
    }
});

/// Middleware that times every request it wraps.
pub async fn track(request: Request, next: Next) -> Response {
    let method = request.method().to_string();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |path| path.as_str().to_string());
    let started = Instant::now();
    let response = next.run(request).await;
    INSTRUMENTS
        .durations
        .get_or_create(&RequestLabels {
            method,
            route,
            status: response.status().as_u16(),
        })
        .observe(started.elapsed().as_secs_f64());
    response
}

/// The metrics in the Prometheus text format.
pub fn render() -> String {
    let mut text = String::new();
    encode(&mut text, &INSTRUMENTS.registry).expect("writing to a String cannot fail");
    text
}

/// `GET /metrics`.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new().route(
        "/metrics",
        get(|| async {
            (
                [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                render(),
            )
                .into_response()
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// GETs `path` from `addr` over a plain connection; the whole response.
    async fn fetch(addr: std::net::SocketAddr, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    #[tokio::test]
    async fn requests_are_timed_by_matched_route_and_status() {
        let app: Router = Router::new()
            .route("/orders/{id}", get(|| async { "one order" }))
            .merge(routes())
            .layer(axum::middleware::from_fn(track));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        for path in ["/orders/7", "/orders/8", "/nowhere"] {
            fetch(addr, path).await;
        }
        let text = fetch(addr, "/metrics").await;
        let count = |labels: &str| {
            text.lines()
                .find_map(|line| {
                    line.strip_prefix(&format!(
                        "http_server_request_duration_seconds_count{{{labels}}} "
                    ))
                })
                .and_then(|n| n.trim().parse::<u64>().ok())
        };
        assert_eq!(
            count(r#"method="GET",route="/orders/{id}",status="200""#),
            Some(2),
            "{text}"
        );
        assert_eq!(
            count(r#"method="GET",route="unmatched",status="404""#),
            Some(1),
            "{text}"
        );
    }
}
