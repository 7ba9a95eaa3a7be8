//! Receiving `PUT /_matrix/federation/v1/send/{txnId}` (FEDERATION.md §1.4).
//!
//! - At most [`MAX_PDUS`] PDUs and [`MAX_EDUS`] EDUs (400 `M_TOO_LARGE`); the body's `origin`
//!   must be the authenticated server (403 `M_FORBIDDEN`).
//! - Idempotent per `(origin, txnId)`: the answer is stored in the same database transaction
//!   that applies the effects, with the `(origin, txnId)` row inserted first. A replay finds
//!   the row and gets the stored answer; a concurrent duplicate's insert waits for the first
//!   one to commit and then does the same, so effects apply once.
//! - Every EDU is checked against the origin; a bad one is dropped and logged, never an error
//!   for the transaction. To-device messages are committed before the 200 (a database failure
//!   fails the whole transaction, which the sender retries). Device-list and signing-key
//!   updates go to the keys service after the commit, once.
//! - PDUs: each passes the checks that need no room state ([`super::pdus`]) and the room's
//!   server ACL, then the room's own checks and is stored ([`super::inbound_pdus`]). Each gets
//!   `{}` or an error in the answer; a bad PDU never fails the transaction. PDUs are taken
//!   before the `(origin, txnId)` row is claimed (the checks may fetch keys from other
//!   servers): a replay finds them known and changes nothing.

use diesel_async::AsyncPgConnection;
use ruma::{
    api::federation::transactions::edu::Edu, serde::Raw, EventId, RoomId, ServerName, UserId,
};
use serde_json::{value::RawValue as RawJsonValue, Map, Value};

use super::{
    edus::{self, DEVICE_LIST_UPDATE, SIGNING_KEY_UPDATE},
    room_access::acl_allows,
    Federation,
};
use crate::{
    error::{Error, Result},
    service::{
        e2ee::{keys::Keys, to_device},
        notifier::{ROOM_CHANNEL, SHARERS_CHANNEL, TYPING_CHANNEL},
        presence::MAX_STATUS_MSG,
        rooms::Rooms,
        typing,
    },
    storage::{
        federation_received as store, memberships as membership_store, now_ms,
        presence as presence_store,
        receipts::{self as receipts_store, NewReceipt},
        remote_devices,
        rooms::{self as rooms_store, notify},
        streams,
    },
};

/// Most PDUs in one transaction.
pub const MAX_PDUS: usize = 50;
/// Most EDUs in one transaction.
pub const MAX_EDUS: usize = 100;
/// Longest to-device `message_id` accepted (it is stored for deduplication).
const MAX_MESSAGE_ID: usize = 255;
/// How long a remote user's typing lasts unless renewed (Synapse's `FEDERATION_TIMEOUT`; its
/// senders renew every 40 s, ours every [`super::edus::TYPING_RENEW_AFTER`]).
pub const REMOTE_TYPING_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// Most event IDs of one receipt looked at.
const MAX_RECEIPT_EVENTS: usize = 10;
/// Presence states another server may send.
const PRESENCE_STATES: [&str; 3] = ["online", "unavailable", "offline"];

/// A transaction as received (the parts the Server-Server API defines).
pub struct Transaction<'a> {
    /// The `txnId` path parameter.
    pub txn_id: &'a str,
    /// The body's `origin`.
    pub origin: &'a ServerName,
    /// The PDUs, unparsed.
    pub pdus: &'a [Box<RawJsonValue>],
    /// The EDUs, each parsed on its own.
    pub edus: &'a [Raw<Edu>],
}

/// One EDU that passed the shape check.
struct ParsedEdu {
    edu_type: String,
    content: Value,
}

