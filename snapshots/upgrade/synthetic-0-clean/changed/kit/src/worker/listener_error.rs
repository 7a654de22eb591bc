//! What a listener returns on failure: [`ListenerError`], retried, or a
//! [`SkipRetry`] inside it, archived at once.

/// What a listener returns on failure; the task is retried.
pub type ListenerError = anyhow::Error;

/// A failure that retrying cannot fix: return it (`Err(SkipRetry(..).into())`)
/// and the listener's task is archived at once instead of retried, as Go's
/// `asynq.SkipRetry` does. `outbox retry-archived` runs it again later.
#[derive(Debug, thiserror::Error)]
#[error("{0} (not retried)")]
pub struct SkipRetry(pub String);
