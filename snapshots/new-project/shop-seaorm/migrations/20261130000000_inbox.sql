-- The listeners' inbox, written by gpkit: one row per event a listener's
-- database work has committed for (`ListenerContext::once`), so a second
-- delivery of the event skips the work. The worker deletes rows older than
-- INBOX_RETENTION. Part of every project, worker or not, so that its version
-- is never older than a migration applied before it.
-- +goose Up
CREATE TABLE inbox_processed (
    listener text NOT NULL,
    event_id uuid NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (listener, event_id)
);

CREATE INDEX inbox_processed_at_idx ON inbox_processed (processed_at);

-- +goose Down
DROP TABLE inbox_processed;