impl Federation {
    /// Applies a transaction from `origin` (the authenticated server) once, and answers the
    /// `/send` response body (the same one for every replay).
    pub async fn receive_transaction(
        &self,
        keys: &Keys,
        rooms: &Rooms,
        origin: &ServerName,
        txn: Transaction<'_>,
    ) -> Result<Value> {
        if txn.origin != origin {
            return Err(Error::forbidden(format!(
                "The transaction's origin {} is not the server that sent it ({origin})",
                txn.origin
            )));
        }
        if txn.pdus.len() > MAX_PDUS || txn.edus.len() > MAX_EDUS {
            // 400, not the 413 of an oversized body: the spec's answer for these limits.
            return Err(Error::matrix(
                actix_web::http::StatusCode::BAD_REQUEST,
                "M_TOO_LARGE",
                format!("A transaction carries at most {MAX_PDUS} PDUs and {MAX_EDUS} EDUs"),
            ));
        }
        let edus: Vec<ParsedEdu> = txn
            .edus
            .iter()
            .filter_map(|raw| parse_edu(origin, raw))
            .collect();
        // Checked before the database transaction: the checks may fetch keys from other
        // servers.
        let response = self.receive_pdus(rooms, origin, txn.pdus).await?;
        let mut conn = self.db.conn().await?;
        let (response, first_time) =
            crate::storage::transaction::transaction(&mut conn, async |conn| {
                let now = now_ms();
                if !store::claim_txn(conn, origin.as_str(), txn.txn_id, &response, now).await? {
                    tracing::debug!(%origin, txn_id = txn.txn_id, "transaction replayed");
                    let stored = store::get_txn_response(conn, origin.as_str(), txn.txn_id)
                        .await?
                        .ok_or_else(|| Error::internal("a claimed transaction has no response"))?;
                    return Ok((stored, false));
                }
                for edu in &edus {
                    self.apply_edu(conn, origin, edu).await?;
                }
                Ok((response, true))
            })
            .await?;
        drop(conn);
        if first_time {
            // Device-list and signing-key updates go to the keys service after the commit, on
            // its own connections (holding ours meanwhile could exhaust the pool). Should the
            // process die in between, the next update's `prev_id` gap makes us resync.
            for edu in &edus {
                apply_key_edu(keys, origin, edu).await;
            }
        }
        Ok(response)
    }

    /// Applies one EDU inside the transaction's database transaction (all but device-list and
    /// signing-key updates, see [`apply_key_edu`]). Bad EDUs are logged and dropped (`Ok`); an
    /// error means the database failed and the transaction must not be acknowledged.
    async fn apply_edu(
        &self,
        conn: &AsyncPgConnection,
        origin: &ServerName,
        edu: &ParsedEdu,
    ) -> Result<()> {
        let content = &edu.content;
        match edu.edu_type.as_str() {
            to_device::DIRECT_TO_DEVICE => self.receive_to_device(conn, origin, content).await,
            DEVICE_LIST_UPDATE | SIGNING_KEY_UPDATE => Ok(()),
            edus::TYPING => self.receive_typing(conn, origin, edu).await,
            edus::RECEIPT => self.receive_receipts(conn, origin, edu).await,
            edus::PRESENCE => self.receive_presence(conn, origin, edu).await,
            _ => drop_edu(origin, edu, "unknown EDU type"),
        }
    }

    /// `m.direct_to_device`: the sender must be on the origin; delivered to this server's
    /// users only, once per `(origin, message_id)`.
    async fn receive_to_device(
        &self,
        conn: &AsyncPgConnection,
        origin: &ServerName,
        content: &Value,
    ) -> Result<()> {
        let why = |reason: &str| {
            tracing::info!(%origin, %reason, "to-device EDU dropped");
            Ok(())
        };
        if !user_is_on(origin, content.get("sender")) {
            return why("its sender is not a user of the origin");
        }
        let (Some(sender), Some(event_type), Some(message_id), Some(messages)) = (
            content.get("sender").and_then(Value::as_str),
            content.get("type").and_then(Value::as_str),
            content.get("message_id").and_then(Value::as_str),
            content.get("messages").and_then(Value::as_object),
        ) else {
            return why("sender, type, message_id or messages missing or malformed");
        };
        if message_id.is_empty() || message_id.len() > MAX_MESSAGE_ID {
            return why("message_id empty or too long");
        }
        if !store::claim_to_device_message(conn, origin.as_str(), message_id, now_ms()).await? {
            tracing::debug!(%origin, %message_id, "to-device EDU already delivered");
            return Ok(());
        }
        to_device::deliver_local(conn, &self.config.server_name, sender, event_type, messages)
            .await?;
        Ok(())
    }

