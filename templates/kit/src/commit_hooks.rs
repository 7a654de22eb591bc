//! What a transactor does once a transaction commits: the hooks it runs
//! ([`CommitHooks`]), and the note, kept while the transaction's work runs,
//! of whether that work stored events ([`noting_events`],
//! [`events_stored`]), which decides whether the relay's wake-up runs.
//! The sqlx transactor (`database::Transactor`), its SeaORM form
//! (`orm::Transactor`) and a listener's `ctx.once` share them.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// One hook, run after a successful commit.
type Hook = Arc<dyn Fn() + Send + Sync>;

/// The hooks a transactor runs after each successful commit.
#[derive(Clone, Default)]
pub(crate) struct CommitHooks {
    /// After every commit.
    after_commit: Option<Hook>,
    /// After a commit of a transaction that stored events.
    after_events: Option<Hook>,
}

impl CommitHooks {
    /// Runs `hook` after every successful commit.
    pub(crate) fn after_commit(&mut self, hook: impl Fn() + Send + Sync + 'static) {
        self.after_commit = Some(Arc::new(hook));
    }

    /// Runs `hook` after each successful commit of a transaction that
    /// stored events.
    #[cfg(feature = "worker")]
    pub(crate) fn after_events(&mut self, hook: impl Fn() + Send + Sync + 'static) {
        self.after_events = Some(Arc::new(hook));
    }

    /// Runs the hooks for a transaction that committed and that `stored`
    /// events or not ([`noting_events`]).
    pub(crate) fn committed(&self, stored: bool) {
        if let Some(hook) = &self.after_commit {
            hook();
        }
        if let Some(hook) = self.after_events.as_ref().filter(|_| stored) {
            hook();
        }
    }
}

tokio::task_local! {
    /// Set while a transactor's transaction runs its work: whether the work
    /// stored events.
    static STORED: Arc<AtomicBool>;
}

/// Runs `work`, noting whether it stores events ([`events_stored`]).
pub(crate) async fn noting_events<F: Future>(work: F) -> (F::Output, bool) {
    let stored = Arc::new(AtomicBool::new(false));
    let output = STORED.scope(Arc::clone(&stored), work).await;
    (output, stored.load(Ordering::Relaxed))
}

/// Notes that the transaction the current task runs (in a transactor's
/// `run`, or a listener's `ctx.once`) stored events, so that its commit
/// wakes the relays. Outside one it does nothing: the relay finds the
/// events at its next poll.
pub(crate) fn events_stored() {
    let _ = STORED.try_with(|stored| stored.store(true, Ordering::Relaxed));
}
