//! The names of the ordering keys of one queue in Valkey ([`Namespace`]).

use crate::queue::keys as queue_keys;

/// The names of one queue's ordering keys in Valkey: all under
/// `ordered:{<queue>}:`, in the queue's hash slot (a Valkey cluster keeps
/// them on the master of the queue's tasks, so that each step is one script
/// that also moves the tasks, and one server's persistence holds both), and
/// the names of the queue's task keys those scripts touch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Namespace {
    /// The queue.
    pub(crate) queue: String,
    prefix: String,
}

impl Namespace {
    /// The namespace of `queue` (a queue name has no braces: the queue's
    /// own keys carry it in a hash tag too).
    pub(crate) fn of_queue(queue: &str) -> Self {
        Self {
            queue: queue.to_string(),
            prefix: format!("ordered:{{{queue}}}:"),
        }
    }

    /// The runs not done yet, by task id: each run's task message.
    pub(crate) fn runs(&self) -> String {
        format!("{}runs", self.prefix)
    }

    /// The chains' heads, by task id, scored by when each became its
    /// chain's head (Unix milliseconds).
    pub(crate) fn heads(&self) -> String {
        format!("{}heads", self.prefix)
    }

    /// The events waiting for the fan-out of an earlier event of their key,
    /// as `<epoch>:<seq>:<key>`, scored by when they began to wait.
    pub(crate) fn waiting(&self) -> String {
        format!("{}waiting", self.prefix)
    }

    /// The listeners with a chain, by name.
    pub(crate) fn listeners(&self) -> String {
        format!("{}listeners", self.prefix)
    }

    /// The keys `listener` has a chain for.
    pub(crate) fn keys_of(&self, listener: &str) -> String {
        format!("{}keys:{listener}", self.prefix)
    }

    /// The chain of `listener` for `key`: a list of task ids, the head
    /// first. (The listener's name is length-prefixed: no listener and key
    /// make another's name.)
    pub(crate) fn chain(&self, listener: &str, key: &str) -> String {
        format!("{}chain:{}:{listener}:{key}", self.prefix, listener.len())
    }

    /// The events of `key` that wait, by `<epoch>:<seq>`: each one's id
    /// and runs ([`super::waits`]).
    pub(crate) fn waits(&self, key: &str) -> String {
        format!("{}wait:{key}", self.prefix)
    }

    /// The last sequence number of `key` fanned out, in its numbering
    /// `epoch`.
    pub(crate) fn fanned(&self, key: &str, epoch: i64) -> String {
        format!("{}fan:{epoch}:{key}", self.prefix)
    }

    /// The service that consumes the queue, while its workers run
    /// ([`super::owner`]).
    pub(crate) fn service(&self) -> String {
        format!("{}service", self.prefix)
    }

    /// The listeners with chains that no worker orders, by name: when a
    /// worker first saw them so (Unix milliseconds; [`super::orphans`]).
    pub(crate) fn orphans(&self) -> String {
        format!("{}orphans", self.prefix)
    }

    /// The hash of the queue's task `id` (asynq's).
    pub(crate) fn task(&self, id: &str) -> String {
        queue_keys::task(&self.queue, id)
    }

    /// The queue's pending tasks (asynq's).
    pub(crate) fn pending(&self) -> String {
        queue_keys::pending(&self.queue)
    }

    /// The queue's scheduled tasks (asynq's).
    pub(crate) fn scheduled(&self) -> String {
        queue_keys::scheduled(&self.queue)
    }

    /// The queue's tasks woken while active (the kit's, beside asynq's).
    pub(crate) fn woken(&self) -> String {
        queue_keys::woken(&self.queue)
    }
}

/// The member of [`Namespace::waiting`] of the event `seq` of `key` in
/// `epoch` (as the fan-out script names it).
#[cfg(test)]
pub(crate) fn waiting_member(key: &str, epoch: i64, seq: i64) -> String {
    format!("{epoch}:{seq}:{key}")
}

/// The key, epoch and seq of a member of [`Namespace::waiting`].
pub(crate) fn waiting_event(member: &str) -> Option<(String, i64, i64)> {
    let (epoch, rest) = member.split_once(':')?;
    let (seq, key) = rest.split_once(':')?;
    Some((key.to_string(), epoch.parse().ok()?, seq.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_in_its_queues_hash_slot() {
        let keys = Namespace::of_queue("shop");
        assert_eq!(
            keys.chain("email", "order:7"),
            "ordered:{shop}:chain:5:email:order:7"
        );
        for name in [
            keys.runs(),
            keys.heads(),
            keys.waiting(),
            keys.listeners(),
            keys.keys_of("email"),
            keys.waits("order:7"),
            keys.fanned("order:7", 3),
            keys.service(),
            keys.orphans(),
            keys.task("id"),
            keys.pending(),
            keys.scheduled(),
            keys.woken(),
        ] {
            assert!(name.contains("{shop}:"), "{name}");
        }
    }

    #[test]
    fn a_waiting_member_names_its_key_epoch_and_seq() {
        let member = waiting_member("order:7:a", 1_765, 12);
        assert_eq!(
            waiting_event(&member),
            Some(("order:7:a".to_string(), 1_765, 12))
        );
        assert_eq!(waiting_event("x"), None);
    }

    #[test]
    fn no_listener_and_key_name_another_pairs_chain() {
        let keys = Namespace::of_queue("shop");
        assert_ne!(keys.chain("a", "b:c"), keys.chain("a:b", "c"));
    }
}
