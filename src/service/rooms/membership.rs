//! Membership changes: invite, join, knock, leave, kick, ban, unban, forget.

use diesel_async::AsyncPgConnection;
use ruma::{OwnedEventId, OwnedRoomId, RoomAliasId, RoomId, RoomOrAliasId, UserId};
use serde_json::{json, Map, Value};

use super::{
    create::membership_content,
    send::{Origin, Sender},
    Rooms,
};
use crate::{
    error::{Error, Result},
    storage::{admin_rooms, memberships as membership_store, rooms as store, users},
};

/// A membership change one user makes for another (or themselves).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Invite a user.
    Invite,
    /// Remove a user (leave on their behalf).
    Kick,
    /// Ban a user.
    Ban,
    /// Lift a ban (back to leave).
    Unban,
}

impl Rooms {
    /// Fails with `M_NOT_FOUND` unless the user is a local account.
    pub(super) async fn ensure_local_user(
        &self,
        conn: &AsyncPgConnection,
        user_id: &UserId,
    ) -> Result<()> {
        if user_id.server_name() != self.config.server_name {
            return Err(Error::forbidden(
                "Federation is not supported yet: only local users can be invited",
            ));
        }
        if users::get_user(conn, user_id.as_str()).await?.is_none() {
            return Err(Error::not_found(format!("User {user_id} does not exist")));
        }
        Ok(())
    }

    /// The display name and avatar that go into a user's member events.
    pub(super) async fn member_profile(
        &self,
        conn: &AsyncPgConnection,
        user_id: &UserId,
    ) -> Result<Map<String, Value>> {
        Ok(users::get_profile(conn, user_id.as_str())
            .await?
            .into_iter()
            .filter(|(field, _)| field == "displayname" || field == "avatar_url")
            .collect())
    }

    /// What a local user's join or knock through another server shows of them: their display
    /// name and avatar.
    pub async fn own_member_profile(&self, user_id: &UserId) -> Result<Map<String, Value>> {
        let conn = self.db.conn().await?;
        self.member_profile(&conn, user_id).await
    }

    /// Fails with `M_FORBIDDEN` when an admin has blocked the room: nobody here may join,
    /// knock on or be invited to it.
    pub async fn ensure_not_blocked(&self, room_id: &RoomId) -> Result<()> {
        let conn = self.db.conn().await?;
        match admin_rooms::get_block(&conn, room_id.as_str()).await? {
            Some(_) => Err(Error::forbidden(
                "This room has been blocked on this server",
            )),
            None => Ok(()),
        }
    }

    /// Resolves a room ID or a local alias to a room ID.
    pub async fn resolve_room(&self, room: &RoomOrAliasId) -> Result<OwnedRoomId> {
        match <&RoomId>::try_from(room) {
            Ok(room_id) => Ok(room_id.to_owned()),
            Err(alias) => {
                let alias: &RoomAliasId = alias;
                let conn = self.db.conn().await?;
                let (room_id, _) = store::get_alias(&conn, alias.as_str())
                    .await?
                    .ok_or_else(|| Error::not_found(format!("Room alias {alias} not found")))?;
                RoomId::parse(room_id).map_err(Error::internal)
            }
        }
    }

    /// Joins a room (by ID or alias). Joining a room one is already in changes nothing.
    pub async fn join(
        &self,
        user_id: &UserId,
        room: &RoomOrAliasId,
        reason: Option<&str>,
        origin: Origin,
    ) -> Result<OwnedRoomId> {
        let room_id = self.resolve_room(room).await?;
        let conn = self.db.conn().await?;
        self.ensure_local_room(&conn, &room_id).await?;
        if let Some((membership, _)) =
            membership_store::get_membership(&conn, room_id.as_str(), user_id.as_str()).await?
        {
            if membership == "join" {
                return Ok(room_id);
            }
        }
        let profile = self.member_profile(&conn, user_id).await?;
        let mut content = membership_content("join", &profile, reason);
        if let Some(authoriser) = self
            .restricted_join_authoriser(&conn, user_id, &room_id)
            .await?
        {
            content["join_authorised_via_users_server"] = json!(authoriser);
        }
        drop(conn);
        self.set_membership(user_id, &room_id, user_id, content, origin)
            .await?;
        Ok(room_id)
    }

