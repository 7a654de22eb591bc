//! The service's configuration: the kit's settings (`DATABASE_*`,
//! `HTTP_ADDR`, `VALKEY_*`, `OUTBOX_*`, ...) and your own, all read from the
//! environment (and `.env`) when a binary starts.

use kit::config::{self, ConfigError};

/// Everything the service's binaries read from the environment. Add your
/// own settings here, each named by its variable, for example:
///
/// ```text
/// /// The greeting `GET /hello` answers with.
/// #[config(env = "GREETING", default = "hello")]
/// pub greeting: String,
/// ```
#[derive(Debug, confique::Config)]
pub struct Settings {
    /// The kit's settings.
    #[config(nested)]
    pub kit: config::Config,
}

impl Settings {
    /// Loads the settings from the process environment; the error names the
    /// variable and what it expects, never a secret.
    pub fn from_env() -> Result<Self, ConfigError> {
        config::load()
    }
}

impl From<config::Config> for Settings {
    /// The kit's settings with yours at their defaults: what the service's
    /// tests start from (`kit::testing::settings(url)`).
    fn from(kit: config::Config) -> Self {
        Self { kit }
    }
}
