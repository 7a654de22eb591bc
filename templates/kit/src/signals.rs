//! Process signals: the future every binary waits on to shut down.

use std::future::Future;

/// Completes on Ctrl-C or SIGTERM.
///
/// The handlers are installed when this is called, not when the future is
/// first polled: a SIGTERM that comes between the call and the first poll
/// (while a binary still starts up) ends the wait at once instead of
/// killing the process by the signal's default action. Call it inside the
/// Tokio runtime, before the work whose end it signals:
///
/// ```no_run
/// # async fn serve() {
/// let shutdown = kit::signals::shutdown_signal();
/// // ... start up: a SIGTERM from here on is caught ...
/// shutdown.await;
/// # }
/// ```
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let (interrupt, terminate) = {
        use tokio::signal::unix::{SignalKind, signal};
        (
            listen(signal(SignalKind::interrupt()), "Ctrl-C"),
            listen(signal(SignalKind::terminate()), "SIGTERM"),
        )
    };
    #[cfg(not(unix))]
    let (interrupt, terminate) = (
        async {
            if let Err(err) = tokio::signal::ctrl_c().await {
                tracing::error!(error = %err, "cannot listen for Ctrl-C");
                std::future::pending::<()>().await;
            }
        },
        std::future::pending::<()>(),
    );
    async move {
        tokio::select! {
            () = interrupt => {},
            () = terminate => {},
        }
        tracing::info!("shutdown signal received");
    }
}

/// Waits for the signal that `installed` listens to; never completes when
/// it could not be installed (the error is logged now).
#[cfg(unix)]
fn listen(
    installed: std::io::Result<tokio::signal::unix::Signal>,
    name: &'static str,
) -> impl Future<Output = ()> + Send + 'static {
    let signal = installed
        .inspect_err(|err| tracing::error!(error = %err, "cannot listen for {name}"))
        .ok();
    async move {
        match signal {
            Some(mut signal) => {
                signal.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    }
}
