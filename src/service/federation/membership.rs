//! Membership handshakes with this server as the resident: another server's user joins one of
//! our rooms through `make_join` (we hand out an unsigned template built on the room's
//! current extremities and state) and `send_join` (the joining server's signed event goes
//! through every check, [`Rooms::receive_pdu`], and the answer is the room's state before it
//! with its auth chain, whole: `members_omitted` stays false even when Synapse asks for a
//! partial state, which the spec allows). `make_knock` and `send_knock` are the same
//! handshake for a knock, answered with the room state a knocker sees; `make_leave` and
//! `send_leave` for a leave.

use actix_web::http::StatusCode;
use ruma::{
    api::federation::membership::RawStrippedState, canonical_json::CanonicalJsonObject,
    events::StateEventType, room_version_rules::RoomVersionRules, signatures::hash_and_sign_event,
    state_res::check_state_dependent_auth_rules, EventId, OwnedEventId, RoomId, RoomVersionId,
    ServerName, UserId,
};
use serde_json::{json, value::RawValue as RawJsonValue, Value};

use super::{
    invite::stripped_room_state,
    pdus::Dropped,
    room_access::{acl_allows, federation_pdu},
    Federation,
};
use crate::{
    error::{Error, Result},
    service::rooms::{
        incoming::Received,
        pdu::{Pdu, MAX_PDU_BYTES},
        writer::choose_prev_events,
        Rooms,
    },
    storage::{dag, now_ms, room_servers, rooms as store},
};

/// An unsigned `m.room.member` event of `sender` about `target` with `content`, on the
/// room's current forward extremities (at most 20, the deepest) with the auth events the
/// rules select from the current state; 403 `M_FORBIDDEN` when the auth rules refuse it now
/// (refused before anyone signs anything).
pub(super) async fn member_template(
    conn: &diesel_async::AsyncPgConnection,
    rules: &RoomVersionRules,
    room_id: &RoomId,
    sender: &UserId,
    target: &UserId,
    content: Value,
) -> Result<Value> {
    let extremities: Vec<(OwnedEventId, i64)> =
        dag::get_forward_extremities(conn, room_id.as_str())
            .await?
            .into_iter()
            .filter_map(|(id, depth)| Some((OwnedEventId::try_from(id).ok()?, depth)))
            .collect();
    let (prev_events, depth) = choose_prev_events(&extremities);
    let content_raw = serde_json::value::to_raw_value(&content).map_err(Error::internal)?;
    let kind = ruma::events::TimelineEventType::RoomMember;
    let auth_types = ruma::state_res::auth_types_for_event(
        &kind,
        sender,
        Some(target.as_str()),
        &content_raw,
        &rules.authorization,
    )
    .map_err(|e| Error::bad_json(format!("Invalid member event: {e}")))?;
    let auth_keys: Vec<(String, String)> = auth_types
        .iter()
        .map(|(kind, key)| (kind.to_string(), key.clone()))
        .collect();
    // What the auth rules read: the selected auth events, the create event (never an auth
    // event in v12) and the power levels and join rules.
    let mut keys: Vec<(&str, &str)> = auth_keys
        .iter()
        .map(|(kind, key)| (kind.as_str(), key.as_str()))
        .collect();
    keys.extend([
        ("m.room.create", ""),
        ("m.room.power_levels", ""),
        ("m.room.join_rules", ""),
        ("m.room.member", sender.as_str()),
    ]);
    let state = store::get_current_state_events(conn, room_id.as_str(), &keys).await?;
    let auth_events: Vec<&str> = state
        .iter()
        .filter(|row| {
            auth_keys.iter().any(|(kind, key)| {
                *kind == row.event_type && Some(key.as_str()) == row.state_key.as_deref()
            })
        })
        .map(|row| row.event_id.as_str())
        .collect();
    let template = json!({
        "room_id": room_id,
        "type": "m.room.member",
        "state_key": target,
        "sender": sender,
        "content": content,
        "origin": sender.server_name(),
        "origin_server_ts": now_ms(),
        "depth": depth,
        "prev_events": prev_events,
        "auth_events": auth_events,
    });
    let candidate = Pdu::from_json("$template", &template)?;
    let pdus: Vec<Pdu> = state
        .iter()
        .map(|row| Pdu::from_json(&row.event_id, &row.pdu))
        .collect::<Result<_>>()?;
    check_state_dependent_auth_rules(
        &rules.authorization,
        &candidate,
        |kind: &StateEventType, key: &str| {
            pdus.iter()
                .find(|p| {
                    p.kind.to_string() == kind.to_string() && p.state_key.as_deref() == Some(key)
                })
                .cloned()
        },
    )
    .map_err(|reason| Error::forbidden(format!("Not allowed: {reason}")))?;
    Ok(template)
}

