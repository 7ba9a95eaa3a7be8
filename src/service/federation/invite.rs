//! Invites across servers (`PUT /_matrix/federation/v2/invite`), both ways.
//!
//! Out: a local user invites a user of another server into a room we are in. The invite is
//! built on the room's current state and signed here, the invitee's server countersigns it,
//! and it then goes into the room like any checked event (and out to the room's servers).
//! `invite_room_state` carries full PDUs with the create event (MSC4311), as Synapse will
//! require.
//!
//! In: another server invites one of our users. The event is checked (format, signatures,
//! hashes; the sender on the sending server, the invitee ours), countersigned and stored
//! with the room state the inviting server sent, so the invitee's `/sync` shows the invite
//! with its name and avatar. That state is for display only: nothing is decided on it, and a
//! join goes through the room's servers.

use ruma::{
    api::federation::membership::{create_invite, RawStrippedState},
    canonical_json::{CanonicalJsonObject, CanonicalJsonValue},
    signatures::hash_and_sign_event,
    EventId, OwnedEventId, RoomId, RoomVersionId, ServerName, UserId,
};
use serde_json::{json, value::RawValue as RawJsonValue, Value};

use super::{membership::member_template, query::client_error, Federation};
use crate::{
    error::{Error, Result},
    service::rooms::{incoming::Received, pdu::Pdu, Rooms, SUPPORTED_VERSIONS},
    storage::{memberships as membership_store, rooms as store, users},
};

/// The state types an invite shows (with the inviter's member event).
const INVITE_STATE: [&str; 6] = [
    "m.room.create",
    "m.room.join_rules",
    "m.room.name",
    "m.room.avatar",
    "m.room.canonical_alias",
    "m.room.encryption",
];

/// The room state an invite or a knock carries so the invitee or knocker can show the room:
/// full PDUs (the spec since v1.16, MSC4311: Synapse reads the stripped fields of these and
/// will require the create event as a PDU), with `member`'s member event when given (the
/// inviter's).
pub(super) async fn stripped_room_state(
    conn: &diesel_async::AsyncPgConnection,
    room_id: &RoomId,
    member: Option<&UserId>,
) -> Result<Vec<RawStrippedState>> {
    let keys: Vec<(&str, &str)> = INVITE_STATE
        .iter()
        .map(|kind| (*kind, ""))
        .chain(member.map(|member| ("m.room.member", member.as_str())))
        .collect();
    let state = store::get_current_state_events(conn, room_id.as_str(), &keys).await?;
    state
        .iter()
        .map(|row| {
            let mut pdu = row.pdu.clone();
            if let Some(object) = pdu.as_object_mut() {
                object.remove("unsigned");
            }
            serde_json::value::to_raw_value(&pdu)
                .map(RawStrippedState::Pdu)
                .map_err(Error::internal)
        })
        .collect()
}

/// An invite another server sends (`PUT /v2/invite`).
pub struct IncomingInvite<'a> {
    /// The room of the path.
    pub room_id: &'a RoomId,
    /// The event ID of the path.
    pub event_id: &'a EventId,
    /// The room's version.
    pub version: &'a RoomVersionId,
    /// The signed invite.
    pub event: &'a RawJsonValue,
    /// The room state it comes with (full PDUs or stripped events).
    pub invite_room_state: &'a [Box<RawJsonValue>],
}

impl Federation {
    /// Invites `target` (a user of another server) into `room_id` as `sender`.
    pub async fn invite_remote(
        &self,
        rooms: &Rooms,
        sender: &UserId,
        room_id: &RoomId,
        target: &UserId,
        reason: Option<&str>,
        is_direct: bool,
    ) -> Result<()> {
        let conn = self.db.conn().await?;
        let room = store::get_room(&conn, room_id.as_str())
            .await?
            .ok_or_else(|| Error::not_found("Unknown room"))?;
        if let Some((membership, _)) =
            membership_store::get_membership(&conn, room_id.as_str(), target.as_str()).await?
        {
            if membership == "join" {
                return Err(Error::forbidden(format!("{target} is already in the room")));
            }
        }
        let version =
            RoomVersionId::try_from(room.room_version.as_str()).map_err(Error::internal)?;
        let rules = version
            .rules()
            .ok_or_else(|| Error::internal("room version without rules"))?;
        let mut content = json!({ "membership": "invite" });
        if let Some(reason) = reason {
            content["reason"] = json!(reason);
        }
        if is_direct {
            content["is_direct"] = json!(true);
        }
        let template = member_template(&conn, &rules, room_id, sender, target, content).await?;
        let invite_room_state = stripped_room_state(&conn, room_id, Some(sender)).await?;
        drop(conn);

        let mut event: CanonicalJsonObject =
            serde_json::from_value(template).map_err(Error::internal)?;
        hash_and_sign_event(
            self.config.server_name.as_str(),
            &self.own_keys.key_pair,
            &mut event,
            &rules.redaction,
        )
        .map_err(Error::internal)?;
        let hash = ruma::signatures::reference_hash(&event, &rules).map_err(Error::internal)?;
        let event_id = OwnedEventId::try_from(format!("${hash}")).map_err(Error::internal)?;
        let raw = serde_json::value::to_raw_value(&event).map_err(Error::internal)?;
        let request = create_invite::v2::Request::new(
            room_id.to_owned(),
            event_id.clone(),
            version.clone(),
            raw,
            invite_room_state,
        );
        let answer = self
            .client
            .send(target.server_name(), request)
            .await
            .map_err(|e| client_error(e, "invite"))?;
        let signed: CanonicalJsonObject = serde_json::from_str(answer.event.get())
            .map_err(|_| Error::bad_json("The invitee's server answered a malformed event"))?;
        let checked = self.check_pdu(&rules, signed).await?.map_err(|dropped| {
            Error::forbidden(format!(
                "The invitee's server answered a bad event: {dropped}"
            ))
        })?;
        if checked.event_id != event_id {
            return Err(Error::forbidden(
                "The invitee's server answered another event",
            ));
        }
        if !signed_by(&checked.pdu, target.server_name()) {
            return Err(Error::forbidden(
                "The invitee's server did not sign the invite",
            ));
        }
        match rooms.receive_pdu(room_id, &rules, checked).await? {
            Received::Accepted | Received::AlreadyKnown => Ok(()),
            Received::SoftFailed => Err(Error::forbidden("The invite is not allowed any more")),
            Received::Rejected(reason) | Received::NotTaken(reason) => Err(Error::forbidden(
                format!("The invite was refused: {reason}"),
            )),
            Received::MissingPrevEvents | Received::MissingAuthEvents => Err(Error::internal(
                "our own invite lost its prev or auth events",
            )),
        }
    }

