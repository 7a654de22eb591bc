-- +goose Up
-- The kit's: the order of keyed events (`Event::order_key`) and the runs of
-- ordered listeners (`ListenerOptions::ordered`).
--
-- Each key's last sequence number, taken in the transaction that dispatches
-- its event under this row's lock, so that a key's sequence numbers follow
-- the order its transactions committed; and the last one fanned out to the
-- listeners. The worker deletes a row once it has been idle for the
-- outbox's retention.
CREATE TABLE outbox_keys (
    key text PRIMARY KEY,
    seq bigint NOT NULL,
    fanned_out bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Event tasks that reached the worker before the event of their key that
-- committed before them, with the runs of their ordered listeners: each is
-- fanned out right after that one.
CREATE TABLE outbox_key_waits (
    key text NOT NULL,
    seq bigint NOT NULL,
    queue text NOT NULL,
    event_id uuid NOT NULL,
    payload bytea NOT NULL,
    headers jsonb NOT NULL,
    listeners text[] NOT NULL,
    task_types text[] NOT NULL,
    task_ids text[] NOT NULL,
    PRIMARY KEY (key, seq)
);

-- Each ordered listener's runs of one key: `head` is the position that may
-- run, `tail` the last one added. A row goes when its last run is done.
CREATE TABLE ordered_keys (
    listener text NOT NULL,
    key text NOT NULL,
    head bigint NOT NULL,
    tail bigint NOT NULL,
    PRIMARY KEY (listener, key)
);

-- The runs not done yet, in order; the head's task is in the queue, the
-- others wait here for their turn.
CREATE TABLE ordered_runs (
    listener text NOT NULL,
    key text NOT NULL,
    position bigint NOT NULL,
    task_id text NOT NULL UNIQUE,
    task_type text NOT NULL,
    queue text NOT NULL,
    event_id uuid NOT NULL,
    payload bytea NOT NULL,
    headers jsonb NOT NULL,
    added_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (listener, key, position)
);

CREATE INDEX ordered_runs_event_id_idx ON ordered_runs (event_id);

-- Adds the runs of one event (one per listener, `p_listeners[i]` with the
-- task `p_task_ids[i]` of type `p_task_types[i]`) to the end of their
-- chains for `p_key`, unless a run of that task is there already; returns
-- those that are their chain's head, to be queued.
-- +goose StatementBegin
CREATE FUNCTION ordered_append(
    p_key text, p_listeners text[], p_task_types text[], p_task_ids text[],
    p_queue text, p_event_id uuid, p_payload bytea, p_headers jsonb
) RETURNS TABLE (task_type text, task_id text, queue text, payload bytea, headers jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_head bigint;
    v_tail bigint;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_listeners, 1), 0) LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM ordered_runs r WHERE r.task_id = p_task_ids[i]);
        INSERT INTO ordered_keys AS k (listener, key, head, tail)
        VALUES (p_listeners[i], p_key, 1, 1)
        ON CONFLICT (listener, key) DO UPDATE SET tail = k.tail + 1
        RETURNING k.head, k.tail INTO v_head, v_tail;
        INSERT INTO ordered_runs
            (listener, key, position, task_id, task_type, queue, event_id, payload, headers)
        VALUES (p_listeners[i], p_key, v_tail, p_task_ids[i], p_task_types[i], p_queue,
            p_event_id, p_payload, p_headers);
        IF v_head = v_tail THEN
            task_type := p_task_types[i];
            task_id := p_task_ids[i];
            queue := p_queue;
            payload := p_payload;
            headers := p_headers;
            RETURN NEXT;
        END IF;
    END LOOP;
END
$$;
-- +goose StatementEnd

