//! `outbox console`: serves the web console ([`crate::console`]) with the
//! service's configuration, on 127.0.0.1 unless `--addr` says otherwise.

use std::net::SocketAddr;
use std::process::ExitCode;

use crate::console::{self, Console};
use crate::follow::Context;
use crate::telemetry;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The address to listen on; one other machines can reach needs
    /// OUTBOX_CONSOLE_TOKEN
    #[arg(long, env = "OUTBOX_CONSOLE_ADDR", default_value_t = console::DEFAULT_ADDR)]
    pub(crate) addr: SocketAddr,
    /// Every request must carry this token (`?token=` once in a browser,
    /// or `Authorization: Bearer`)
    #[arg(long, env = "OUTBOX_CONSOLE_TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,
    /// Show, never act: no retry, no replay
    #[arg(long, env = "OUTBOX_CONSOLE_READ_ONLY")]
    pub(crate) read_only: bool,
    /// Payload fields whose values are never shown, comma-separated (such
    /// as email,phone)
    #[arg(long, env = "OUTBOX_CONSOLE_MASK", value_delimiter = ',')]
    pub(crate) mask: Vec<String>,
    /// A link to each event's trace, with {trace_id} where its id goes
    /// (such as https://jaeger.example.com/trace/{trace_id})
    #[arg(long, env = "OUTBOX_CONSOLE_TRACE_URL")]
    pub(crate) trace_url: Option<String>,
    /// Where `gpkit dev` keeps the spans it receives, to draw each event's
    /// trace (gpkit dev sets it)
    #[arg(long, env = "OUTBOX_CONSOLE_TRACES")]
    pub(crate) traces: Option<std::path::PathBuf>,
}

pub async fn run(context: Context, args: Args) -> anyhow::Result<ExitCode> {
    // The console logs each action with what it matched (the other
    // subcommands print their results instead); a binary that installed a
    // subscriber of its own keeps it.
    let logs = telemetry::get_subscriber("info", telemetry::LogFormat::from_env(), std::io::stdout);
    let _ = tracing::subscriber::set_global_default(logs);
    let mut console = Console::from_context(context).mask_fields(args.mask);
    if args.read_only {
        console = console.read_only();
    }
    if let Some(template) = args.trace_url {
        console = console.trace_url(template);
    }
    if let Some(token) = args.token {
        console = console.token(token);
    }
    if let Some(dir) = args.traces {
        console = console.traces_from(dir);
    }
    console::serve(console, args.addr, |addr| {
        tracing::info!(%addr, "console listening on http://{addr}/");
    })
    .await?;
    Ok(ExitCode::SUCCESS)
}
