-- +goose NO TRANSACTION
-- The kit's: a BRIN index on the outbox's creation time, so that the
-- console's searches by time (and `outbox list --since`) read only the
-- blocks of that range, however far back it is. Rows are inserted in
-- creation order, which is what BRIN summarises well; it costs the relay
-- next to nothing (a few pages for millions of rows). Built CONCURRENTLY,
-- so that an outbox in use is not blocked while it builds.
-- +goose Up
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_events_created_at_idx
    ON outbox_events USING brin (created_at);

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS outbox_events_created_at_idx;
