-- +goose Up
-- The kit's: the listener tasks that were cancelled (`outbox cancel`, the
-- console's Cancel, asynqmon's Cancel on a kit worker). A task deleted
-- before it ran again, or stopped while it ran, is recorded here, not in
-- listener_failures: "Send back" and `outbox retry-archived` leave it
-- unless asked (`--include-cancelled`). A row stays until its task is sent
-- back, or until it is older than WORKER_FAILURE_RETENTION.
CREATE TABLE listener_cancellations (
    task_id text PRIMARY KEY,
    queue text NOT NULL,
    -- NULL when the task's payload is not an event envelope.
    event_id uuid,
    event_name text NOT NULL,
    listener text NOT NULL,
    -- Where the task was: pending, scheduled, retry (deleted), active
    -- (stopped while it ran) or waiting (an ordered run behind its key's
    -- earlier runs, taken out of its key's order).
    state text NOT NULL,
    -- Its runs that failed before.
    retried integer NOT NULL,
    cancelled_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX listener_cancellations_event_id_idx ON listener_cancellations (event_id);
CREATE INDEX listener_cancellations_cancelled_at_idx ON listener_cancellations (cancelled_at);

-- +goose Down
DROP TABLE listener_cancellations;
