//! Joining a room on another server: `make_join` for a template, our signed join through
//! `send_join` (v2, the full state: no partial-state joins), and the room's state checked
//! event by event before anything is stored (state is never taken on trust: every event of
//! the answer passes the format, signature and hash checks and the auth rules against its own
//! auth events; the join must pass them against the state it comes with).
//!
//! Candidate servers are tried in turn: the `via` servers the client named, those of the
//! alias, and the server in the room ID (rooms before v12), never our own.

use std::collections::{BTreeSet, HashMap};

use ruma::{
    api::federation::membership::{create_join_event, prepare_join_event},
    canonical_json::{CanonicalJsonObject, CanonicalJsonValue},
    events::StateEventType,
    room_version_rules::RoomVersionRules,
    signatures::{hash_and_sign_event, reference_hash},
    state_res::{check_state_dependent_auth_rules, check_state_independent_auth_rules},
    EventId, OwnedEventId, OwnedRoomId, OwnedServerName, RoomAliasId, RoomId, RoomOrAliasId,
    RoomVersionId, UserId,
};
use serde_json::{value::RawValue as RawJsonValue, Value};

use super::{query::client_error, Federation};
use crate::{
    error::{Error, Result},
    service::{
        e2ee::local_devices_changed,
        rooms::{
            pdu::Pdu,
            remote_join::{JoinedRoom, StateEvent},
            send::Origin,
            Rooms, SUPPORTED_VERSIONS,
        },
    },
    storage::{devices, now_ms},
};

/// An event of a `send_join` answer that passed every check.
struct Checked {
    pdu: Pdu,
    json: Value,
}

impl Federation {
    /// Joins `user_id` to a room: through another server when this one is not in the room,
    /// locally otherwise.
    pub async fn join(
        &self,
        rooms: &Rooms,
        user_id: &UserId,
        room: &RoomOrAliasId,
        via: &[OwnedServerName],
        reason: Option<&str>,
    ) -> Result<OwnedRoomId> {
        let (room_id, servers) = self.route(rooms, user_id, room, via).await?;
        let Some(servers) = servers else {
            let room = ruma::OwnedRoomOrAliasId::from(room_id);
            return rooms.join(user_id, &room, reason, Origin::Client).await;
        };
        self.through_each(&servers, &room_id, "join", async |server| {
            self.join_through(rooms, server, user_id, &room_id, reason)
                .await
        })
        .await?;
        Ok(room_id)
    }

    /// Where a membership handshake for `user_id` with `room` goes: `None` for a room this
    /// server is in (or with federation off: the change is made here), or the servers to try
    /// in turn: the `via` servers the client named, those of the alias, the inviter's and the
    /// server in the room ID (rooms before v12), never our own.
    pub(super) async fn route(
        &self,
        rooms: &Rooms,
        user_id: &UserId,
        room: &RoomOrAliasId,
        via: &[OwnedServerName],
    ) -> Result<(OwnedRoomId, Option<Vec<OwnedServerName>>)> {
        let ours = &self.config.server_name;
        let (room_id, mut servers) = match <&RoomId>::try_from(room) {
            Ok(room_id) => (room_id.to_owned(), Vec::new()),
            Err(alias) => {
                let alias: &RoomAliasId = alias;
                match alias.server_name() == ours || !self.enabled() {
                    true => (rooms.resolve_room(room).await?, Vec::new()),
                    false => self.remote_alias(alias).await?,
                }
            }
        };
        rooms.ensure_not_blocked(&room_id).await?;
        if !self.enabled() || rooms.is_resident(&room_id).await? {
            return Ok((room_id, None));
        }
        servers.splice(0..0, via.iter().cloned());
        // Whoever invited us is in the room.
        if let Some(inviter) = rooms.inviter(&room_id, user_id).await? {
            servers.push(inviter.server_name().to_owned());
        }
        if let Some(server) = room_id.server_name() {
            servers.push(server.to_owned());
        }
        Ok((room_id, Some(self.candidates(servers))))
    }

    /// `servers` without duplicates and without this server, in order.
    pub(super) fn candidates(&self, mut servers: Vec<OwnedServerName>) -> Vec<OwnedServerName> {
        let mut seen = BTreeSet::new();
        servers.retain(|server| server != &self.config.server_name && seen.insert(server.clone()));
        servers
    }

