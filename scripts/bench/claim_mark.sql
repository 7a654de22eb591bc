-- One relay round's SQL, for pgbench (see scripts/bench/README.md). The
-- claim is store.rs's `Store::claim` statement verbatim, with the batch size
-- bound as a parameter (run with -M prepared); the full rows travel to the
-- client, as they do to the relay. The mark is `Store::mark_published`'s
-- UPDATE; its id array is built on the server from the claimed range
-- (:id is the last claimed id: \aset keeps the last row), which equals the
-- claimed ids when one client drains a freshly seeded table (-c 1). Like
-- the relay's transaction (relay.rs, RELAY_BEGIN), its commit does not wait
-- for the disk; pgbench spends a round trip on the SET that the relay sends
-- with its BEGIN.
\set limit 100
BEGIN;
SET LOCAL synchronous_commit = off;
SELECT id, event_id, event_name, payload, metadata, created_at FROM outbox_events WHERE published_at IS NULL ORDER BY id LIMIT :limit FOR UPDATE SKIP LOCKED \aset
UPDATE outbox_events SET published_at = now() WHERE id = ANY(ARRAY(SELECT generate_series(:id::bigint - :limit + 1, :id::bigint)));
COMMIT;
