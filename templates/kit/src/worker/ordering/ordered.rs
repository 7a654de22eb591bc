//! The ordered listeners of one worker, as the look after the chains
//! (`super::reconcile`) and the release of orphaned chains
//! (`super::orphans`) need to know them.

use std::collections::HashSet;

/// The ordered listeners of this worker, and what a failure for good does
/// to their keys: what the look needs to know of them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Ordered {
    /// Every ordered listener's name.
    pub names: HashSet<String>,
    /// The names of those that move on past a run that failed for good.
    pub moving_on: HashSet<String>,
}
