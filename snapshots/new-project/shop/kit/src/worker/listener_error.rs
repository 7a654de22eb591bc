//! What a listener returns on failure: [`ListenerError`], retried, or with a
//! [`SkipRetry`] in its chain, archived at once.

pub use crate::queue::SkipRetry;

/// What a listener returns on failure; the task is retried, unless the
/// error is (or wraps) a [`SkipRetry`].
pub type ListenerError = anyhow::Error;
