//! Room aliases and the public room directory.

use std::collections::BTreeSet;

use ruma::{OwnedRoomId, OwnedServerName, RoomAliasId, RoomId, UserId};
use serde_json::{json, Value};

use super::Rooms;
use crate::{
    error::{Error, Result},
    service::sessions::Caller,
    storage::{is_unique_violation, memberships as membership_store, now_ms, rooms as store},
};

impl Rooms {
    /// Creates an alias on this server for a room the caller is in.
    pub async fn create_alias(
        &self,
        user_id: &UserId,
        alias: &RoomAliasId,
        room_id: &RoomId,
    ) -> Result<()> {
        if alias.server_name() != self.config.server_name {
            return Err(Error::invalid_param(
                "Can only create aliases on this server",
            ));
        }
        let conn = self.db.conn().await?;
        self.ensure_room_exists(&conn, room_id).await?;
        if !self.is_joined(&conn, room_id, user_id).await? {
            return Err(Error::forbidden(
                "You must be in the room to give it an alias",
            ));
        }
        store::insert_alias(
            &conn,
            alias.as_str(),
            room_id.as_str(),
            user_id.as_str(),
            now_ms(),
        )
        .await
        .map_err(|e| {
            if is_unique_violation(&e) {
                Error::matrix(
                    actix_web::http::StatusCode::CONFLICT,
                    "M_UNKNOWN",
                    "Room alias already exists",
                )
            } else {
                e.into()
            }
        })
    }

    /// Resolves a local alias.
    pub async fn get_alias(&self, alias: &RoomAliasId) -> Result<OwnedRoomId> {
        let conn = self.db.conn().await?;
        let (room_id, _) = store::get_alias(&conn, alias.as_str())
            .await?
            .ok_or_else(|| Error::not_found("Room alias not found"))?;
        RoomId::parse(room_id).map_err(Error::internal)
    }

    /// Resolves a local alias to its room and the servers to join it through: this server
    /// first, then every other server with a joined member.
    pub async fn resolve_local_alias(
        &self,
        alias: &RoomAliasId,
    ) -> Result<(OwnedRoomId, Vec<OwnedServerName>)> {
        if alias.server_name() != self.config.server_name {
            return Err(Error::not_found("Room alias not found"));
        }
        let room_id = self.get_alias(alias).await?;
        let conn = self.db.conn().await?;
        let members = membership_store::get_room_members(&conn, room_id.as_str(), "join").await?;
        let ours = &self.config.server_name;
        let mut servers = vec![ours.clone()];
        let others: BTreeSet<OwnedServerName> = members
            .iter()
            .filter_map(|m| UserId::parse(m.as_str()).ok())
            .map(|u| u.server_name().to_owned())
            .filter(|s| s != ours)
            .collect();
        servers.extend(others);
        Ok((room_id, servers))
    }

    /// Deletes an alias: its creator, a server admin, or a current member of the room allowed
    /// to change the canonical alias (as Synapse: power left behind after a ban or a leave
    /// does not count).
    pub async fn delete_alias(&self, caller: &Caller, alias: &RoomAliasId) -> Result<()> {
        let conn = self.db.conn().await?;
        let (room_id, creator) = store::get_alias(&conn, alias.as_str())
            .await?
            .ok_or_else(|| Error::not_found("Room alias not found"))?;
        let room_id = RoomId::parse(room_id).map_err(Error::internal)?;
        let allowed = caller.is_admin
            || creator == caller.user_id.as_str()
            || (self.is_joined(&conn, &room_id, &caller.user_id).await?
                && self
                    .can_send_state(&conn, &room_id, &caller.user_id, "m.room.canonical_alias")
                    .await?);
        if !allowed {
            return Err(Error::forbidden("You may not delete this alias"));
        }
        store::delete_alias(&conn, alias.as_str()).await?;
        Ok(())
    }

