//! Requests to the service's router in the test's process, without a
//! network port: [`TestClient`].

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{Request, StatusCode, header};
use tower::ServiceExt as _;

/// The largest response body a test reads.
const BODY_LIMIT: usize = 16 * 1024 * 1024;

/// Calls the routes of a router (the service's, with its state) as a
/// client would, with no listener in between.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use axum::Router;
/// use axum::routing::post;
///
/// let router = Router::new().route("/echo", post(|body: String| async move { body }));
/// let client = kit::testing::TestClient::new(router);
///
/// let response = client.post_json("/echo", &serde_json::json!({"sku": "tea"})).await;
/// assert_eq!(response.status(), 200);
/// assert_eq!(response.json()["sku"], "tea");
/// assert_eq!(client.get("/nowhere").await.status(), 404);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct TestClient {
    router: Router,
}

impl TestClient {
    /// A client of `router`.
    pub fn new(router: Router) -> Self {
        Self { router }
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> TestResponse {
        self.request(
            Request::get(path)
                .body(Body::empty())
                .expect("a GET request"),
        )
        .await
    }

    /// `POST path` with `body` as JSON.
    pub async fn post_json(&self, path: &str, body: &serde_json::Value) -> TestResponse {
        self.request(
            Request::post(path)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(body.to_string()))
                .expect("a POST request"),
        )
        .await
    }

    /// Sends `request` and reads the whole response.
    pub async fn request(&self, request: Request<Body>) -> TestResponse {
        let response = self
            .router
            .clone()
            .oneshot(request)
            .await
            .unwrap_or_else(|never| match never {});
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), BODY_LIMIT)
            .await
            .expect("the response body is readable");
        TestResponse { status, body }
    }
}

/// A response's status and body.
#[derive(Debug, Clone)]
pub struct TestResponse {
    status: StatusCode,
    body: Bytes,
}

impl TestResponse {
    /// The status code.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The body as text (lossy UTF-8).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON.
    ///
    /// # Panics
    ///
    /// When it is not JSON; the message shows the status and the body.
    #[track_caller]
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|err| {
            panic!(
                "the response ({}) is not JSON ({err}): {}",
                self.status,
                self.text()
            )
        })
    }
}