    /// For `restricted` rooms: a local member who may invite, when the joiner is in an allowed room.
    pub(crate) async fn restricted_join_authoriser(
        &self,
        conn: &AsyncPgConnection,
        user_id: &UserId,
        room_id: &RoomId,
    ) -> Result<Option<String>> {
        let Some(rules_id) =
            store::get_current_state_id(conn, room_id.as_str(), "m.room.join_rules", "").await?
        else {
            return Ok(None);
        };
        let Some(rules) = store::get_state_event(conn, &rules_id).await? else {
            return Ok(None);
        };
        let content = rules.pdu.get("content").cloned().unwrap_or_default();
        let rule = content
            .get("join_rule")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if rule != "restricted" && rule != "knock_restricted" {
            return Ok(None);
        }
        if let Some((membership, _)) =
            membership_store::get_membership(conn, room_id.as_str(), user_id.as_str()).await?
        {
            if membership == "invite" || membership == "join" {
                return Ok(None);
            }
        }
        let allowed = content
            .get("allow")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mut in_allowed_room = false;
        for entry in allowed {
            if entry.get("type").and_then(Value::as_str) != Some("m.room_membership") {
                continue;
            }
            let Some(allowed_room) = entry.get("room_id").and_then(Value::as_str) else {
                continue;
            };
            if let Some((membership, _)) =
                membership_store::get_membership(conn, allowed_room, user_id.as_str()).await?
            {
                in_allowed_room |= membership == "join";
            }
        }
        if !in_allowed_room {
            return Err(Error::forbidden(
                "You are not invited to this room, and not in a room that allows joining it",
            ));
        }
        // Any joined local member whose power suffices to invite; the auth rules verify it.
        let levels = self.power_levels(conn, room_id).await?;
        let invite_level = levels.get("invite").and_then(Value::as_i64).unwrap_or(0);
        for member in membership_store::get_room_members(conn, room_id.as_str(), "join").await? {
            let Ok(member_id) = UserId::parse(&member) else {
                continue;
            };
            if member_id.server_name() == self.config.server_name
                && self.user_level(conn, room_id, &member_id, &levels).await? >= invite_level
            {
                return Ok(Some(member));
            }
        }
        Err(Error::forbidden(
            "No local member of the room can authorise the join",
        ))
    }

    /// `M_NOT_FOUND` unless this server knows the room (joining remote rooms needs federation).
    async fn ensure_local_room(&self, conn: &AsyncPgConnection, room_id: &RoomId) -> Result<()> {
        match store::get_room(conn, room_id.as_str()).await? {
            Some(_) => Ok(()),
            None => Err(Error::not_found(
                "No known servers for this room (federation is not supported yet)",
            )),
        }
    }

    /// `M_NOT_FOUND` unless the room exists here.
    pub(super) async fn ensure_room_exists(
        &self,
        conn: &AsyncPgConnection,
        room_id: &RoomId,
    ) -> Result<()> {
        match store::get_room(conn, room_id.as_str()).await? {
            Some(_) => Ok(()),
            None => Err(Error::not_found("Unknown room")),
        }
    }

    /// Whether the user's current membership is `join`.
    pub(super) async fn is_joined(
        &self,
        conn: &AsyncPgConnection,
        room_id: &RoomId,
        user_id: &UserId,
    ) -> Result<bool> {
        Ok(
            membership_store::get_membership(conn, room_id.as_str(), user_id.as_str())
                .await?
                .is_some_and(|(m, _)| m == "join"),
        )
    }

    /// Whether the user's power level suffices to send a state event of this type.
    pub(super) async fn can_send_state(
        &self,
        conn: &AsyncPgConnection,
        room_id: &RoomId,
        user_id: &UserId,
        event_type: &str,
    ) -> Result<bool> {
        let levels = self.power_levels(conn, room_id).await?;
        let needed = super::power::listed_level(&levels, "events", event_type, "state_default", 50);
        Ok(self.user_level(conn, room_id, user_id, &levels).await? >= needed)
    }

    /// The room's power-levels content (empty when unset).
    pub(super) async fn power_levels(
        &self,
        conn: &AsyncPgConnection,
        room_id: &RoomId,
    ) -> Result<Value> {
        let id =
            store::get_current_state_id(conn, room_id.as_str(), "m.room.power_levels", "").await?;
        Ok(match id {
            Some(id) => store::get_state_event(conn, &id)
                .await?
                .and_then(|e| e.pdu.get("content").cloned())
                .unwrap_or_default(),
            None => Value::Object(Map::new()),
        })
    }

    /// A user's power level; room creators are above everyone in room versions that privilege them.
    pub(super) async fn user_level(
        &self,
        conn: &AsyncPgConnection,
        room_id: &RoomId,
        user_id: &UserId,
        levels: &Value,
    ) -> Result<i64> {
        if let Some(room) = store::get_room(conn, room_id.as_str()).await? {
            let privileged = super::versions::rules_for(&room.room_version)?
                .authorization
                .explicitly_privilege_room_creators;
            if privileged && self.is_creator(conn, room_id, user_id).await? {
                return Ok(i64::MAX);
            }
        }
        Ok(super::power::listed_power_level(levels, user_id))
    }

