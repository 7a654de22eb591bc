//! Builds the application: binds the listener, creates the shared state and
//! the router, and serves until a shutdown signal arrives.

use std::future::Future;
use std::net::SocketAddr;

use anyhow::Context;
use kit::database;
use sqlx::PgPool;
use tokio::net::TcpListener;

use crate::routes;
use crate::settings::Settings;

/// State shared by all request handlers.
#[derive(Debug, Clone)]
pub struct AppState {
    pub pool: PgPool,
    // gpkit:begin state-fields
    /// Runs a unit of work in one transaction (commit on `Ok`): call
    /// `kit::dispatch(&mut *tx, &event)` in it, and the event commits or
    /// rolls back with your writes.
    pub transactor: kit::Transactor,
    // gpkit:end state-fields
}

/// A built, not yet running, HTTP server.
pub struct Application {
    listener: TcpListener,
    state: AppState,
}

impl Application {
    /// Binds the HTTP address (port 0 picks a free port) and prepares the
    /// state. The database pool connects lazily, so no live database is
    /// needed to build the application.
    pub async fn build(settings: &Settings) -> anyhow::Result<Self> {
        let config = &settings.kit;
        let listener = TcpListener::bind(config.http.addr)
            .await
            .with_context(|| format!("failed to listen on {}", config.http.addr))?;
        let pool = database::connect_lazy(&config.database);
        let state = AppState {
            // gpkit:begin state-init
            transactor: kit::transactor(pool.clone(), config)?,
            // gpkit:end state-init
            pool,
        };
        Ok(Self { listener, state })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// The routes on the application's state, to call without a port
    /// (`kit::testing::TestClient::new(app.router())`).
    pub fn router(&self) -> axum::Router {
        routes::router(self.state.clone())
    }

    /// Serves requests until `shutdown` completes, then lets in-flight
    /// requests finish.
    pub async fn run_until_stopped(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        axum::serve(self.listener, routes::router(self.state))
            .with_graceful_shutdown(shutdown)
            .await
    }
}