    /// Local aliases of a room the caller is in (or that is world-readable).
    pub async fn room_aliases(&self, user_id: &UserId, room_id: &RoomId) -> Result<Vec<String>> {
        // Reading the room's state applies the same membership rule as `/state`.
        self.room_state(user_id, room_id).await?;
        let conn = self.db.conn().await?;
        Ok(store::get_room_aliases(&conn, room_id.as_str()).await?)
    }

    /// Whether a room is published in the directory.
    pub async fn directory_visibility(&self, room_id: &RoomId) -> Result<bool> {
        let conn = self.db.conn().await?;
        Ok(store::get_room(&conn, room_id.as_str())
            .await?
            .ok_or_else(|| Error::not_found("Unknown room"))?
            .is_public)
    }

    /// Publishes or hides a room; needs the power to change the canonical alias (or server admin).
    pub async fn set_directory_visibility(
        &self,
        caller: &Caller,
        room_id: &RoomId,
        public: bool,
    ) -> Result<()> {
        let conn = self.db.conn().await?;
        self.ensure_room_exists(&conn, room_id).await?;
        let allowed = caller.is_admin
            || (self.is_joined(&conn, room_id, &caller.user_id).await?
                && self
                    .can_send_state(&conn, room_id, &caller.user_id, "m.room.canonical_alias")
                    .await?);
        if !allowed {
            return Err(Error::forbidden(
                "You may not change this room's directory visibility",
            ));
        }
        store::set_room_public(&conn, room_id.as_str(), public).await?;
        Ok(())
    }

    /// One page of the public room directory: `(chunk, next_batch, prev_batch, total)`.
    pub async fn public_rooms(
        &self,
        search: Option<&str>,
        limit: Option<usize>,
        since: Option<&str>,
    ) -> Result<(Vec<Value>, Option<String>, Option<String>, usize)> {
        let offset: usize = match since {
            Some(token) => token
                .strip_prefix('o')
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| Error::invalid_param("Invalid since token"))?,
            None => 0,
        };
        let conn = self.db.conn().await?;
        let mut rooms = Vec::new();
        for room in store::get_public_rooms(&conn).await? {
            let content = |kind: &str, field: &str| room.state.get(kind)?.get(field).cloned();
            let name = content("m.room.name", "name");
            let topic = content("m.room.topic", "topic");
            let alias = content("m.room.canonical_alias", "alias");
            if let Some(term) = search.map(str::to_lowercase).filter(|t| !t.is_empty()) {
                let haystack = [&name, &topic, &alias]
                    .iter()
                    .filter_map(|v| v.as_ref().and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join(" ")
                    .to_lowercase();
                if !haystack.contains(&term) {
                    continue;
                }
            }
            let mut entry = json!({
                "room_id": room.room_id,
                "num_joined_members": room.joined,
                "world_readable": content("m.room.history_visibility", "history_visibility") == Some(json!("world_readable")),
                "guest_can_join": content("m.room.guest_access", "guest_access") == Some(json!("can_join")),
                "join_rule": content("m.room.join_rules", "join_rule").unwrap_or(json!("public")),
            });
            for (key, value) in [("name", name), ("topic", topic), ("canonical_alias", alias)] {
                if let Some(value) = value {
                    entry[key] = value;
                }
            }
            if let Some(avatar) = content("m.room.avatar", "url") {
                entry["avatar_url"] = avatar;
            }
            if let Some(kind) = content("m.room.create", "type") {
                entry["room_type"] = kind;
            }
            rooms.push(entry);
        }
        rooms.sort_by_key(|r| std::cmp::Reverse(r["num_joined_members"].as_u64().unwrap_or(0)));
        let total = rooms.len();
        let limit = limit.unwrap_or(total.max(1));
        let page: Vec<Value> = rooms.into_iter().skip(offset).take(limit).collect();
        let next = (offset + page.len() < total).then(|| format!("o{}", offset + page.len()));
        let prev = (offset > 0).then(|| format!("o{}", offset.saturating_sub(limit)));
        Ok((page, next, prev, total))
    }
}
