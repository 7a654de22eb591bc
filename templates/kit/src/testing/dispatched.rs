//! Assertions on what the code under test put in the outbox:
//! [`Dispatched`], typed by the event.

use serde::de::DeserializeOwned;
use sqlx::PgPool;
use sqlx::types::Json;

use crate::outbox::Event;
use crate::outbox::{Envelope, Metadata};

/// The events in the outbox (published or not), in the order they were
/// dispatched (the outbox's row id: in a test, whose transactions run one
/// after another, the order they committed in). Read once, by
/// [`super::TestDatabase::dispatched`] or [`Dispatched::read`]; each
/// assertion names the events it saw when it fails. Events dispatched for
/// later (`kit::dispatch_in`) that still wait are apart:
/// [`Dispatched::later`], [`Dispatched::assert_dispatched_later`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// # if !kit::testing::example_has_a_database() { return; }
/// use kit::prelude::*;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Debug, Serialize, Deserialize)]
/// struct OrderPlaced {
///     quantity: i32,
/// }
/// impl Event for OrderPlaced {
///     const NAME: &'static str = "orderPlaced";
/// }
///
/// let db = kit::testing::TestDatabase::new().await;
/// db.transactor()
///     .run(async |tx| {
///         dispatch(&mut *tx, &OrderPlaced { quantity: 2 }).await?;
///         Ok(())
///     })
///     .await
///     .unwrap();
///
/// let outbox = db.dispatched().await;
/// let placed = outbox.assert_dispatched::<OrderPlaced>(|e| e.quantity == 2);
/// assert_eq!(placed.quantity, 2);
/// outbox.assert_not_dispatched::<OrderPlaced>(|e| e.quantity > 2);
/// assert_eq!(outbox.assert_all_dispatched::<OrderPlaced>(|e| e.quantity > 0).len(), 1);
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct Dispatched {
    envelopes: Vec<Envelope>,
    later: Vec<(Envelope, chrono::DateTime<chrono::Utc>)>,
}

type Row = (
    uuid::Uuid,
    String,
    Json<serde_json::Value>,
    Json<Metadata>,
    chrono::DateTime<chrono::Utc>,
);

impl Dispatched {
    /// Reads every event in the outbox of the database behind `pool`.
    ///
    /// # Panics
    ///
    /// When the outbox cannot be read.
    pub async fn read(pool: &PgPool) -> Self {
        let envelopes = read_after(pool, 0)
            .await
            .unwrap_or_else(|err| panic!("failed to read the outbox (outbox_events): {err}"));
        let later = read_later(pool)
            .await
            .unwrap_or_else(|err| panic!("failed to read the outbox (outbox_later): {err}"));
        Self { envelopes, later }
    }

    /// Every event, as it travels.
    pub fn envelopes(&self) -> &[Envelope] {
        &self.envelopes
    }

    /// Every event dispatched for later that is not due yet (not in
    /// [`Self::envelopes`]), with its due time, earliest first.
    pub fn later(&self) -> &[(Envelope, chrono::DateTime<chrono::Utc>)] {
        &self.later
    }

    /// Asserts that an `E` matching `matches` waits to be delivered later,
    /// and returns the first (earliest due) with its due time.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// # if !kit::testing::example_has_a_database() { return; }
    /// use std::time::Duration;
    /// use kit::prelude::*;
    ///
    /// #[derive(Debug, serde::Serialize, serde::Deserialize)]
    /// struct Reminder {
    ///     user_id: i64,
    /// }
    /// impl Event for Reminder {
    ///     const NAME: &'static str = "reminder";
    /// }
    ///
    /// let db = kit::testing::TestDatabase::new().await;
    /// let day = Duration::from_secs(24 * 3600);
    /// db.transactor()
    ///     .run(async |tx| Ok(dispatch_in(&mut *tx, &Reminder { user_id: 7 }, day).await?))
    ///     .await
    ///     .unwrap();
    ///
    /// let outbox = db.dispatched().await;
    /// let (reminder, due) = outbox.assert_dispatched_later::<Reminder>(|r| r.user_id == 7);
    /// assert!(due > chrono::Utc::now() + chrono::Duration::hours(23));
    /// outbox.assert_not_dispatched::<Reminder>(|_| true); // not due yet
    /// # let _ = reminder;
    /// # }
    /// ```
    #[track_caller]
    pub fn assert_dispatched_later<E: Event + DeserializeOwned>(
        &self,
        matches: impl Fn(&E) -> bool,
    ) -> (E, chrono::DateTime<chrono::Utc>) {
        let found = self
            .later
            .iter()
            .filter(|(envelope, _)| envelope.name == E::NAME)
            .map(|(envelope, due)| (decode::<E>(envelope), *due))
            .find(|(event, _)| matches(event));
        // Not in a closure, so that the panic points at the caller.
        match found {
            Some(found) => found,
            None => panic!(
                "expected a `{}` dispatched for later matching the predicate, and none waits\n{}",
                E::NAME,
                self.listing()
            ),
        }
    }

