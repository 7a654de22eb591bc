-- +goose Up
-- The kit's: the listener tasks that failed for good. The worker records
-- each here before the queue archives it (the queue keeps at most 10,000
-- archived tasks a queue and drops the oldest); a row stays until its task
-- is sent back to the queue (retried) or succeeds, or until deleted.
CREATE TABLE listener_failures (
    task_id text PRIMARY KEY,
    queue text NOT NULL,
    -- NULL when the task's payload is not an event envelope.
    event_id uuid,
    event_name text NOT NULL,
    listener text NOT NULL,
    error text NOT NULL,
    attempts integer NOT NULL,
    failed_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX listener_failures_failed_at_idx ON listener_failures (failed_at);

-- +goose Down
DROP TABLE listener_failures;
