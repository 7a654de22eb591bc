-- +goose Up
-- The kit's: events delivered later (`kit::dispatch_at`, `kit::dispatch_in`).
--
-- A delayed event waits here, not in `outbox_events`, so that the relay's
-- claim never reads it: once it is due, the worker moves it into
-- `outbox_events` (one mover at a time across replicas, under an advisory
-- lock), where it takes its key's next number (`outbox_keys`) and is
-- published like any other event. `created_at` is
-- the time it was dispatched; in `outbox_events` its time is `due_at`.
CREATE TABLE outbox_later (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id uuid NOT NULL UNIQUE,
    event_name text NOT NULL,
    payload jsonb NOT NULL,
    metadata jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    due_at timestamptz NOT NULL
);

CREATE INDEX outbox_later_due_idx ON outbox_later (due_at, id);

-- +goose Down
DROP TABLE outbox_later;