    /// Runs one handshake (`what`: "join", "knock", "leave") through each server in turn
    /// until one succeeds; the last failure otherwise.
    pub(super) async fn through_each(
        &self,
        servers: &[OwnedServerName],
        room_id: &RoomId,
        what: &str,
        attempt: impl AsyncFn(&OwnedServerName) -> Result<()>,
    ) -> Result<()> {
        if servers.is_empty() {
            return Err(Error::not_found(format!(
                "This server is not in the room and knows no server to {what} it through"
            )));
        }
        let mut last_error = None;
        for server in servers {
            match attempt(server).await {
                Ok(()) => return Ok(()),
                Err(problem) => {
                    tracing::info!(%server, %room_id, %problem, "remote {what} failed");
                    last_error = Some(problem);
                }
            }
        }
        Err(last_error
            .unwrap_or_else(|| Error::not_found(format!("No server could {what} the room"))))
    }

    /// One attempt at joining through `server`.
    async fn join_through(
        &self,
        rooms: &Rooms,
        server: &OwnedServerName,
        user_id: &UserId,
        room_id: &RoomId,
        reason: Option<&str>,
    ) -> Result<()> {
        let mut request =
            prepare_join_event::v1::Request::new(room_id.to_owned(), user_id.to_owned());
        request.ver = SUPPORTED_VERSIONS.to_vec();
        let made = self
            .client
            .send(server, request)
            .await
            .map_err(|e| client_error(e, "room (make_join)"))?;
        let (version, rules) = supported(made.room_version)?;
        let extra = member_content(rooms.own_member_profile(user_id).await?, reason);
        let (event_id, join) =
            self.sign_member(&made.event, &rules, user_id, room_id, "join", extra)?;
        let raw = serde_json::value::to_raw_value(&join).map_err(Error::internal)?;
        let answer = self
            .client
            .send(
                server,
                create_join_event::v2::Request::new(room_id.to_owned(), event_id.clone(), raw),
            )
            .await
            .map_err(|e| client_error(e, "room (send_join)"))?
            .room_state;
        // A restricted join comes back signed by the resident too.
        let join = match &answer.event {
            Some(event) => serde_json::from_str(event.get()).map_err(Error::internal)?,
            None => join,
        };
        let room = self
            .check_room_state(&rules, &version, room_id, &answer.state, &answer.auth_chain)
            .await?;
        let join = self.check_join(&rules, &event_id, join, &room).await?;
        rooms.store_joined_room(room, join).await?;
        // The join is stored: a failed announcement must not tell the client it failed (the
        // next device change announces the devices again).
        if let Err(err) = self.announce_devices(user_id).await {
            tracing::warn!("announcing {user_id}'s devices after a remote join: {err}");
        }
        Ok(())
    }