    /// Why `origin` may not send typing or receipts for the room, if it may not: it must
    /// have a joined member in the room, and the room's server ACL must allow it.
    async fn room_edu_refused(
        &self,
        conn: &AsyncPgConnection,
        origin: &ServerName,
        room_id: &RoomId,
    ) -> Result<Option<&'static str>> {
        let joined =
            membership_store::get_room_members_in(conn, room_id.as_str(), &["join"]).await?;
        if !joined
            .iter()
            .any(|user| UserId::parse(user.as_str()).is_ok_and(|u| u.server_name() == origin))
        {
            return Ok(Some("the origin has no member in the room"));
        }
        let acl =
            rooms_store::get_current_state_event(conn, room_id.as_str(), "m.room.server_acl", "")
                .await?;
        if acl.is_some_and(|acl| !acl_allows(&acl.pdu["content"], origin)) {
            return Ok(Some("the room's server ACL denies the origin"));
        }
        Ok(None)
    }

    /// `m.typing`: a user of the origin, joined to a room the origin may speak in, starts or
    /// stops typing. Announced to every process like a local user's typing; a start lasts
    /// [`REMOTE_TYPING_TIMEOUT`] unless renewed, so a lost stop cannot leave the user typing.
    async fn receive_typing(
        &self,
        conn: &AsyncPgConnection,
        origin: &ServerName,
        edu: &ParsedEdu,
    ) -> Result<()> {
        let content = &edu.content;
        if !user_is_on(origin, content.get("user_id")) {
            return drop_edu(origin, edu, "its user_id is not a user of the origin");
        }
        let (Some(room_id), Some(user_id), Some(typing)) = (
            content
                .get("room_id")
                .and_then(Value::as_str)
                .and_then(|r| RoomId::parse(r).ok()),
            content.get("user_id").and_then(Value::as_str),
            content.get("typing").and_then(Value::as_bool),
        ) else {
            return drop_edu(
                origin,
                edu,
                "room_id, user_id or typing missing or malformed",
            );
        };
        if let Some(reason) = self.room_edu_refused(conn, origin, &room_id).await? {
            return drop_edu(origin, edu, reason);
        }
        let membership = membership_store::get_membership(conn, room_id.as_str(), user_id).await?;
        if membership.is_none_or(|(membership, _)| membership != "join") {
            return drop_edu(origin, edu, "its user is not joined to the room");
        }
        let timeout = typing.then_some(REMOTE_TYPING_TIMEOUT);
        let payload = typing::encode(room_id.as_str(), user_id, timeout);
        notify(conn, TYPING_CHANNEL, &payload).await?;
        Ok(())
    }

    /// `m.receipt`: public read receipts (`m.read`) of the origin's users, per room the origin
    /// may speak in, stored like local ones (a receipt never moves back). Other receipt types
    /// are dropped.
    async fn receive_receipts(
        &self,
        conn: &AsyncPgConnection,
        origin: &ServerName,
        edu: &ParsedEdu,
    ) -> Result<()> {
        let Some(rooms) = edu.content.as_object() else {
            return drop_edu(origin, edu, "its content is not an object");
        };
        for (room_id, by_type) in rooms {
            let Ok(room_id) = RoomId::parse(room_id.as_str()) else {
                drop_edu(origin, edu, "a room ID is malformed")?;
                continue;
            };
            if let Some(reason) = self.room_edu_refused(conn, origin, &room_id).await? {
                drop_edu(origin, edu, reason)?;
                continue;
            }
            let Some(by_type) = by_type.as_object() else {
                continue;
            };
            for (receipt_type, by_user) in by_type {
                if receipt_type != "m.read" {
                    drop_edu(origin, edu, "only m.read receipts travel between servers")?;
                    continue;
                }
                for (user, receipt) in by_user.as_object().into_iter().flatten() {
                    if !user_is_on(origin, Some(&Value::from(user.as_str()))) {
                        drop_edu(origin, edu, "a receipt's user is not a user of the origin")?;
                        continue;
                    }
                    self.receive_receipt(conn, &room_id, user, receipt).await?;
                }
            }
        }
        Ok(())
    }

    /// Stores one remote user's `m.read` receipt (`{event_ids, data: {ts, thread_id}}`) for
    /// the latest of its events we have in the room (or its last one); wakes the room's
    /// syncs when it moved.
    async fn receive_receipt(
        &self,
        conn: &AsyncPgConnection,
        room_id: &RoomId,
        user: &str,
        receipt: &Value,
    ) -> Result<()> {
        let event_ids: Vec<String> = receipt
            .get("event_ids")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .take(MAX_RECEIPT_EVENTS)
            .map(str::to_owned)
            .collect();
        let thread = match receipt.pointer("/data/thread_id").and_then(Value::as_str) {
            None => "",
            Some(thread) if thread == "main" || thread.starts_with('$') => thread,
            Some(_) => {
                tracing::debug!(%room_id, %user, "receipt with a bad thread_id dropped");
                return Ok(());
            }
        };
        let latest = rooms_store::get_events(conn, &event_ids)
            .await?
            .into_iter()
            .filter(|event| event.room_id == room_id.as_str())
            .max_by_key(|event| event.stream_ordering);
        // A receipt for an event we do not have (yet) is kept too, as Synapse keeps it (its
        // PR 17096), placed at the newest event we have.
        let (event_id, event_stream) = match latest {
            Some(event) => (event.event_id, event.stream_ordering),
            None => match event_ids
                .last()
                .filter(|id| EventId::parse(id.as_str()).is_ok())
            {
                Some(id) => (id.clone(), streams::persisted(conn, streams::EVENTS).await?),
                None => {
                    tracing::debug!(%room_id, %user, "receipt without a valid event ID dropped");
                    return Ok(());
                }
            },
        };
        let ts = receipt
            .pointer("/data/ts")
            .and_then(Value::as_i64)
            .unwrap_or_else(now_ms);
        let receipt = NewReceipt {
            room_id: room_id.as_str(),
            user_id: user,
            receipt_type: "m.read",
            thread_id: thread,
            event_id: &event_id,
            event_stream,
            ts,
        };
        if receipts_store::set_receipt(conn, &receipt).await? {
            notify(conn, ROOM_CHANNEL, room_id.as_str()).await?;
        }
        Ok(())
    }

    /// `m.presence`: the origin's users' presence, kept (when presence is on here) for those
    /// who share a room with one of our users, and shown to those users like local presence.
    async fn receive_presence(
        &self,
        conn: &AsyncPgConnection,
        origin: &ServerName,
        edu: &ParsedEdu,
    ) -> Result<()> {
        let Some(pushes) = edu.content.get("push").and_then(Value::as_array) else {
            return drop_edu(origin, edu, "no push list");
        };
        if !self.config.presence_enabled {
            return drop_edu(origin, edu, "presence is off here");
        }
        let now = now_ms();
        for push in pushes {
            if !user_is_on(origin, push.get("user_id")) {
                drop_edu(origin, edu, "a presence user is not a user of the origin")?;
                continue;
            }
            let user = push["user_id"].as_str().unwrap_or_default();
            let state = push.get("presence").and_then(Value::as_str);
            let Some(state) = state.filter(|s| PRESENCE_STATES.contains(s)) else {
                drop_edu(origin, edu, "a presence state is unknown")?;
                continue;
            };
            let status_msg = push
                .get("status_msg")
                .and_then(Value::as_str)
                .filter(|msg| msg.len() <= MAX_STATUS_MSG);
            let ago = push
                .get("last_active_ago")
                .and_then(Value::as_i64)
                .unwrap_or(0)
                .clamp(0, now);
            if remote_devices::get_users_sharing_rooms(conn, &[user.to_owned()])
                .await?
                .is_empty()
            {
                drop_edu(origin, edu, "the presence user shares no room with ours")?;
                continue;
            }
            presence_store::lock_presence(conn, user).await?;
            presence_store::set_presence(conn, user, state, status_msg, now - ago, now).await?;
            notify(conn, SHARERS_CHANNEL, user).await?;
        }
        Ok(())
    }
}

