//! `createRoom`: the initial events of a room, written in one transaction.

use rand::{distr::Alphanumeric, Rng};
use ruma::{
    OwnedRoomAliasId, OwnedRoomId, OwnedUserId, RoomAliasId, RoomId, RoomVersionId, UserId,
};
use serde_json::{json, Map, Value};

use super::{
    deferred::DeferredPositions,
    writer::{NewEvent, RoomWriter},
    Rooms, DEFAULT_VERSION,
};
use crate::{
    error::{Error, Result},
    storage::{is_unique_violation, now_ms, rooms as store, users},
};

/// Room presets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// Invite-only, history shared, guests may join.
    PrivateChat,
    /// As private, and invitees get the creator's power.
    TrustedPrivateChat,
    /// Anyone may join.
    PublicChat,
}

/// What a client asks `createRoom` for.
#[derive(Debug, Default)]
pub struct CreateRoom {
    /// Preset; defaults from `public`.
    pub preset: Option<Preset>,
    /// Published in the room directory.
    pub public: bool,
    /// Local part of the alias to create (`#name:server`).
    pub alias_name: Option<String>,
    /// `m.room.name`.
    pub name: Option<String>,
    /// `m.room.topic`.
    pub topic: Option<String>,
    /// Users to invite.
    pub invite: Vec<OwnedUserId>,
    /// Mark invites as direct chats.
    pub is_direct: bool,
    /// Room version.
    pub room_version: Option<RoomVersionId>,
    /// Extra `m.room.create` content.
    pub creation_content: Option<Map<String, Value>>,
    /// Extra state events `(type, state_key, content)`.
    pub initial_state: Vec<(String, String, Value)>,
    /// Overrides for the power levels content.
    pub power_level_content_override: Option<Map<String, Value>>,
}

impl Rooms {
    /// Creates a room; nothing is written unless every event is accepted.
    pub async fn create_room(&self, creator: &UserId, request: CreateRoom) -> Result<OwnedRoomId> {
        let version = request.room_version.clone().unwrap_or(DEFAULT_VERSION);
        let rules = super::versions::version_rules(&version)?;
        let preset = request.preset.unwrap_or(if request.public {
            Preset::PublicChat
        } else {
            Preset::PrivateChat
        });
        let alias = match &request.alias_name {
            Some(name) => Some(self.new_alias(name)?),
            None => None,
        };
        // Invitations go through `invite`, where invitees are checked (local, shadow ban).
        if request
            .initial_state
            .iter()
            .any(|(kind, ..)| kind == "m.room.member")
        {
            return Err(Error::invalid_param(
                "initial_state cannot hold m.room.member events: use invite",
            ));
        }
        let mut conn = self.db.conn().await?;
        if users::is_shadow_banned(&conn, creator.as_str()).await? && !request.invite.is_empty() {
            return Err(Error::forbidden("Cannot invite users"));
        }
        for invitee in request
            .invite
            .iter()
            .filter(|u| !self.invited_over_federation(u))
        {
            self.ensure_local_user(&conn, invitee).await?;
        }
        let profile = self.member_profile(&conn, creator).await?;

        // A v12 room ID is its create event's hash: a concurrent identical create in another
        // process takes it first, and a retry's create event gets a later timestamp.
        let mut attempts = 0;
        loop {
            attempts += 1;
            let result = self
                .create_room_once(
                    &mut conn, creator, &request, &version, &rules, preset, &alias, &profile,
                )
                .await;
            match result {
                Err(err) if attempts < 3 && super::writer::is_room_id_taken(&err) => continue,
                result => return result,
            }
        }
    }