    /// Tells every server sharing a room with a user who just joined through another server
    /// (that server among them) about the user's devices. The resident learnt of the join at
    /// `send_join`, before the join was stored here, so a device-key upload committed in
    /// between found no room shared with it and told it nothing: without this, its users
    /// never see the new device's keys and cannot encrypt to it.
    async fn announce_devices(&self, user_id: &UserId) -> Result<()> {
        let mut conn = self.db.conn().await?;
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            let device_ids: Vec<String> = devices::get_devices(conn, user_id.as_str())
                .await?
                .into_iter()
                .map(|device| device.device_id)
                .collect();
            local_devices_changed(conn, &self.sender, user_id, &device_ids).await
        })
        .await
    }

    /// Our own member event with `membership` from a `make_join`, `make_knock` or
    /// `make_leave` template: checked to be what we asked for, filled in (`extra` added to its
    /// content), hashed and signed.
    pub(super) fn sign_member(
        &self,
        template: &RawJsonValue,
        rules: &RoomVersionRules,
        user_id: &UserId,
        room_id: &RoomId,
        membership: &str,
        extra: serde_json::Map<String, Value>,
    ) -> Result<(OwnedEventId, CanonicalJsonObject)> {
        let bad =
            |what: &str| bad_gateway(format!("The make_{membership} template is wrong: {what}"));
        let mut event: CanonicalJsonObject =
            serde_json::from_str(template.get()).map_err(|_| bad("not a JSON object"))?;
        let string = |event: &CanonicalJsonObject, key: &str| match event.get(key) {
            Some(CanonicalJsonValue::String(value)) => Some(value.clone()),
            _ => None,
        };
        if string(&event, "type").as_deref() != Some("m.room.member")
            || string(&event, "sender").as_deref() != Some(user_id.as_str())
            || string(&event, "state_key").as_deref() != Some(user_id.as_str())
            || string(&event, "room_id").as_deref() != Some(room_id.as_str())
        {
            return Err(bad("not our own member event in this room"));
        }
        let mut content = match event.remove("content") {
            Some(CanonicalJsonValue::Object(content)) => content,
            _ => CanonicalJsonObject::new(),
        };
        if !matches!(content.get("membership"), Some(CanonicalJsonValue::String(m)) if m == membership)
        {
            return Err(bad("another membership"));
        }
        for (field, value) in extra {
            if let Ok(value) = CanonicalJsonValue::try_from(value) {
                content.insert(field, value);
            }
        }
        event.insert("content".into(), CanonicalJsonValue::Object(content));
        for key in ["signatures", "hashes", "unsigned", "event_id"] {
            event.remove(key);
        }
        event.insert(
            "origin".into(),
            CanonicalJsonValue::String(self.config.server_name.to_string()),
        );
        event.insert(
            "origin_server_ts".into(),
            CanonicalJsonValue::Integer(now_ms().try_into().map_err(Error::internal)?),
        );
        hash_and_sign_event(
            self.config.server_name.as_str(),
            &self.own_keys.key_pair,
            &mut event,
            &rules.redaction,
        )
        .map_err(Error::internal)?;
        let hash = reference_hash(&event, rules).map_err(Error::internal)?;
        let event_id = OwnedEventId::try_from(format!("${hash}")).map_err(Error::internal)?;
        Ok((event_id, event))
    }

    /// The events of a `send_join` answer, each through checks 1 to 4; an event failing them
    /// is left out (and so is anything whose auth depends on it). The answer's state must
    /// hold the room's create event.
    pub(super) async fn check_room_state(
        &self,
        rules: &RoomVersionRules,
        version: &RoomVersionId,
        room_id: &RoomId,
        state: &[Box<RawJsonValue>],
        auth_chain: &[Box<RawJsonValue>],
    ) -> Result<JoinedRoom> {
        let mut checked: HashMap<OwnedEventId, Checked> = HashMap::new();
        let mut state_ids = Vec::new();
        for (raw, in_state) in state
            .iter()
            .map(|raw| (raw, true))
            .chain(auth_chain.iter().map(|raw| (raw, false)))
        {
            let Ok(object) = serde_json::from_str::<CanonicalJsonObject>(raw.get()) else {
                continue;
            };
            let Ok(passed) = self.check_pdu(rules, object).await? else {
                continue;
            };
            let json = serde_json::to_value(&passed.pdu).map_err(Error::internal)?;
            let pdu = Pdu::from_json(passed.event_id.as_str(), &json)?;
            let in_room = pdu.is_in_room(room_id, rules);
            if !in_room {
                continue;
            }
            if in_state {
                state_ids.push(pdu.event_id.clone());
            }
            checked.insert(pdu.event_id.clone(), Checked { pdu, json });
        }
        // Check 4 for each, in depth order (an event's auth events are older), dropping what
        // fails and what depends on something dropped.
        let mut order: Vec<OwnedEventId> = checked.keys().cloned().collect();
        order.sort_by_key(|id| checked[id].pdu.depth);
        let create_id = checked
            .values()
            .find(|c| c.pdu.kind.to_string() == "m.room.create")
            .map(|c| c.pdu.event_id.clone())
            .ok_or_else(|| bad_gateway("The joined room's state has no create event"))?;
        let mut accepted: HashMap<OwnedEventId, Checked> = HashMap::new();
        for id in order {
            let Some(candidate) = checked.remove(&id) else {
                continue;
            };
            let fetch = |wanted: &EventId| {
                accepted
                    .get(wanted)
                    .map(|c| c.pdu.clone())
                    .or_else(|| (wanted == &*candidate.pdu.event_id).then(|| candidate.pdu.clone()))
            };
            if check_state_independent_auth_rules(&rules.authorization, &candidate.pdu, fetch)
                .is_err()
            {
                continue;
            }
            let own_auth: Vec<Pdu> = candidate
                .pdu
                .auth_events
                .iter()
                .chain(std::iter::once(&create_id))
                .filter_map(|a| accepted.get(a).map(|c| c.pdu.clone()))
                .collect();
            let allowed = check_state_dependent_auth_rules(
                &rules.authorization,
                &candidate.pdu,
                |kind: &StateEventType, key: &str| {
                    own_auth
                        .iter()
                        .find(|p| {
                            p.kind.to_string() == kind.to_string()
                                && p.state_key.as_deref() == Some(key)
                        })
                        .cloned()
                },
            );
            if allowed.is_ok() {
                accepted.insert(id, candidate);
            }
        }
        let create = accepted
            .get(&create_id)
            .ok_or_else(|| bad_gateway("The joined room's create event is not valid"))?;
        let creator = create.pdu.sender.to_string();
        let mut state = Vec::new();
        for id in state_ids {
            if let Some(c) = accepted.get(&id) {
                if let Some(key) = &c.pdu.state_key {
                    state.push(StateEvent {
                        kind: c.pdu.kind.to_string(),
                        state_key: key.clone(),
                        event_id: id.to_string(),
                    });
                }
            }
        }
        Ok(JoinedRoom {
            room_id: room_id.to_owned(),
            version: version.clone(),
            creator,
            events: accepted
                .into_values()
                .map(|c| (c.pdu.event_id.to_string(), c.json))
                .collect(),
            state,
        })
    }

    /// Our join (as the resident may have countersigned it), checked against the state it
    /// joins.
    async fn check_join(
        &self,
        rules: &RoomVersionRules,
        event_id: &EventId,
        join: CanonicalJsonObject,
        room: &JoinedRoom,
    ) -> Result<(Pdu, Value)> {
        let passed = self
            .check_pdu(rules, join)
            .await?
            .map_err(|dropped| bad_gateway(format!("Our join came back broken: {dropped}")))?;
        if passed.event_id.as_str() != event_id.as_str() {
            return Err(bad_gateway("The resident answered another join event"));
        }
        let json = serde_json::to_value(&passed.pdu).map_err(Error::internal)?;
        let pdu = Pdu::from_json(event_id.as_str(), &json)?;
        let events: HashMap<&str, Pdu> = room
            .events
            .iter()
            .filter_map(|(id, json)| Some((id.as_str(), Pdu::from_json(id, json).ok()?)))
            .collect();
        let state: HashMap<(String, String), &Pdu> = room
            .state
            .iter()
            .filter_map(|s| {
                Some((
                    (s.kind.clone(), s.state_key.clone()),
                    events.get(s.event_id.as_str())?,
                ))
            })
            .collect();
        check_state_dependent_auth_rules(
            &rules.authorization,
            &pdu,
            |kind: &StateEventType, key: &str| {
                state
                    .get(&(kind.to_string(), key.to_owned()))
                    .map(|p| (*p).clone())
            },
        )
        .map_err(|reason| {
            Error::forbidden(format!(
                "The room's state does not allow the join: {reason}"
            ))
        })?;
        Ok((pdu, json))
    }
}