/// Hands a device-list or signing-key update whose user is on `origin` to the keys service;
/// other EDUs are ignored here. Failures are logged: the EDU is dropped.
async fn apply_key_edu(keys: &Keys, origin: &ServerName, edu: &ParsedEdu) {
    let content = &edu.content;
    let is_key_edu = matches!(
        edu.edu_type.as_str(),
        DEVICE_LIST_UPDATE | SIGNING_KEY_UPDATE
    );
    if !is_key_edu {
        return;
    }
    if !user_is_on(origin, content.get("user_id")) {
        let _ = drop_edu(origin, edu, "its user_id is not a user of the origin");
        return;
    }
    let applied = if edu.edu_type == DEVICE_LIST_UPDATE {
        keys.on_device_list_update(origin, content).await
    } else {
        keys.on_signing_key_update(origin, content).await
    };
    if let Err(err) = applied {
        tracing::warn!(%origin, edu_type = %edu.edu_type, "EDU not applied: {err}");
    }
}

/// Whether `user` is a user ID of `origin`.
fn user_is_on(origin: &ServerName, user: Option<&Value>) -> bool {
    user.and_then(Value::as_str)
        .and_then(|u| UserId::parse(u).ok())
        .is_some_and(|u| u.server_name() == origin)
}

/// Logs an EDU that is dropped.
fn drop_edu(origin: &ServerName, edu: &ParsedEdu, reason: &str) -> Result<()> {
    tracing::debug!(%origin, edu_type = %edu.edu_type, %reason, "EDU dropped");
    Ok(())
}