-- The fan-out of a keyed event (`p_seq` in `p_key`) to its ordered
-- listeners, in one statement under the lock of the key's row: added to
-- their chains if the event before it was fanned out (then the waiting
-- events that follow it too), else kept in `outbox_key_waits`. Once the
-- event was fanned out, a replay of it joins the chains' ends, and a retry
-- of its fan-out returns their heads again. Returns the runs to queue.
-- +goose StatementBegin
CREATE FUNCTION outbox_fan_out(
    p_key text, p_seq bigint, p_replay boolean, p_queue text, p_event_id uuid,
    p_payload bytea, p_headers jsonb, p_listeners text[], p_task_types text[], p_task_ids text[]
) RETURNS TABLE (task_type text, task_id text, queue text, payload bytea, headers jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_fanned bigint;
    v_next bigint;
    v_wait outbox_key_waits%ROWTYPE;
BEGIN
    SELECT k.fanned_out INTO v_fanned FROM outbox_keys k WHERE k.key = p_key FOR UPDATE;
    v_next := coalesce(v_fanned + 1, p_seq);
    IF p_seq < v_next AND p_replay THEN
        RETURN QUERY SELECT * FROM ordered_append(p_key, p_listeners, p_task_types, p_task_ids,
            p_queue, p_event_id, p_payload, p_headers);
        RETURN;
    END IF;
    IF p_seq < v_next THEN
        RETURN QUERY SELECT r.task_type, r.task_id, r.queue, r.payload, r.headers
            FROM ordered_keys k JOIN ordered_runs r
              ON r.listener = k.listener AND r.key = k.key AND r.position = k.head
            WHERE k.key = p_key AND k.listener = ANY (p_listeners);
        RETURN;
    END IF;
    IF p_seq > v_next THEN
        INSERT INTO outbox_key_waits
            (key, seq, queue, event_id, payload, headers, listeners, task_types, task_ids)
        VALUES (p_key, p_seq, p_queue, p_event_id, p_payload, p_headers, p_listeners,
            p_task_types, p_task_ids)
        ON CONFLICT DO NOTHING;
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM ordered_append(p_key, p_listeners, p_task_types, p_task_ids,
        p_queue, p_event_id, p_payload, p_headers);
    IF v_fanned IS NOT NULL THEN
        v_fanned := p_seq;
        LOOP
            DELETE FROM outbox_key_waits w WHERE w.key = p_key AND w.seq = v_fanned + 1
                RETURNING w.* INTO v_wait;
            EXIT WHEN NOT FOUND;
            RETURN QUERY SELECT * FROM ordered_append(p_key, v_wait.listeners,
                v_wait.task_types, v_wait.task_ids, v_wait.queue, v_wait.event_id,
                v_wait.payload, v_wait.headers);
            v_fanned := v_fanned + 1;
        END LOOP;
        UPDATE outbox_keys k SET fanned_out = v_fanned WHERE k.key = p_key;
    END IF;
END
$$;
-- +goose StatementEnd

-- The run of task `p_task_id` is over: it leaves its chain, whose head moves
-- past it if it was the head. Returns the head of `p_listener`'s chain for
-- `p_key` then, to be queued: read by a statement of its own, which sees a
-- run that a fan-out added while the update waited for its lock.
-- +goose StatementBegin
CREATE FUNCTION ordered_move_on(p_task_id text, p_listener text, p_key text)
RETURNS TABLE (task_type text, task_id text, queue text, payload bytea, headers jsonb)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    WITH done AS (
        DELETE FROM ordered_runs r WHERE r.task_id = p_task_id
        RETURNING r.listener, r.key, r.position)
    UPDATE ordered_keys k SET head = k.head + 1 FROM done
    WHERE k.listener = done.listener AND k.key = done.key AND k.head = done.position;
    RETURN QUERY SELECT r.task_type, r.task_id, r.queue, r.payload, r.headers
        FROM ordered_keys k JOIN ordered_runs r
          ON r.listener = k.listener AND r.key = k.key AND r.position = k.head
        WHERE k.listener = p_listener AND k.key = p_key;
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION ordered_move_on(text, text, text);
DROP FUNCTION outbox_fan_out(text, bigint, boolean, text, uuid, bytea, jsonb, text[], text[], text[]);
DROP FUNCTION ordered_append(text, text[], text[], text[], text, uuid, bytea, jsonb);
DROP TABLE ordered_runs;
DROP TABLE ordered_keys;
DROP TABLE outbox_key_waits;
DROP TABLE outbox_keys;