/// What `send_join` answers: the room's state before the join, its auth chain, and the join
/// as we countersigned it (restricted joins only).
pub struct SendJoinAnswer {
    /// The state before the join, as PDUs.
    pub state: Vec<Box<RawJsonValue>>,
    /// Its auth chain, as PDUs.
    pub auth_chain: Vec<Box<RawJsonValue>>,
    /// The join with our signature, when we authorised it.
    pub event: Option<Box<RawJsonValue>>,
}

/// A room this server is in, as a resident answering another server.
struct ResidentRoom {
    version: RoomVersionId,
    rules: RoomVersionRules,
}

impl Federation {
    /// `make_join`: a join template for `user_id` (of `origin`) in `room_id`, for a server
    /// that supports one of `versions`.
    /// In a `restricted` room, a user who is neither invited nor joined may join through a
    /// room the join rules allow (one we are in, where they are joined): the template names a
    /// local member who may invite (`join_authorised_via_users_server`), and we countersign
    /// the join on `send_join`.
    pub async fn make_join(
        &self,
        rooms: &Rooms,
        origin: &ServerName,
        room_id: &RoomId,
        user_id: &UserId,
        versions: &[RoomVersionId],
    ) -> Result<(RoomVersionId, Value)> {
        let conn = self.db.conn().await?;
        let mut content = json!({ "membership": "join" });
        if let Some(authoriser) = rooms
            .restricted_join_authoriser(&conn, user_id, room_id)
            .await?
        {
            content["join_authorised_via_users_server"] = json!(authoriser);
        }
        drop(conn);
        self.make_member(origin, room_id, user_id, Some(versions), content)
            .await
    }

    /// `make_knock`: a knock template, in a room whose version and join rule (`knock` or
    /// `knock_restricted`) allow knocking, for a server that supports one of `versions`.
    pub async fn make_knock(
        &self,
        origin: &ServerName,
        room_id: &RoomId,
        user_id: &UserId,
        versions: &[RoomVersionId],
    ) -> Result<(RoomVersionId, Value)> {
        self.make_member(
            origin,
            room_id,
            user_id,
            Some(versions),
            json!({ "membership": "knock" }),
        )
        .await
    }