    /// `PUT /v2/invite` from `origin`: checks, countersigns and stores an invite of one of our
    /// users; answers the countersigned event.
    pub async fn receive_invite(
        &self,
        rooms: &Rooms,
        origin: &ServerName,
        invite: IncomingInvite<'_>,
    ) -> Result<Value> {
        let IncomingInvite {
            room_id,
            event_id,
            version,
            event,
            invite_room_state,
        } = invite;
        if !SUPPORTED_VERSIONS.contains(version) {
            return Err(Error::matrix(
                actix_web::http::StatusCode::BAD_REQUEST,
                "M_INCOMPATIBLE_ROOM_VERSION",
                format!("Room version {version} is not supported here"),
            )
            .with("room_version", version.as_str()));
        }
        let rules = version
            .rules()
            .ok_or_else(|| Error::internal("room version without rules"))?;
        let value: Value = serde_json::from_str(event.get())
            .map_err(|_| Error::bad_json("The invite is not a JSON object"))?;
        let field = |name: &str| value.get(name).and_then(Value::as_str);
        let sender = field("sender")
            .and_then(|s| UserId::parse(s).ok())
            .ok_or_else(|| Error::invalid_param("The invite has no valid sender"))?;
        let target = field("state_key")
            .and_then(|s| UserId::parse(s).ok())
            .ok_or_else(|| Error::invalid_param("The invite has no valid state_key"))?;
        if field("type") != Some("m.room.member")
            || value.pointer("/content/membership").and_then(Value::as_str) != Some("invite")
        {
            return Err(Error::invalid_param("The event is not an invite"));
        }
        if field("room_id") != Some(room_id.as_str()) {
            return Err(Error::invalid_param("The invite is for another room"));
        }
        if sender.server_name() != origin {
            return Err(Error::forbidden("The inviter is not on the sending server"));
        }
        if target.server_name() != self.config.server_name {
            return Err(Error::invalid_param(
                "The invitee is not a user of this server",
            ));
        }
        let conn = self.db.conn().await?;
        if users::get_user(&conn, target.as_str()).await?.is_none() {
            return Err(Error::not_found(format!("User {target} does not exist")));
        }
        drop(conn);
        let object: CanonicalJsonObject = serde_json::from_str(event.get())
            .map_err(|_| Error::bad_json("The invite is not canonical JSON"))?;
        let checked = match self.check_pdu(&rules, object).await? {
            Ok(checked) if checked.event_id.as_str() == event_id.as_str() && !checked.redacted => {
                checked
            }
            Ok(_) => {
                return Err(Error::invalid_param(
                    "The event ID or content hash is wrong",
                ))
            }
            Err(dropped) => return Err(Error::forbidden(format!("Bad invite: {dropped}"))),
        };
        let mut signed = checked.pdu;
        hash_and_sign_event(
            self.config.server_name.as_str(),
            &self.own_keys.key_pair,
            &mut signed,
            &rules.redaction,
        )
        .map_err(Error::internal)?;
        let json = serde_json::to_value(&signed).map_err(Error::internal)?;
        let pdu = Pdu::from_json(event_id.as_str(), &json)?;
        let state: Vec<Value> = invite_room_state
            .iter()
            .filter_map(|raw| serde_json::from_str::<Value>(raw.get()).ok())
            .filter(|event| event.get("state_key").is_some() && event.get("type").is_some())
            .collect();
        rooms
            .store_out_of_band_membership(room_id, version, &pdu, &json, &state)
            .await?;
        Ok(json)
    }
}

/// Whether `server` signed `pdu`.
fn signed_by(pdu: &CanonicalJsonObject, server: &ServerName) -> bool {
    matches!(
        pdu.get("signatures"),
        Some(CanonicalJsonValue::Object(signatures)) if signatures.contains_key(server.as_str())
    )
}