    async fn is_creator(
        &self,
        conn: &AsyncPgConnection,
        room_id: &RoomId,
        user_id: &UserId,
    ) -> Result<bool> {
        let Some(id) =
            store::get_current_state_id(conn, room_id.as_str(), "m.room.create", "").await?
        else {
            return Ok(false);
        };
        let Some(create) = store::get_state_event(conn, &id).await? else {
            return Ok(false);
        };
        let content = create.pdu.get("content").cloned().unwrap_or_default();
        Ok(super::power::is_room_creator(
            &create.sender,
            &content,
            user_id,
        ))
    }

    /// Leaves a room (or rejects an invite, or withdraws a knock).
    pub async fn leave(
        &self,
        user_id: &UserId,
        room_id: &RoomId,
        reason: Option<&str>,
        origin: Origin,
    ) -> Result<()> {
        let conn = self.db.conn().await?;
        let current =
            membership_store::get_membership(&conn, room_id.as_str(), user_id.as_str()).await?;
        if !matches!(
            current.as_ref().map(|(m, _)| m.as_str()),
            Some("join" | "invite" | "knock")
        ) {
            return Err(Error::forbidden("You are not in this room"));
        }
        drop(conn);
        // An invite from another server, or a knock, on a room this server is not in is ended
        // on the invite or knock itself: there is no room here to write into.
        if let Some((membership, event_id)) = current.as_ref().map(|(m, id)| (m.as_str(), id)) {
            let out_of_band = match membership {
                "invite" => self
                    .inviter(room_id, user_id)
                    .await?
                    .is_some_and(|inviter| inviter.server_name() != self.config.server_name),
                "knock" => true,
                _ => false,
            };
            if out_of_band && !self.is_resident(room_id).await? {
                return self
                    .reject_remote_invite(user_id, room_id, event_id, reason)
                    .await;
            }
        }
        let content = membership_content("leave", &Map::new(), reason);
        self.set_membership(user_id, room_id, user_id, content, origin)
            .await
            .map(drop)
    }

    /// Knocks on a room (by ID or alias).
    pub async fn knock(
        &self,
        user_id: &UserId,
        room: &RoomOrAliasId,
        reason: Option<&str>,
    ) -> Result<OwnedRoomId> {
        let room_id = self.resolve_room(room).await?;
        let conn = self.db.conn().await?;
        self.ensure_local_room(&conn, &room_id).await?;
        let profile = self.member_profile(&conn, user_id).await?;
        drop(conn);
        self.set_membership(
            user_id,
            &room_id,
            user_id,
            membership_content("knock", &profile, reason),
            Origin::Client,
        )
        .await?;
        Ok(room_id)
    }

    /// Changes another user's membership; the auth rules decide whether the sender may.
    pub async fn change_membership(
        &self,
        sender: &UserId,
        room_id: &RoomId,
        target: &UserId,
        change: Change,
        reason: Option<&str>,
    ) -> Result<()> {
        let conn = self.db.conn().await?;
        if store::get_room(&conn, room_id.as_str()).await?.is_none() {
            return Err(Error::not_found("Unknown room"));
        }
        let membership = match change {
            Change::Invite => {
                self.ensure_local_user(&conn, target).await?;
                self.ensure_not_blocked(room_id).await?;
                if let Some((current, _)) =
                    membership_store::get_membership(&conn, room_id.as_str(), target.as_str())
                        .await?
                {
                    if current == "join" {
                        return Err(Error::forbidden(format!("{target} is already in the room")));
                    }
                }
                "invite"
            }
            Change::Kick => {
                let current =
                    membership_store::get_membership(&conn, room_id.as_str(), target.as_str())
                        .await?;
                if !matches!(
                    current.as_ref().map(|(m, _)| m.as_str()),
                    Some("join" | "invite" | "knock")
                ) {
                    return Err(Error::forbidden(format!("{target} is not in the room")));
                }
                "leave"
            }
            Change::Ban => "ban",
            Change::Unban => {
                let current =
                    membership_store::get_membership(&conn, room_id.as_str(), target.as_str())
                        .await?;
                if current.as_ref().map(|(m, _)| m.as_str()) != Some("ban") {
                    return Err(Error::forbidden(format!("{target} is not banned")));
                }
                "leave"
            }
        };
        let mut content = membership_content(membership, &Map::new(), reason);
        if change == Change::Invite {
            // The invitee's profile, so the invite shows a name before they join.
            let profile = self.member_profile(&conn, target).await?;
            content = membership_content("invite", &profile, reason);
        }
        drop(conn);
        self.set_membership(sender, room_id, target, content, Origin::Client)
            .await
            .map(drop)
    }

