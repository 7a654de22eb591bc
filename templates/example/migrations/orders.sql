-- +goose Up
-- The example slice: orders, the confirmations the `confirm` listener of
-- `orderPlaced` records, and the reminders the `remind` listener of
-- `orderReminderDue` records a day later, each one per event (its id is
-- the envelope id).
CREATE TABLE orders (
    id uuid PRIMARY KEY,
    sku text NOT NULL,
    quantity integer NOT NULL CHECK (quantity > 0),
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE order_confirmations (
    event_id uuid PRIMARY KEY,
    order_id uuid NOT NULL REFERENCES orders (id),
    confirmed_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE order_reminders (
    event_id uuid PRIMARY KEY,
    order_id uuid NOT NULL REFERENCES orders (id),
    reminded_at timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE order_reminders;
DROP TABLE order_confirmations;
DROP TABLE orders;
