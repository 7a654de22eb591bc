//! The HTTP server.

use std::process::ExitCode;

use kit::signals::shutdown_signal;

use shop::settings::Settings;
use shop::startup::Application;

fn main() -> ExitCode {
    kit::binary::run("server", async |settings: Settings| {
        let app = Application::build(&settings).await?;
        let database = settings.kit.database.url.redacted();
        tracing::info!(addr = %app.local_addr(), %database, "listening");
        app.run_until_stopped(shutdown_signal()).await?;
        tracing::info!("stopped");
        Ok(())
    })
}
