//! Which events an application service is sent (Synapse's `is_interested_in_event`, which
//! bridges are written against):
//! - the sender is its sender or in its users namespace (it gets its own events back);
//! - a member event's target is (invites to its bot and ghosts);
//! - the room is in its rooms namespace, or one of the room's aliases in its aliases namespace;
//! - a member of the room, joined or invited, is in its users namespace.
//!
//! A user's presence interests it when the user is in its users namespace or joined to a room
//! that interests it (Synapse's `is_interested_in_presence`).
//!
//! Room membership is the room's current one, looked up once per room per batch, so an event
//! a little older than the bot's join may be sent too; bridges ignore what they do not need.

use std::collections::HashMap;

use diesel_async::AsyncPgConnection;

use super::Registration;
use crate::{
    error::Result,
    storage::{
        memberships as membership_store,
        rooms::{self as rooms_store, EventRow},
    },
};

/// Which rooms interest one appservice, remembered for one batch of events.
pub struct RoomInterest<'a> {
    registration: &'a Registration,
    rooms: HashMap<String, bool>,
}

impl<'a> RoomInterest<'a> {
    /// An empty cache for `registration`.
    pub fn new(registration: &'a Registration) -> Self {
        RoomInterest {
            registration,
            rooms: HashMap::new(),
        }
    }

    /// Whether the room as a whole interests the appservice.
    pub async fn room(&mut self, conn: &AsyncPgConnection, room_id: &str) -> Result<bool> {
        if let Some(known) = self.rooms.get(room_id) {
            return Ok(*known);
        }
        let registration = self.registration;
        let interested = registration.matches_room(room_id)
            || membership_store::get_room_members_in(conn, room_id, &["join", "invite"])
                .await?
                .iter()
                .any(|user| registration.is_interested_in_user(user))
            || rooms_store::get_room_aliases(conn, room_id)
                .await?
                .iter()
                .any(|alias| registration.matches_alias(alias, false));
        self.rooms.insert(room_id.to_owned(), interested);
        Ok(interested)
    }

    /// Whether the appservice is sent the presence of `user_id`.
    pub async fn presence(&mut self, conn: &AsyncPgConnection, user_id: &str) -> Result<bool> {
        if self.registration.is_interested_in_user(user_id) {
            return Ok(true);
        }
        for room_id in membership_store::get_rooms_for_user(conn, user_id, "join").await? {
            if self.room(conn, &room_id).await? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Whether `event` is sent to the appservice.
    pub async fn event(&mut self, conn: &AsyncPgConnection, event: &EventRow) -> Result<bool> {
        let registration = self.registration;
        if registration.is_interested_in_user(&event.sender) {
            return Ok(true);
        }
        if event.event_type == "m.room.member"
            && event
                .state_key
                .as_deref()
                .is_some_and(|target| registration.is_interested_in_user(target))
        {
            // The room interests it from now on (the invitee is a member).
            self.rooms.insert(event.room_id.clone(), true);
            return Ok(true);
        }
        self.room(conn, &event.room_id).await
    }
}