    /// A template of `user_id`'s own member event with `content`: the user must be of
    /// `origin`, the room ours and open to `origin`, its version among `versions` (when the
    /// handshake names them), and the auth rules must allow the event now.
    async fn make_member(
        &self,
        origin: &ServerName,
        room_id: &RoomId,
        user_id: &UserId,
        versions: Option<&[RoomVersionId]>,
        content: Value,
    ) -> Result<(RoomVersionId, Value)> {
        let membership = content["membership"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if user_id.server_name() != origin {
            return Err(Error::forbidden("The user is not on the requesting server"));
        }
        let conn = self.db.conn().await?;
        let room = self.resident_room(&conn, origin, room_id).await?;
        if versions.is_some_and(|versions| !versions.contains(&room.version)) {
            return Err(Error::matrix(
                StatusCode::BAD_REQUEST,
                "M_INCOMPATIBLE_ROOM_VERSION",
                format!(
                    "The room is of version {}, which the requesting server does not support",
                    room.version
                ),
            )
            .with("room_version", room.version.as_str()));
        }
        if membership == "knock" {
            // Said plainly rather than left to the auth rules' wording.
            let rule =
                store::get_current_state_event(&conn, room_id.as_str(), "m.room.join_rules", "")
                    .await?
                    .and_then(|row| row.pdu["content"]["join_rule"].as_str().map(str::to_owned));
            let knockable = match rule.as_deref() {
                Some("knock") => room.rules.authorization.knocking,
                Some("knock_restricted") => room.rules.authorization.knock_restricted_join_rule,
                _ => false,
            };
            if !knockable {
                return Err(Error::forbidden("This room does not take knocks"));
            }
        }
        let template = member_template(&conn, &room.rules, room_id, user_id, user_id, content)
            .await
            .map_err(|e| match e {
                Error::Matrix {
                    errcode: "M_FORBIDDEN",
                    message,
                    ..
                } => Error::forbidden(format!("You may not {membership} here: {message}")),
                other => other,
            })?;
        Ok((room.version, template))
    }

    /// `send_join` (v2): takes the joining server's signed join event and answers the room's
    /// state before it and the auth chain, as PDUs.
    pub async fn send_join(
        &self,
        rooms: &Rooms,
        origin: &ServerName,
        room_id: &RoomId,
        event_id: &EventId,
        pdu: &RawJsonValue,
    ) -> Result<SendJoinAnswer> {
        let (event_id, countersigned) = self
            .take_member_event(rooms, origin, room_id, event_id, pdu, "join")
            .await?;
        let (state, auth_chain) = self
            .get_state_for_server(origin, room_id, &event_id)
            .await?;
        Ok(SendJoinAnswer {
            state,
            auth_chain,
            event: countersigned,
        })
    }

    /// `send_knock`: takes the knocking server's signed knock event and answers the room's
    /// state a knocker sees (the same as an invite carries).
    pub async fn send_knock(
        &self,
        rooms: &Rooms,
        origin: &ServerName,
        room_id: &RoomId,
        event_id: &EventId,
        pdu: &RawJsonValue,
    ) -> Result<Vec<RawStrippedState>> {
        self.take_member_event(rooms, origin, room_id, event_id, pdu, "knock")
            .await?;
        let conn = self.db.conn().await?;
        stripped_room_state(&conn, room_id, None).await
    }

    /// `make_leave`: a leave template for `user_id` (of `origin`), who is in the room, invited
    /// to it or knocking on it.
    pub async fn make_leave(
        &self,
        origin: &ServerName,
        room_id: &RoomId,
        user_id: &UserId,
    ) -> Result<(RoomVersionId, Value)> {
        self.make_member(
            origin,
            room_id,
            user_id,
            None,
            json!({ "membership": "leave" }),
        )
        .await
    }

    /// `send_leave` (v2): takes the leaving server's signed leave event (a rejected invite, a
    /// withdrawn knock, a leave).
    pub async fn send_leave(
        &self,
        rooms: &Rooms,
        origin: &ServerName,
        room_id: &RoomId,
        event_id: &EventId,
        pdu: &RawJsonValue,
    ) -> Result<()> {
        self.take_member_event(rooms, origin, room_id, event_id, pdu, "leave")
            .await
            .map(drop)
    }

    /// Takes a user's own member event with `membership` sent by their server through a
    /// membership handshake: the event must be that, for this room, with the path's event ID,
    /// and pass every check like any PDU. A restricted join one of our users authorises is
    /// countersigned first (the auth rules want our signature on it), and answered.
    async fn take_member_event(
        &self,
        rooms: &Rooms,
        origin: &ServerName,
        room_id: &RoomId,
        event_id: &EventId,
        pdu: &RawJsonValue,
        membership: &str,
    ) -> Result<(OwnedEventId, Option<Box<RawJsonValue>>)> {
        if pdu.get().len() > MAX_PDU_BYTES + 1 {
            return Err(Error::bad_json("The event is too large"));
        }
        let mut object: CanonicalJsonObject = serde_json::from_str(pdu.get())
            .map_err(|e| Error::bad_json(format!("The event is not a valid PDU: {e}")))?;
        let value: Value = serde_json::from_str(pdu.get()).map_err(Error::internal)?;
        let conn = self.db.conn().await?;
        let room = self.resident_room(&conn, origin, room_id).await?;
        drop(conn);
        let field = |name: &str| value.get(name).and_then(Value::as_str);
        let sender = field("sender")
            .and_then(|sender| UserId::parse(sender).ok())
            .ok_or_else(|| Error::invalid_param("The event has no valid sender"))?;
        if field("type") != Some("m.room.member")
            || field("state_key") != Some(sender.as_str())
            || value.pointer("/content/membership").and_then(Value::as_str) != Some(membership)
        {
            return Err(Error::invalid_param(format!(
                "This takes the sender's own m.room.member {membership} event"
            )));
        }
        if field("room_id") != Some(room_id.as_str()) {
            return Err(Error::invalid_param("The event is for another room"));
        }
        if sender.server_name() != origin {
            return Err(Error::forbidden("The user is not on the sending server"));
        }
        let authoriser = value
            .pointer("/content/join_authorised_via_users_server")
            .and_then(Value::as_str)
            .and_then(|user| UserId::parse(user).ok());
        let countersign = membership == "join"
            && authoriser.is_some_and(|user| user.server_name() == self.config.server_name);
        if countersign {
            // The hashes are recomputed from the event as received: were its content not what
            // its sender signed, their signature (which covers the hashes) fails the check.
            hash_and_sign_event(
                self.config.server_name.as_str(),
                &self.own_keys.key_pair,
                &mut object,
                &room.rules.redaction,
            )
            .map_err(|e| Error::bad_json(format!("The event cannot be signed: {e}")))?;
        }
        let checked = match self.check_pdu(&room.rules, object).await? {
            Ok(checked) => checked,
            Err(Dropped::Format(problem)) => {
                return Err(Error::bad_json(format!("Invalid event: {problem}")))
            }
            Err(Dropped::Signatures(problem)) => {
                return Err(Error::forbidden(format!("Bad signatures: {problem}")))
            }
        };
        if checked.event_id.as_str() != event_id.as_str() {
            return Err(Error::invalid_param(
                "The event ID in the path is not the event's",
            ));
        }
        let event_id: OwnedEventId = checked.event_id.clone();
        let countersigned = match countersign {
            true => Some(federation_pdu(
                &serde_json::to_value(&checked.pdu).map_err(Error::internal)?,
            )?),
            false => None,
        };
        match rooms.receive_pdu(room_id, &room.rules, checked).await? {
            Received::Accepted | Received::AlreadyKnown => Ok((event_id, countersigned)),
            Received::SoftFailed => Err(Error::forbidden(
                "The room's current state does not allow it",
            )),
            Received::Rejected(reason) | Received::NotTaken(reason) => {
                Err(Error::forbidden(format!("Refused: {reason}")))
            }
            Received::MissingPrevEvents | Received::MissingAuthEvents => Err(Error::forbidden(
                "The event is not built on events this server has (ask for a template again)",
            )),
        }
    }

    /// A room this server is in (a local member is joined), which `origin` may reach (its
    /// server ACL); 404 otherwise, as for an unknown room.
    async fn resident_room(
        &self,
        conn: &diesel_async::AsyncPgConnection,
        origin: &ServerName,
        room_id: &RoomId,
    ) -> Result<ResidentRoom> {
        let (room, acl, resident) = tokio::try_join!(
            store::get_room(conn, room_id.as_str()),
            store::get_current_state_event(conn, room_id.as_str(), "m.room.server_acl", ""),
            room_servers::has_joined_member_of_server(
                conn,
                room_id.as_str(),
                self.config.server_name.as_str()
            ),
        )?;
        let room = room
            .filter(|_| resident)
            .ok_or_else(|| Error::not_found("This server is not in that room"))?;
        if acl.is_some_and(|acl| !acl_allows(&acl.pdu["content"], origin)) {
            return Err(Error::forbidden("The room's server ACL denies your server"));
        }
        let version =
            RoomVersionId::try_from(room.room_version.as_str()).map_err(Error::internal)?;
        let rules = version
            .rules()
            .ok_or_else(|| Error::internal("room version without rules"))?;
        Ok(ResidentRoom { version, rules })
    }
}
