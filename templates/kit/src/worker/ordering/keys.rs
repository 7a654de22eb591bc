//! The names of one service's ordering keys in Valkey ([`Namespace`]).

use sqlx::PgPool;

/// The names of one service's ordering keys in Valkey: all under
/// `ordered:{<database>}:`, one hash slot per service (a Valkey cluster
/// keeps a service's chains on one master, so that each step is one
/// script), apart from another service's sharing the Valkey.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Namespace {
    pub(super) prefix: String,
}

impl Namespace {
    /// The namespace of the database `database` (braces, which would end
    /// the hash tag, and `%` are percent-encoded).
    pub(super) fn of_database(database: &str) -> Self {
        let mut tag = String::with_capacity(database.len());
        for c in database.chars() {
            match c {
                '{' => tag.push_str("%7B"),
                '}' => tag.push_str("%7D"),
                '%' => tag.push_str("%25"),
                c => tag.push(c),
            }
        }
        Self {
            prefix: format!("ordered:{{{tag}}}:"),
        }
    }

    /// The namespace of `pool`'s database (its user's name when the URL
    /// names none, as Postgres does).
    pub(super) fn of_pool(pool: &PgPool) -> Self {
        let options = pool.connect_options();
        Self::of_database(
            options
                .get_database()
                .unwrap_or_else(|| options.get_username()),
        )
    }

    /// The runs not done yet, by task id: each run's task message.
    pub(super) fn runs(&self) -> String {
        format!("{}runs", self.prefix)
    }

    /// The queue of each run not done yet, by task id.
    pub(super) fn queues(&self) -> String {
        format!("{}queues", self.prefix)
    }

    /// The chains' heads, by task id, scored by when each became its
    /// chain's head (Unix milliseconds).
    pub(super) fn heads(&self) -> String {
        format!("{}heads", self.prefix)
    }

    /// The events waiting for the fan-out of an earlier event of their key,
    /// by their lists' names, scored by when they began to wait.
    pub(super) fn waiting(&self) -> String {
        format!("{}waiting", self.prefix)
    }

    /// The chain of `listener` for `key`: a list of task ids, the head
    /// first. (The listener's name is length-prefixed: no listener and key
    /// make another's name.)
    pub(super) fn chain(&self, listener: &str, key: &str) -> String {
        format!("{}chain:{}:{listener}:{key}", self.prefix, listener.len())
    }

    /// The listeners with a chain for `key`.
    pub(super) fn listeners(&self, key: &str) -> String {
        format!("{}listeners:{key}", self.prefix)
    }

    /// The last sequence number of `key` fanned out, in its numbering
    /// `epoch`.
    pub(super) fn fanned(&self, key: &str, epoch: i64) -> String {
        format!("{}fan:{epoch}:{key}", self.prefix)
    }

    /// The key, epoch and seq of the waiting event whose list is `name`
    /// (one of [`Namespace::waiting`]'s members).
    pub(super) fn waiting_event(&self, name: &str) -> Option<(String, i64, i64)> {
        let rest = name.strip_prefix(&self.prefix)?.strip_prefix("wait:")?;
        let (epoch, rest) = rest.split_once(':')?;
        let (seq, key) = rest.split_once(':')?;
        Some((key.to_string(), epoch.parse().ok()?, seq.parse().ok()?))
    }

    /// The name of the list of the event `seq` of `key` in `epoch` that
    /// waits, as `<before><seq><after>`.
    pub(super) fn wait_parts(&self, key: &str, epoch: i64) -> (String, String) {
        (format!("{}wait:{epoch}:", self.prefix), format!(":{key}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_is_one_hash_slot_per_database_whatever_its_name() {
        assert_eq!(
            Namespace::of_database("shop").chain("email", "order:7"),
            "ordered:{shop}:chain:5:email:order:7"
        );
        assert_eq!(
            Namespace::of_database("a}b{c%").runs(),
            "ordered:{a%7Db%7Bc%25}:runs"
        );
    }

    #[test]
    fn a_waiting_events_list_names_its_key_epoch_and_seq() {
        let keys = Namespace::of_database("shop");
        let (before, after) = keys.wait_parts("order:7:a", 1_765);
        let name = format!("{before}12{after}");
        assert_eq!(
            keys.waiting_event(&name),
            Some(("order:7:a".to_string(), 1_765, 12))
        );
        assert_eq!(keys.waiting_event("ordered:{other}:wait:1:2:k"), None);
    }

    #[test]
    fn no_listener_and_key_name_another_pairs_chain() {
        let keys = Namespace::of_database("shop");
        assert_ne!(keys.chain("a", "b:c"), keys.chain("a:b", "c"));
    }
}