    /// One attempt at writing a new room's events.
    #[allow(clippy::too_many_arguments)]
    async fn create_room_once(
        &self,
        conn: &mut diesel_async::AsyncPgConnection,
        creator: &UserId,
        request: &CreateRoom,
        version: &RoomVersionId,
        rules: &ruma::room_version_rules::RoomVersionRules,
        preset: Preset,
        alias: &Option<OwnedRoomAliasId>,
        profile: &Map<String, Value>,
    ) -> Result<OwnedRoomId> {
        let server_name = &*self.config.server_name;
        let privileged_creators = rules.authorization.explicitly_privilege_room_creators;
        let (room_id, persisted) = crate::storage::transaction::transaction(conn, async |conn| {
            let room_id = (!rules.authorization.room_create_event_id_as_room_id).then(|| self.random_room_id());
            // Every event at a provisional position, made real in one step before commit.
            let deferred = DeferredPositions::default();
            let mut writer = RoomWriter::create(conn, &self.keys, server_name, room_id, version.clone())?
                .with_deferred_positions(&deferred);
            let send = |kind: &'static str, state_key: &str, content: Value| (kind.to_owned(), state_key.to_owned(), content);

            let mut create = request.creation_content.clone().unwrap_or_default();
            create.insert("room_version".into(), json!(version.as_str()));
            if !rules.authorization.use_room_create_sender {
                create.insert("creator".into(), json!(creator));
            }
            if privileged_creators && preset == Preset::TrustedPrivateChat && !request.invite.is_empty() {
                create.insert("additional_creators".into(), json!(request.invite));
            }
            let mut events = vec![send("m.room.create", "", Value::Object(create))];
            events.push(send("m.room.member", creator.as_str(), membership_content("join", profile, None)));

            let mut users = Map::new();
            if !privileged_creators {
                users.insert(creator.to_string(), json!(100));
                if preset == Preset::TrustedPrivateChat {
                    for invitee in &request.invite {
                        users.insert(invitee.to_string(), json!(100));
                    }
                }
            }
            let mut power_levels = json!({
                "users": users,
                "users_default": 0,
                "events": {
                    "m.room.name": 50, "m.room.power_levels": 100, "m.room.history_visibility": 100,
                    "m.room.canonical_alias": 50, "m.room.avatar": 50, "m.room.tombstone": 100,
                    "m.room.server_acl": 100, "m.room.encryption": 100,
                },
                "events_default": 0, "state_default": 50, "ban": 50, "kick": 50, "redact": 50,
                "invite": if preset == Preset::PublicChat { 50 } else { 0 },
            });
            for (key, value) in request.power_level_content_override.clone().unwrap_or_default() {
                power_levels[key] = value;
            }
            events.push(send("m.room.power_levels", "", power_levels));
            if let Some(alias) = alias {
                events.push(send("m.room.canonical_alias", "", json!({ "alias": alias })));
            }
            let join_rule = if preset == Preset::PublicChat { "public" } else { "invite" };
            events.push(send("m.room.join_rules", "", json!({ "join_rule": join_rule })));
            events.push(send("m.room.history_visibility", "", json!({ "history_visibility": "shared" })));
            if preset != Preset::PublicChat {
                events.push(send("m.room.guest_access", "", json!({ "guest_access": "can_join" })));
            }
            // initial_state replaces preset events of the same type and key.
            for (kind, state_key, content) in &request.initial_state {
                events.retain(|(k, s, _)| !(k == kind && s == state_key) || k == "m.room.create" || k == "m.room.member");
                events.push((kind.clone(), state_key.clone(), content.clone()));
            }
            if let Some(name) = &request.name {
                events.push(send("m.room.name", "", json!({ "name": name })));
            }
            if let Some(topic) = &request.topic {
                let content = json!({ "topic": topic, "m.topic": { "m.text": [{ "body": topic, "mimetype": "text/plain" }] } });
                events.push(send("m.room.topic", "", content));
            }

            for (kind, state_key, content) in events {
                writer.append(NewEvent { sender: creator, kind: &kind, state_key: Some(&state_key), content, txn: None, ts: None }).await?;
            }
            let room_id = writer.room_id()?.to_owned();
            if let Some(alias) = alias {
                store::insert_alias(writer.conn(), alias.as_str(), room_id.as_str(), creator.as_str(), now_ms())
                    .await
                    .map_err(|e| if is_unique_violation(&e) { room_in_use() } else { e.into() })?;
            }
            for invitee in request.invite.iter().filter(|u| !self.invited_over_federation(u)) {
                let mut content = json!({ "membership": "invite" });
                if request.is_direct {
                    content["is_direct"] = json!(true);
                }
                writer
                    .append(NewEvent { sender: creator, kind: "m.room.member", state_key: Some(invitee.as_str()), content, txn: None, ts: None })
                    .await?;
            }
            if request.public {
                store::set_room_public(writer.conn(), room_id.as_str(), true).await?;
            }
            let persisted = deferred.finish(writer.conn(), &[&room_id]).await?;
            Ok((room_id, persisted))
        })
        .await?;
        crate::metrics::metrics()
            .events_persisted(super::send::Origin::Client.metric_label(), persisted);
        Ok(room_id)
    }

    /// Whether an invitee of a new room is invited once the room exists, through their own
    /// server (which signs the invite), rather than by an invite event written with the room.
    pub fn invited_over_federation(&self, invitee: &UserId) -> bool {
        invitee.server_name() != self.config.server_name && self.config.federation.enabled
    }

    /// A fresh room ID for room versions before 12.
    pub(super) fn random_room_id(&self) -> OwnedRoomId {
        let local: String = rand::rng()
            .sample_iter(&Alphanumeric)
            .take(18)
            .map(char::from)
            .collect();
        RoomId::parse(format!("!{local}:{}", self.config.server_name)).expect("valid room ID")
    }

    /// Parses `#name:ourserver` for a new alias.
    pub(super) fn new_alias(&self, name: &str) -> Result<OwnedRoomAliasId> {
        if name.contains(':') || name.contains('#') || name.chars().any(char::is_whitespace) {
            return Err(Error::invalid_param("Invalid characters in room alias"));
        }
        RoomAliasId::parse(format!("#{name}:{}", self.config.server_name))
            .map_err(|_| Error::invalid_param("Invalid room alias"))
    }
}

fn room_in_use() -> Error {
    Error::matrix(
        actix_web::http::StatusCode::BAD_REQUEST,
        "M_ROOM_IN_USE",
        "Room alias already taken",
    )
}

/// A member event's content with the user's display name and avatar.
pub(super) fn membership_content(
    membership: &str,
    profile: &Map<String, Value>,
    reason: Option<&str>,
) -> Value {
    let mut content = Map::new();
    content.insert("membership".into(), json!(membership));
    for key in ["displayname", "avatar_url"] {
        if let Some(value) = profile.get(key) {
            content.insert(key.into(), value.clone());
        }
    }
    if let Some(reason) = reason {
        content.insert("reason".into(), json!(reason));
    }
    Value::Object(content)
}
