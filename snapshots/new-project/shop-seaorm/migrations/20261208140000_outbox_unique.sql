-- +goose Up
-- The kit's: at most one event per key in a window (`kit::dispatch_unique`).
--
-- A key's row names the event that holds it and until when. A dispatch
-- takes the key in its own transaction (`outbox_unique_take`): a
-- concurrent dispatch of the key waits for that transaction, and finds
-- the key held if it committed, free if it rolled back. A dispatch that
-- finds the key held changes nothing and holds no lock. A dispatch after
-- `until` takes the key over, and the worker's cleanup deletes expired
-- keys (`OUTBOX_CLEANUP_INTERVAL`).
CREATE TABLE outbox_unique (
    key text PRIMARY KEY,
    event_id uuid NOT NULL,
    until timestamptz NOT NULL
);

-- Takes `p_key` for `p_event_id` for `p_window` seconds from now if it is
-- free or its window is over (`taken`), else names the event that holds
-- it and until when, a time still to come. Each statement reads what
-- committed before it (read committed), so a key taken or taken over by a
-- transaction that committed while this one waited is seen, and tried
-- again if that one's window is over by then.
-- +goose StatementBegin
CREATE FUNCTION outbox_unique_take(p_key text, p_event_id uuid, p_window float8)
RETURNS TABLE (taken boolean, holder uuid, held_until timestamptz)
LANGUAGE plpgsql AS $$
BEGIN
    FOR attempt IN 1 .. 100 LOOP
        INSERT INTO outbox_unique AS u (key, event_id, until)
        VALUES (p_key, p_event_id, clock_timestamp() + make_interval(secs => p_window))
        ON CONFLICT (key) DO NOTHING
        RETURNING true, u.event_id, u.until INTO taken, holder, held_until;
        IF FOUND THEN
            RETURN NEXT;
            RETURN;
        END IF;
        SELECT false, u.event_id, u.until INTO taken, holder, held_until
        FROM outbox_unique u WHERE u.key = p_key;
        IF FOUND AND held_until > clock_timestamp() THEN
            RETURN NEXT;
            RETURN;
        END IF;
        IF FOUND THEN
            UPDATE outbox_unique u SET event_id = p_event_id,
                until = clock_timestamp() + make_interval(secs => p_window)
            WHERE u.key = p_key AND u.until <= clock_timestamp()
            RETURNING true, u.event_id, u.until INTO taken, holder, held_until;
            IF FOUND THEN
                RETURN NEXT;
                RETURN;
            END IF;
        END IF;
        -- Taken over, or deleted by the cleanup, since: again.
    END LOOP;
    RAISE EXCEPTION 'outbox_unique: key % changed hands 100 times in one dispatch', p_key;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION outbox_unique_take(text, uuid, float8);
DROP TABLE outbox_unique;
