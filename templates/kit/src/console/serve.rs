//! Serving the console on an address of its own (`outbox console`): on
//! loopback by default, and on any other address only with a token.

use std::net::SocketAddr;

use super::Console;

/// Why the console does not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// An address others can reach, without a token.
    #[error(
        "the console would listen on {0}, which other machines can reach, without a token: \
         set OUTBOX_CONSOLE_TOKEN (every request must then carry it), or listen on 127.0.0.1"
    )]
    TokenNeeded(SocketAddr),
    /// The address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("the console stopped: {0}")]
    Serve(std::io::Error),
}

/// Serves `console` on `addr` until Ctrl-C or SIGTERM. Refuses an address
/// that is not loopback unless the console has a token
/// ([`Console::token`]). `listening` is called with the bound address
/// (port 0 picks a free one).
pub async fn serve(
    console: Console,
    addr: SocketAddr,
    listening: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    if !addr.ip().is_loopback() && console.options.token.is_none() {
        return Err(ServeError::TokenNeeded(addr));
    }
    let shutdown = crate::signals::shutdown_signal();
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })?;
    let bound = listener.local_addr().unwrap_or(addr);
    listening(bound);
    axum::serve(listener, console.router())
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(ServeError::Serve)
}
