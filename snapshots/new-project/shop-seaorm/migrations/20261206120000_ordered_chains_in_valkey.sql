-- +goose Up
-- The kit's: the chains of ordered listeners move to Valkey (one script a
-- step, beside the queue), and a key's numbering gets an epoch.
--
-- A key's row is deleted once idle, and a later event of the key numbers
-- from 1 again: its new epoch (microseconds since 1970 when the row was
-- made) tells Valkey that this is a new numbering, not an old event. Rows
-- made before this migration keep epoch 0, as the events they numbered
-- carry none.
ALTER TABLE outbox_keys ADD COLUMN epoch bigint NOT NULL DEFAULT 0;
ALTER TABLE outbox_keys ALTER COLUMN epoch
    SET DEFAULT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;

-- The tables of the chains in Postgres (`ordered_keys`, `ordered_runs`,
-- `outbox_key_waits`, `outbox_keys.fanned_out`) and their functions stay
-- for the worker's move of what they still hold into Valkey; they are no
-- longer written.

-- +goose Down
ALTER TABLE outbox_keys DROP COLUMN epoch;