/// An EDU's type and content, or `None` (logged) when it is not `{edu_type, content}`.
fn parse_edu(origin: &ServerName, raw: &Raw<Edu>) -> Option<ParsedEdu> {
    let parsed = serde_json::from_str::<Map<String, Value>>(raw.json().get())
        .ok()
        .and_then(|mut edu| {
            let edu_type = edu.get("edu_type")?.as_str()?.to_owned();
            let content = edu.remove("content").filter(Value::is_object)?;
            Some(ParsedEdu { edu_type, content })
        });
    if parsed.is_none() {
        tracing::info!(%origin, "malformed EDU dropped");
    }
    parsed
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_edu_must_have_a_type_and_an_object_content() {
        let origin = ServerName::parse("example.org").unwrap();
        let raw =
            |json: &str| Raw::<Edu>::from_json(RawJsonValue::from_string(json.into()).unwrap());
        assert!(parse_edu(&origin, &raw(r#"{"edu_type":"m.typing","content":{}}"#)).is_some());
        assert!(parse_edu(&origin, &raw(r#"{"edu_type":"m.typing"}"#)).is_none());
        assert!(parse_edu(&origin, &raw(r#"{"edu_type":"m.typing","content":[]}"#)).is_none());
        assert!(parse_edu(&origin, &raw(r#"{"edu_type":7,"content":{}}"#)).is_none());
        assert!(parse_edu(&origin, &raw("[1]")).is_none());
    }

    #[test]
    fn a_user_belongs_to_its_server_only() {
        let origin = ServerName::parse("example.org:8448").unwrap();
        assert!(user_is_on(&origin, Some(&json!("@a:example.org:8448"))));
        assert!(!user_is_on(&origin, Some(&json!("@a:example.org"))));
        assert!(!user_is_on(&origin, Some(&json!("not a user"))));
        assert!(!user_is_on(&origin, Some(&json!(1))));
        assert!(!user_is_on(&origin, None));
    }
}
