//! Questions about the Valkey server itself rather than its tasks: whether
//! it answers ([`Client::ping`]) and how it is configured
//! ([`Client::config_get`]), for readiness probes and start-up checks.

use super::{Client, QueueError};

impl Client {
    /// `PING`: whether the server answers on the shared connection.
    pub(crate) async fn ping(&self) -> Result<(), QueueError> {
        let reply: String = redis::cmd("PING").query_async(&mut self.conn()).await?;
        if reply == "PONG" {
            Ok(())
        } else {
            Err(QueueError::UnexpectedReply(format!(
                "PING answered {reply}"
            )))
        }
    }

    /// `CONFIG GET name`: the value of one server setting. Managed services
    /// and ACL users without `+config` refuse the command: an error.
    pub(crate) async fn config_get(&self, name: &str) -> Result<String, QueueError> {
        let reply: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg(name)
            .query_async(&mut self.conn())
            .await?;
        match reply.as_slice() {
            [key, value] if key == name => Ok(value.clone()),
            _ => Err(QueueError::UnexpectedReply(format!(
                "CONFIG GET {name} answered {reply:?}"
            ))),
        }
    }
}