    /// A member event a client writes itself through `/state`: the same rules as the
    /// membership endpoints. The server, not the client, names who authorises a join to a
    /// restricted room, and only local users are invited.
    pub async fn put_member_state(
        &self,
        sender: &UserId,
        room_id: &RoomId,
        target: &UserId,
        mut content: Value,
    ) -> Result<OwnedEventId> {
        let fields = content
            .as_object_mut()
            .ok_or_else(|| Error::bad_json("Event content must be a JSON object"))?;
        fields.remove("join_authorised_via_users_server");
        let membership = fields
            .get("membership")
            .and_then(Value::as_str)
            .ok_or_else(|| Error::bad_json("membership is required"))?
            .to_owned();
        let conn = self.db.conn().await?;
        self.ensure_room_exists(&conn, room_id).await?;
        match membership.as_str() {
            "join" if target == sender => {
                if let Some(authoriser) = self
                    .restricted_join_authoriser(&conn, sender, room_id)
                    .await?
                {
                    content["join_authorised_via_users_server"] = json!(authoriser);
                }
            }
            "invite" => self.ensure_local_user(&conn, target).await?,
            _ => {}
        }
        drop(conn);
        self.set_membership(sender, room_id, target, content, Origin::Client)
            .await
    }

    async fn set_membership(
        &self,
        sender: &UserId,
        room_id: &RoomId,
        target: &UserId,
        content: Value,
        origin: Origin,
    ) -> Result<OwnedEventId> {
        let sender = Sender {
            user_id: sender,
            txn: None,
            ts: None,
            origin,
        };
        self.send_event(
            sender,
            room_id,
            "m.room.member",
            Some(target.as_str()),
            content,
        )
        .await
    }

    /// Forgets a room the user has left.
    pub async fn forget(&self, user_id: &UserId, room_id: &RoomId) -> Result<()> {
        let conn = self.db.conn().await?;
        match membership_store::get_membership(&conn, room_id.as_str(), user_id.as_str()).await? {
            None => Err(Error::not_found("You have never been in this room")),
            Some(_)
                if membership_store::forget_room(&conn, room_id.as_str(), user_id.as_str())
                    .await? =>
            {
                Ok(())
            }
            Some(_) => Err(Error::matrix(
                actix_web::http::StatusCode::BAD_REQUEST,
                "M_UNKNOWN",
                "Leave the room before forgetting it",
            )),
        }
    }
}

impl Rooms {
    /// Sends fresh member events with the user's current profile to every room they are in.
    pub async fn propagate_profile(&self, user_id: &UserId) -> Result<()> {
        let conn = self.db.conn().await?;
        let profile = self.member_profile(&conn, user_id).await?;
        let rooms = membership_store::get_rooms_for_user(&conn, user_id.as_str(), "join").await?;
        drop(conn);
        for room in rooms {
            let Ok(room_id) = RoomId::parse(&room) else {
                continue;
            };
            if let Err(err) = self
                .set_membership(
                    user_id,
                    &room_id,
                    user_id,
                    membership_content("join", &profile, None),
                    // Per room on the user's behalf: a profile change is one request.
                    Origin::Server,
                )
                .await
            {
                tracing::warn!(%room_id, "could not update the profile in a room: {err}");
            }
        }
        Ok(())
    }

    /// Leaves every room the user is joined to, invited to or knocking on, through the normal
    /// membership path (a deactivated account leaves its rooms, as in Synapse). A room that
    /// refuses the leave is logged and skipped, so one room cannot keep the user in the rest.
    pub async fn leave_all_rooms(&self, user_id: &UserId) -> Result<()> {
        let conn = self.db.conn().await?;
        let memberships = membership_store::get_user_memberships(&conn, user_id.as_str()).await?;
        drop(conn);
        for (room, membership, ..) in memberships {
            if !matches!(membership.as_str(), "join" | "invite" | "knock") {
                continue;
            }
            let Ok(room_id) = RoomId::parse(&room) else {
                continue;
            };
            if let Err(err) = self.leave(user_id, &room_id, None, Origin::Server).await {
                tracing::warn!(%room_id, "could not leave a room: {err}");
            }
        }
        Ok(())
    }

    /// The user directory: `(hits, limited)`.
    pub async fn search_users(
        &self,
        searcher: &UserId,
        term: &str,
        limit: usize,
    ) -> Result<(Vec<users::DirectoryUser>, bool)> {
        let conn = self.db.conn().await?;
        let mut hits =
            users::search_user_directory(&conn, searcher.as_str(), term, limit as i64 + 1).await?;
        let limited = hits.len() > limit;
        hits.truncate(limit);
        Ok((hits, limited))
    }
}
