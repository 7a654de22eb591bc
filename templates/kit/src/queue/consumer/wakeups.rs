//! [`Wakeups`]: the tasks a consumer deferred, by when they are due, for
//! its maintenance to move each back to pending at its time.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::Mutex;

use tokio::sync::Notify;
use tokio::sync::futures::Notified;
use tokio::time::Instant;

/// The tasks a consumer deferred, by when they are due: each is moved back
/// to pending at its time by `RunningConsumer::wake_deferred` (module
/// `maintenance`).
#[derive(Default)]
pub(super) struct Wakeups {
    due: Mutex<BinaryHeap<Reverse<(Instant, Wakeup)>>>,
    /// Notified when a task due before the others is added.
    changed: Notify,
}

/// One deferred task: its queue, its id, and its score in `:scheduled`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Wakeup {
    pub(super) queue: String,
    pub(super) id: String,
    pub(super) due: i64,
}

impl Wakeups {
    /// Wakes `task` at `at`.
    pub(super) fn add(&self, at: Instant, task: Wakeup) {
        let mut due = self.due.lock().expect("wake-ups");
        let earliest = due.peek().is_none_or(|Reverse((next, _))| at < *next);
        due.push(Reverse((at, task)));
        drop(due);
        if earliest {
            // Stored when the loop is not waiting: it looks again anyway.
            self.changed.notify_one();
        }
    }

    /// Completes when a task due before the others is added (or was
    /// added while nothing waited).
    pub(super) fn changed(&self) -> Notified<'_> {
        self.changed.notified()
    }

    /// Removes the tasks due by `now`, as (id, score) grouped by queue.
    pub(super) fn take_due(&self, now: Instant) -> Vec<(String, Vec<(String, i64)>)> {
        let mut due = self.due.lock().expect("wake-ups");
        let mut grouped: BTreeMap<String, Vec<(String, i64)>> = BTreeMap::new();
        while due.peek().is_some_and(|Reverse((at, _))| *at <= now) {
            let Reverse((_, task)) = due.pop().expect("peeked");
            grouped
                .entry(task.queue)
                .or_default()
                .push((task.id, task.due));
        }
        grouped.into_iter().collect()
    }

    /// When the next task is due.
    pub(super) fn next(&self) -> Option<Instant> {
        let due = self.due.lock().expect("wake-ups");
        due.peek().map(|Reverse((at, _))| *at)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn wake_ups_come_due_in_time_order_grouped_by_queue() {
        let wakeups = Wakeups::default();
        let now = Instant::now();
        let task = |queue: &str, id: &str| Wakeup {
            queue: queue.into(),
            id: id.into(),
            due: 7,
        };
        wakeups.add(now + Duration::from_millis(30), task("b", "3"));
        wakeups.add(now + Duration::from_millis(10), task("a", "1"));
        wakeups.add(now + Duration::from_millis(20), task("a", "2"));
        wakeups.add(now + Duration::from_secs(60), task("a", "later"));
        assert_eq!(wakeups.next(), Some(now + Duration::from_millis(10)));
        assert!(wakeups.take_due(now).is_empty());
        assert_eq!(
            wakeups.take_due(now + Duration::from_millis(30)),
            vec![
                (
                    "a".to_string(),
                    vec![("1".to_string(), 7), ("2".to_string(), 7)]
                ),
                ("b".to_string(), vec![("3".to_string(), 7)]),
            ]
        );
        assert_eq!(wakeups.next(), Some(now + Duration::from_secs(60)));
    }
}
