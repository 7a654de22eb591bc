-- +goose Up
-- The kit's: at most one event per key in a window (`kit::dispatch_unique`).
--
-- A key's row names the event that holds it and until when. A dispatch
-- takes the key in its own transaction (`INSERT ... ON CONFLICT (key) DO
-- UPDATE`), which locks the row: a concurrent dispatch of the key waits
-- for that transaction, and finds the key held if it committed, free if
-- it rolled back. A dispatch after `until` takes the key over, and the
-- worker's cleanup deletes expired keys (`OUTBOX_CLEANUP_INTERVAL`).
CREATE TABLE outbox_unique (
    key text PRIMARY KEY,
    event_id uuid NOT NULL,
    until timestamptz NOT NULL
);

-- +goose Down
DROP TABLE outbox_unique;
