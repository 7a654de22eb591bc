-- +goose Up
-- The kit's: the service's id, and failures that hold their key.
--
-- The chains of ordered listeners move beside the queue their events come
-- through (in Valkey, under `ordered:{<queue>}:`), and a queue belongs to
-- one service: a worker records its service's id there while it runs, and
-- does not start where another service's is. The id is this row's, made
-- once per database (or WORKER_SERVICE_ID).
CREATE TABLE outbox_service (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    single boolean NOT NULL DEFAULT true UNIQUE CHECK (single)
);
INSERT INTO outbox_service DEFAULT VALUES;

-- A failure holds its key while its task is the first run of an ordered
-- listener's key that it keeps: the cleanup keeps that event and the later
-- ones of its key, and the row does not expire. Other rows expire after
-- WORKER_FAILURE_RETENTION. Rows made before this migration held their
-- key's later events whatever their listener: they keep doing so until the
-- worker finds each no longer first of its key.
ALTER TABLE listener_failures ADD COLUMN holds_key boolean NOT NULL DEFAULT false;
UPDATE listener_failures f SET holds_key = true
    FROM outbox_events e WHERE e.event_id = f.event_id AND e.metadata ? 'order_key';
CREATE INDEX listener_failures_holding_idx ON listener_failures (queue) WHERE holds_key;

-- +goose Down
DROP INDEX listener_failures_holding_idx;
ALTER TABLE listener_failures DROP COLUMN holds_key;
DROP TABLE outbox_service;