/// What our member event adds to a template's content: the user's profile (a join or knock
/// shows their name and avatar, as a local one does) and the client's reason.
pub(super) fn member_content(
    mut fields: serde_json::Map<String, Value>,
    reason: Option<&str>,
) -> serde_json::Map<String, Value> {
    if let Some(reason) = reason {
        fields.insert("reason".into(), Value::from(reason));
    }
    fields
}

/// The room version a resident's template names, with its rules: one we support, or 400
/// `M_INCOMPATIBLE_ROOM_VERSION`.
pub(super) fn supported(
    version: Option<RoomVersionId>,
) -> Result<(RoomVersionId, RoomVersionRules)> {
    let version = version
        .filter(|v| SUPPORTED_VERSIONS.contains(v))
        .ok_or_else(|| {
            Error::matrix(
                actix_web::http::StatusCode::BAD_REQUEST,
                "M_INCOMPATIBLE_ROOM_VERSION",
                "The room's version is not supported here",
            )
        })?;
    let rules = version
        .rules()
        .ok_or_else(|| Error::internal("room version without rules"))?;
    Ok((version, rules))
}

/// 502: the other server's answer is unusable.
pub(super) fn bad_gateway(message: impl Into<String>) -> Error {
    Error::matrix(
        actix_web::http::StatusCode::BAD_GATEWAY,
        "M_UNKNOWN",
        message,
    )
}
