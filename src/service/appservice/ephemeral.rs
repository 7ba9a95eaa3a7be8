//! The ephemeral events of an appservice's transactions (`receive_ephemeral`, MSC2409):
//! typing and public read receipts in the rooms that interest it, and the presence of the users
//! that interest it (see [`RoomInterest::presence`]), rendered as `/sync` renders it.
//!
//! What it has been sent is kept in memory, per appservice: ephemeral events are not replayed.
//! A process that starts leading sends what happens from then on, and what happens while an
//! appservice fails is dropped ([`Ephemeral::drop_pending`]), as Synapse does.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use diesel_async::AsyncPgConnection;
use serde_json::{json, Value};

use super::{interest::RoomInterest, Registration};
use crate::{
    error::Result,
    service::{notifier::Notifier, presence::Presence, rooms::receipts::receipt_events},
    storage::{receipts as receipts_store, streams},
};

/// Stream positions an appservice has been sent ephemeral events up to.
#[derive(Clone, Copy)]
struct Sent {
    typing: i64,
    /// Unknown until the first look (the receipt stream is read from the database).
    receipts: Option<i64>,
    /// Likewise for the presence stream.
    presence: Option<i64>,
}

/// Ephemeral events for the appservices, in the sending process.
pub struct Ephemeral {
    notifier: Arc<Notifier>,
    presence: Arc<Presence>,
    sent: Mutex<HashMap<String, Sent>>,
}

impl Ephemeral {
    /// Starts every appservice at the current positions.
    pub fn new(notifier: Arc<Notifier>, presence: Arc<Presence>) -> Self {
        Ephemeral {
            notifier,
            presence,
            sent: Mutex::default(),
        }
    }

    fn sent(&self, appservice_id: &str) -> Sent {
        let typing = self.notifier.typing.position();
        *self
            .sent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(appservice_id.to_owned())
            .or_insert(Sent {
                typing,
                receipts: None,
                presence: None,
            })
    }

    fn set_sent(&self, appservice_id: &str, sent: Sent) {
        self.sent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(appservice_id.to_owned(), sent);
    }

    /// The `m.typing` and `m.receipt` events (each with its `room_id`) of the rooms that
    /// interest the appservice and the `m.presence` events of the users that interest it,
    /// since it was last sent them; none unless it asked for them.
    pub async fn collect(
        &self,
        conn: &AsyncPgConnection,
        registration: &Registration,
        interest: &mut RoomInterest<'_>,
    ) -> Result<Vec<Value>> {
        if !registration.wants_ephemeral() {
            return Ok(Vec::new());
        }
        let sent = self.sent(&registration.id);
        let typing = &self.notifier.typing;
        let typing_now = typing.position();
        let receipts_now = streams::persisted(conn, streams::RECEIPTS).await?;
        let presence_now = streams::persisted(conn, streams::PRESENCE).await?;
        let mut events = Vec::new();
        if sent.typing < typing_now {
            let mut rooms = Vec::new();
            for room in typing.rooms() {
                if interest.room(conn, &room).await? {
                    rooms.push(room);
                }
            }
            let mut changed: Vec<_> = typing
                .changed_since(&rooms, Some(sent.typing), typing_now)
                .into_iter()
                .collect();
            changed.sort();
            events.extend(changed.into_iter().map(|(room_id, users)| {
                json!({ "type": "m.typing", "room_id": room_id, "content": { "user_ids": users } })
            }));
        }
        if let Some(after) = sent.receipts.filter(|after| *after < receipts_now) {
            let rows =
                receipts_store::get_public_receipts_changed(conn, after, receipts_now).await?;
            let mut by_room: Vec<_> = receipt_events(rows, None).into_iter().collect();
            by_room.sort_by(|a, b| a.0.cmp(&b.0));
            for (room_id, mut event) in by_room {
                if interest.room(conn, &room_id).await? {
                    event["room_id"] = Value::from(room_id);
                    events.push(event);
                }
            }
        }
        if let Some(after) = sent.presence {
            for event in self
                .presence
                .events_between(conn, after, presence_now)
                .await?
            {
                let sender = event["sender"].as_str().unwrap_or_default();
                if interest.presence(conn, sender).await? {
                    events.push(event);
                }
            }
        }
        self.set_sent(
            &registration.id,
            Sent {
                typing: typing_now,
                receipts: Some(receipts_now),
                presence: Some(presence_now),
            },
        );
        Ok(events)
    }

    /// Forgets what happened so far for an appservice that is failing: it is not replayed.
    pub async fn drop_pending(&self, conn: &AsyncPgConnection, appservice_id: &str) -> Result<()> {
        let receipts = streams::persisted(conn, streams::RECEIPTS).await?;
        let presence = streams::persisted(conn, streams::PRESENCE).await?;
        self.set_sent(
            appservice_id,
            Sent {
                typing: self.notifier.typing.position(),
                receipts: Some(receipts),
                presence: Some(presence),
            },
        );
        Ok(())
    }
}
