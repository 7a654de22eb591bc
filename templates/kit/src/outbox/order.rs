//! The place of a keyed event in its key's order (`Event::order_key`):
//! the key, the sequence number its dispatch took and the numbering's
//! epoch, carried in the envelope's metadata as `order_key`, `order_seq`
//! and `order_epoch` (strings, as every metadata value; a Go service passes
//! them on untouched).

use super::Metadata;

/// The metadata entry of an event's key.
pub(crate) const ORDER_KEY: &str = "order_key";
/// The metadata entry of an event's sequence number in its key.
pub(crate) const ORDER_SEQ: &str = "order_seq";
/// The metadata entry of the epoch of its key's numbering.
pub(crate) const ORDER_EPOCH: &str = "order_epoch";

/// Where a keyed event stands in its key's order.
#[cfg(feature = "worker")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Place {
    /// The event's key.
    pub(crate) key: String,
    /// Its sequence number: 1 for the key's first event, then one more
    /// per event, in the order their transactions committed.
    pub(crate) seq: i64,
    /// The numbering's epoch: the key's row in `outbox_keys` is deleted
    /// once idle, and a new row numbers from 1 again in a new epoch. 0 for
    /// an event whose metadata has no `order_epoch` (a kit that numbered
    /// keys without epochs dispatched it).
    pub(crate) epoch: i64,
}

#[cfg(feature = "worker")]
impl Place {
    /// The place recorded in `metadata`; `None` for an event without a key
    /// or without a sequence number (a kit that did not number keys, or a
    /// Go service, dispatched it).
    pub(crate) fn of(metadata: &Metadata) -> Option<Self> {
        let key = metadata.get(ORDER_KEY)?;
        let seq = metadata.get(ORDER_SEQ)?.parse().ok()?;
        let epoch = match metadata.get(ORDER_EPOCH) {
            Some(epoch) => epoch.parse().ok()?,
            None => 0,
        };
        Some(Self {
            key: key.clone(),
            seq,
            epoch,
        })
    }
}

/// Writes the place a keyed event's dispatch took, number `seq` in
/// `epoch`, into its `metadata` (as [`INSERT_KEYED`] writes it into the
/// row's).
pub(crate) fn write_place(metadata: &mut Metadata, seq: i64, epoch: i64) {
    metadata.insert(ORDER_SEQ.into(), seq.to_string());
    metadata.insert(ORDER_EPOCH.into(), epoch.to_string());
}

/// The statement that stores a keyed event: takes the key's next sequence
/// number under the lock of its `outbox_keys` row (so the numbers follow
/// the order of the commits), and inserts the row with the number and the
/// row's epoch in its metadata. Binds: event id, name, payload, metadata,
/// time, key. Returns the row id, the number and the epoch.
pub(crate) const INSERT_KEYED: &str = "\
WITH next AS ( \
  INSERT INTO outbox_keys AS k (key, seq) VALUES ($6, 1) \
  ON CONFLICT (key) DO UPDATE SET seq = k.seq + 1, updated_at = now() \
  RETURNING seq, epoch) \
INSERT INTO outbox_events (event_id, event_name, payload, metadata, created_at) \
SELECT $1, $2, $3, $4 || jsonb_build_object('order_seq', next.seq::text, \
  'order_epoch', next.epoch::text), $5 FROM next \
RETURNING id, (metadata ->> 'order_seq')::bigint, (metadata ->> 'order_epoch')::bigint";

#[cfg(all(test, feature = "worker"))]
mod tests {
    use super::*;

    #[test]
    fn a_place_needs_a_key_and_a_number() {
        let mut metadata = Metadata::new();
        assert_eq!(Place::of(&metadata), None);
        metadata.insert(ORDER_KEY.into(), "order:7".into());
        assert_eq!(Place::of(&metadata), None, "no number yet");
        metadata.insert(ORDER_SEQ.into(), "3".into());
        assert_eq!(
            Place::of(&metadata),
            Some(Place {
                key: "order:7".into(),
                seq: 3,
                epoch: 0,
            }),
            "dispatched before epochs"
        );
        metadata.insert(ORDER_EPOCH.into(), "1765000000000000".into());
        assert_eq!(
            Place::of(&metadata).map(|place| place.epoch),
            Some(1_765_000_000_000_000)
        );
        metadata.insert(ORDER_SEQ.into(), "three".into());
        assert_eq!(Place::of(&metadata), None);
    }
}
