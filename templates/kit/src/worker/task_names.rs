//! The names of listener tasks: a listener's asynq task type
//! (`listener:<event>:<listener>`, and the listener a task type names), the
//! id of its task for one event task, and the header that marks a run of
//! a chain. The worker, the relay's followers, the operations and the
//! console all name listener tasks through here; it depends on nothing of
//! the worker.

use uuid::Uuid;

/// The header that marks a listener task as a run of a chain (its value is
/// the key). A listener task without it (queued before its listener was
/// ordered, or for an event without a key) runs as any other.
pub(crate) const ORDERED_HEADER: &str = "gpkit-ordered-key";

/// `listener:<event>:<listener>`, the task type of one listener's work.
pub(crate) fn listener_task_type(event: &str, listener: &str) -> String {
    format!("listener:{event}:{listener}")
}

/// The task id of `listener`'s task for the event task `event_task_id`: a
/// UUIDv5 of the listener's name in the event task id's namespace, the same
/// on every retry. The relay's event task id is the event id, so the
/// listener tasks of an event are `listener_task_id(event_id, name)`.
pub(crate) fn listener_task_id(event_task_id: Uuid, listener: &str) -> Uuid {
    Uuid::new_v5(&event_task_id, listener.as_bytes())
}

/// `(event, listener)` of a task type `listener:<event>:<listener>`; none
/// for any other task type.
pub(crate) fn listener_of(task_type: &str) -> Option<(&str, &str)> {
    task_type.strip_prefix("listener:")?.split_once(':')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listener_task_ids_are_stable_and_distinct() {
        let event = Uuid::now_v7();
        assert_eq!(
            listener_task_id(event, "audit"),
            listener_task_id(event, "audit")
        );
        assert_ne!(
            listener_task_id(event, "audit"),
            listener_task_id(event, "email")
        );
        assert_ne!(
            listener_task_id(event, "audit"),
            listener_task_id(Uuid::now_v7(), "audit")
        );
    }

    #[test]
    fn listener_task_types_follow_the_go_kit() {
        assert_eq!(
            listener_task_type("orderPlaced", "audit"),
            "listener:orderPlaced:audit"
        );
    }

    #[test]
    fn a_listener_task_type_names_its_event_and_listener() {
        assert_eq!(
            listener_of("listener:orderPlaced:email"),
            Some(("orderPlaced", "email"))
        );
        assert_eq!(listener_of("event:orderPlaced"), None);
        assert_eq!(listener_of("job:beat"), None);
    }
}