    /// Every event of type `E`, decoded, in order.
    ///
    /// # Panics
    ///
    /// When the payload of an `E` no longer decodes into `E` (a field
    /// renamed or retyped since it was dispatched): the message names the
    /// event and the fix.
    #[track_caller]
    pub fn of<E: Event + DeserializeOwned>(&self) -> Vec<E> {
        self.envelopes
            .iter()
            .filter(|envelope| envelope.name == E::NAME)
            .map(decode::<E>)
            .collect()
    }

    /// Asserts that an `E` matching `matches` was dispatched, and returns
    /// the first.
    #[track_caller]
    pub fn assert_dispatched<E: Event + DeserializeOwned>(
        &self,
        matches: impl Fn(&E) -> bool,
    ) -> E {
        let events = self.of::<E>();
        let count = events.len();
        events
            .into_iter()
            .find(|event| matches(event))
            .unwrap_or_else(|| {
                panic!(
                    "expected a dispatched `{}` matching the predicate, and none of the {count} \
                 dispatched matched\n{}",
                    E::NAME,
                    self.listing()
                )
            })
    }

    /// Asserts that no `E` matching `matches` was dispatched (`|_| true`:
    /// none at all).
    #[track_caller]
    pub fn assert_not_dispatched<E: Event + DeserializeOwned>(&self, matches: impl Fn(&E) -> bool) {
        let matching = self.of::<E>().iter().filter(|event| matches(event)).count();
        assert!(
            matching == 0,
            "expected no dispatched `{}` matching the predicate, and {matching} matched\n{}",
            E::NAME,
            self.listing()
        );
    }

    /// Asserts that at least one `E` was dispatched and that every one
    /// matches `matches`; returns them all, in order.
    #[track_caller]
    pub fn assert_all_dispatched<E: Event + DeserializeOwned>(
        &self,
        matches: impl Fn(&E) -> bool,
    ) -> Vec<E> {
        let events = self.of::<E>();
        assert!(
            !events.is_empty(),
            "expected dispatched `{}` events, and there are none\n{}",
            E::NAME,
            self.listing()
        );
        let failing = events.iter().filter(|event| !matches(event)).count();
        assert!(
            failing == 0,
            "expected every dispatched `{}` to match the predicate, and {failing} of {} do not\n{}",
            E::NAME,
            events.len(),
            self.listing()
        );
        events
    }

    /// What the outbox holds, a line per event, for failure messages.
    fn listing(&self) -> String {
        let mut text = if self.envelopes.is_empty() {
            "the outbox is empty".to_string()
        } else {
            format!("the outbox holds {} events:", self.envelopes.len())
        };
        for envelope in &self.envelopes {
            text.push_str(&format!(
                "\n  {} {} {}",
                envelope.name, envelope.id, envelope.payload
            ));
        }
        if !self.later.is_empty() {
            text.push_str(&format!(
                "\nand {} wait to be delivered later:",
                self.later.len()
            ));
        }
        for (envelope, due) in &self.later {
            text.push_str(&format!(
                "\n  {} {} {} due {due}",
                envelope.name, envelope.id, envelope.payload
            ));
        }
        text
    }
}

/// The event in `envelope` as an `E`.
#[track_caller]
fn decode<E: Event + DeserializeOwned>(envelope: &Envelope) -> E {
    serde_json::from_value(envelope.payload.clone()).unwrap_or_else(|err| {
        panic!(
            "the outbox holds `{}` {} whose payload does not decode into {}: {err}\n\
             payload: {}\n\
             help: the type changed since the event was dispatched (a field renamed or \
             retyped?): dispatch the type as it is now, or keep reading the old shape \
             (`#[serde(alias = \"old_name\")]`, `#[serde(default)]`), as listeners of events \
             already queued must",
            E::NAME,
            envelope.id,
            std::any::type_name::<E>(),
            envelope.payload
        )
    })
}

/// The events in the outbox with a row id above `after`, in id order.
pub(crate) async fn read_after(pool: &PgPool, after: i64) -> Result<Vec<Envelope>, sqlx::Error> {
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT event_id, event_name, payload, metadata, created_at \
         FROM outbox_events WHERE id > $1 ORDER BY id",
    )
    .bind(after)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(id, name, Json(payload), Json(metadata), occurred_at)| Envelope {
                id,
                name,
                payload,
                metadata,
                occurred_at,
            },
        )
        .collect())
}

/// A row of `outbox_later`: a [`Row`] and its due time.
type LaterRow = (
    uuid::Uuid,
    String,
    Json<serde_json::Value>,
    Json<Metadata>,
    chrono::DateTime<chrono::Utc>,
    chrono::DateTime<chrono::Utc>,
);

/// The events that wait in `outbox_later`, with their due times, earliest
/// first.
async fn read_later(
    pool: &PgPool,
) -> Result<Vec<(Envelope, chrono::DateTime<chrono::Utc>)>, sqlx::Error> {
    let rows: Vec<LaterRow> = sqlx::query_as(
        "SELECT event_id, event_name, payload, metadata, created_at, due_at \
         FROM outbox_later ORDER BY due_at, id",
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(id, name, Json(payload), Json(metadata), occurred_at, due)| {
                (
                    Envelope {
                        id,
                        name,
                        payload,
                        metadata,
                        occurred_at,
                    },
                    due,
                )
            },
        )
        .collect())
}
