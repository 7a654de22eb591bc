//! The health probes, through a real listener: `/healthz` answers while the
//! process runs; `/readyz` follows the database. And the pool's statement
//! timeout, which keeps a hung query from holding a request forever.

use std::net::SocketAddr;
use std::time::Duration;

use kit::database;
use kit::testing::TestDatabase;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use legacy_shop::startup::Application;

/// Sends `GET path` and returns the status code.
async fn get(addr: SocketAddr, path: &str) -> u16 {
    let mut stream = TcpStream::connect(addr)
        .await
        .expect("connect to the server");
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {response:?}"))
}

/// Starts the application on a free port, with `database_url`.
async fn spawn_app(database_url: &str) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let app = Application::build(&kit::testing::settings(database_url))
        .await
        .expect("build the application");
    let addr = app.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(app.run_until_stopped(async move {
        let _ = stopped.await;
    }));
    (addr, stop)
}

#[tokio::test]
async fn both_probes_answer_200_when_the_database_is_up() {
    let db = TestDatabase::new().await;
    let (addr, _stop) = spawn_app(db.url()).await;

    assert_eq!(get(addr, "/healthz").await, 200);
    assert_eq!(get(addr, "/readyz").await, 200);
}

#[tokio::test]
async fn readiness_fails_while_the_database_is_unreachable() {
    // Nothing listens on port 1.
    let (addr, _stop) = spawn_app("postgres://postgres@127.0.0.1:1/none").await;

    assert_eq!(get(addr, "/healthz").await, 200);
    assert_eq!(get(addr, "/readyz").await, 503);
}

#[tokio::test]
async fn the_server_stops_on_request() {
    let (addr, stop) = spawn_app("postgres://postgres@127.0.0.1:1/none").await;
    assert_eq!(get(addr, "/healthz").await, 200);

    stop.send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;

    assert!(
        TcpStream::connect(addr).await.is_err(),
        "still listening after shutdown"
    );
}

#[tokio::test]
async fn postgres_cancels_a_statement_past_the_statement_timeout() {
    let db = TestDatabase::new().await;
    let mut config = db.config().database;
    config.statement_timeout = Duration::from_millis(200);
    let pool = database::connect_lazy(&config);

    let err = sqlx::query("SELECT pg_sleep(5)")
        .execute(&pool)
        .await
        .expect_err("the statement should have been cancelled");

    let code = err.as_database_error().and_then(|err| err.code());
    assert_eq!(code.as_deref(), Some("57014"), "not query_canceled: {err}");
    pool.close().await;
}
