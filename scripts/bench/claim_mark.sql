-- One relay round's SQL, for pgbench (see scripts/bench/README.md): the
-- relay's minimum work in Postgres. The claim-and-mark is store.rs's
-- `Store::claim_and_mark` statement verbatim (one UPDATE ... WHERE id IN
-- (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING the full rows), with the
-- batch size and the keyset position bound as parameters (run with
-- -M prepared and -D after=0); the full rows travel to the client, as they
-- do to the relay. RETURNING has no order, so a window adds the highest id
-- claimed to each row, and \aset keeps it for the next round's keyset
-- position (the relay computes it from the rows). Like the relay's
-- transaction (relay.rs, RELAY_BEGIN), its commit does not wait for the
-- disk; pgbench spends a round trip on the SET that the relay sends with
-- its BEGIN.
\set limit 100
BEGIN;
SET LOCAL synchronous_commit = off;
WITH claimed AS (UPDATE outbox_events SET published_at = now() WHERE id IN (SELECT id FROM outbox_events WHERE published_at IS NULL AND id > :after ORDER BY id LIMIT :limit FOR UPDATE SKIP LOCKED) RETURNING id, event_id, event_name, payload, metadata, created_at) SELECT *, max(id) OVER () AS last_id FROM claimed \aset
\set after :last_id
COMMIT;
