//! Rooms through the admin API: the list, details, members, state, blocking and deletion.
//!
//! Deleting a room blocks it first (when asked), so nobody can join again while its local
//! members are made to leave; each leave (and each join of the room they are moved to) is an
//! ordinary member event through the rooms service, so the auth rules, sync and federation
//! see it like any other. None of them counts against the members' message rate limits.

use std::sync::Arc;

use ruma::{OwnedMxcUri, OwnedRoomId, OwnedRoomOrAliasId, OwnedUserId, RoomId, UserId};
use serde_json::{json, Value};

use super::{page_bounds, Admin};
use crate::{
    error::{Error, Result},
    service::{
        rooms::{
            create::{CreateRoom, Preset},
            send::{Origin, Sender},
            writer::lock_room,
            Rooms,
        },
        sessions::generate_token,
        Services,
    },
    storage::{
        admin_rooms::{self as store, AdminRoomRow, RoomDeletionRow, RoomQuery},
        memberships as membership_store, now_ms, rooms as rooms_store,
    },
};

/// One page of the room list.
pub struct RoomPage {
    /// The rooms, in the list's shape.
    pub rooms: Vec<Value>,
    /// How many rooms match.
    pub total: i64,
}

/// What a room deletion does besides making local members leave.
#[derive(Debug, Clone)]
pub struct DeleteRoom {
    /// Block the room so nobody here can join it again.
    pub block: bool,
    /// Then delete the room from the database (events, state, receipts, ...).
    pub purge: bool,
    /// A room to move the joined local members (and the local aliases) to.
    pub new_room: Option<NewRoom>,
}

/// The room a shut-down room's members are moved to (Synapse's `new_room_user_id`).
#[derive(Debug, Clone)]
pub struct NewRoom {
    /// Its creator and admin, a local user (who need not have an account).
    pub creator: OwnedUserId,
    /// Its name.
    pub name: String,
    /// The message the creator sends there once the members arrived.
    pub message: String,
}

/// Synapse's name for the new room when none is given.
const DEFAULT_NEW_ROOM_NAME: &str = "Content Violation Notification";
/// Synapse's message in the new room when none is given.
const DEFAULT_NEW_ROOM_MESSAGE: &str =
    "Sharing illegal content on this server is not permitted and rooms in violation will be blocked.";

impl NewRoom {
    /// A new room made by `creator`, with Synapse's name and message unless given.
    pub fn new(creator: OwnedUserId, name: Option<String>, message: Option<String>) -> Self {
        NewRoom {
            creator,
            name: name.unwrap_or_else(|| DEFAULT_NEW_ROOM_NAME.to_owned()),
            message: message.unwrap_or_else(|| DEFAULT_NEW_ROOM_MESSAGE.to_owned()),
        }
    }
}

/// A room in the list's shape.
fn list_entry(row: &AdminRoomRow) -> Value {
    json!({
        "room_id": row.room_id,
        "name": row.name,
        "canonical_alias": row.canonical_alias,
        "joined_members": row.joined_members,
        "joined_local_members": row.joined_local_members,
        "version": row.version,
        "creator": row.creator,
        "encryption": row.encryption,
        "federatable": row.federatable,
        "public": row.public,
        "join_rules": row.join_rules,
        "guest_access": row.guest_access,
        "history_visibility": row.history_visibility,
        "state_events": row.state_events,
        "room_type": row.room_type,
    })
}

/// A deletion as the status endpoints show it.
fn deletion_entry(row: &RoomDeletionRow) -> Value {
    let mut entry = json!({
        "delete_id": row.delete_id,
        "room_id": row.room_id,
        "status": row.status,
        "shutdown_room": row.result.clone().unwrap_or_else(|| json!({
            "kicked_users": [],
            "failed_to_kick_users": [],
            "local_aliases": [],
            "new_room_id": null,
        })),
    });
    if let Some(error) = &row.error {
        entry["error"] = json!(error);
    }
    entry
}

impl Admin {
    /// A page of the room list.
    pub async fn list_rooms(&self, query: &RoomQuery, from: i64, limit: i64) -> Result<RoomPage> {
        let (from, limit) = page_bounds(from, limit);
        let conn = self.db.conn().await?;
        let (rows, total) = store::list_rooms(&conn, query, from, limit).await?;
        Ok(RoomPage {
            rooms: rows.iter().map(list_entry).collect(),
            total,
        })
    }

    /// One room's details; 404 `M_NOT_FOUND` for unknown rooms.
    pub async fn get_room(&self, room_id: &RoomId) -> Result<Value> {
        let conn = self.db.conn().await?;
        let row = store::get_room(&conn, room_id.as_str())
            .await?
            .ok_or_else(|| Error::not_found("Room not found"))?;
        let mut entry = list_entry(&row);
        entry["topic"] = json!(row.topic);
        entry["avatar"] = json!(row.avatar);
        entry["joined_local_devices"] =
            json!(store::count_joined_local_devices(&conn, room_id.as_str()).await?);
        entry["forgotten"] = json!(false);
        entry["tombstoned"] = json!(row.replacement_room.is_some());
        entry["replacement_room"] = json!(row.replacement_room);
        Ok(entry)
    }

    /// The joined members of a room, `{members, total}`.
    pub async fn room_members(&self, room_id: &RoomId) -> Result<Value> {
        let conn = self.db.conn().await?;
        if rooms_store::get_room(&conn, room_id.as_str())
            .await?
            .is_none()
        {
            return Err(Error::not_found("Room not found"));
        }
        let members = membership_store::get_room_members(&conn, room_id.as_str(), "join").await?;
        Ok(json!({ "total": members.len(), "members": members }))
    }

    /// The media the room's events point at, `{local, remote}` (as `mxc://` URIs).
    pub async fn room_media(&self, room_id: &RoomId) -> Result<Value> {
        let conn = self.db.conn().await?;
        if rooms_store::get_room(&conn, room_id.as_str())
            .await?
            .is_none()
        {
            return Err(Error::not_found("Room not found"));
        }
        let (mut local, mut remote) = (Vec::new(), Vec::new());
        for uri in store::get_media_uris(&conn, room_id.as_str()).await? {
            let uri = OwnedMxcUri::from(uri);
            match uri.server_name() {
                Ok(server) if server == self.config.server_name => local.push(uri),
                Ok(_) => remote.push(uri),
                // Not a valid mxc URI: nothing any server could serve.
                Err(_) => {}
            }
        }
        Ok(json!({ "local": local, "remote": remote }))
    }

    /// Whether a room is blocked, `{block, user_id?}`.
    pub async fn room_block(&self, room_id: &RoomId) -> Result<Value> {
        let conn = self.db.conn().await?;
        Ok(match store::get_block(&conn, room_id.as_str()).await? {
            Some(by) => json!({ "block": true, "user_id": by }),
            None => json!({ "block": false }),
        })
    }

    /// Blocks or unblocks a room (it need not be known here).
    pub async fn set_room_block(
        &self,
        room_id: &RoomId,
        admin: &UserId,
        block: bool,
    ) -> Result<()> {
        let conn = self.db.conn().await?;
        let by = block.then_some(admin.as_str());
        Ok(store::set_block(&conn, room_id.as_str(), by, now_ms()).await?)
    }

    /// Shuts a room down: blocks it when asked, makes every local member leave (rejecting
    /// invites and withdrawing knocks too), deletes its local aliases, takes it out of the
    /// directory and, with `purge`, deletes it. With a new room, its creator makes it first,
    /// the joined members join it as they leave, its creator then posts the message there and
    /// the local aliases point at it instead. Returns Synapse's `shutdown_room` result.
    pub async fn shutdown_room(
        &self,
        rooms: &Rooms,
        room_id: &RoomId,
        admin: &UserId,
        options: &DeleteRoom,
    ) -> Result<Value> {
        let conn = self.db.conn().await?;
        if options.block {
            store::set_block(&conn, room_id.as_str(), Some(admin.as_str()), now_ms()).await?;
        }
        if rooms_store::get_room(&conn, room_id.as_str())
            .await?
            .is_none()
        {
            if options.block {
                return Ok(json!({
                    "kicked_users": [], "failed_to_kick_users": [],
                    "local_aliases": [], "new_room_id": null,
                }));
            }
            return Err(Error::not_found("Room not found"));
        }
        let members =
            store::get_memberships_in(&conn, room_id.as_str(), &["join", "invite", "knock"])
                .await?;
        drop(conn);
        let new_room_id = match &options.new_room {
            Some(new_room) => Some(self.create_replacement_room(rooms, new_room).await?),
            None => None,
        };
        let (mut kicked, mut failed) = (Vec::new(), Vec::new());
        for (member, membership) in members {
            let Ok(user_id) = UserId::parse(&member) else {
                continue;
            };
            if user_id.server_name() != self.config.server_name {
                continue;
            }
            let moved = async {
                rooms.leave(&user_id, room_id, None, Origin::Server).await?;
                if let (Some(new_room_id), "join") = (&new_room_id, membership.as_str()) {
                    let room = OwnedRoomOrAliasId::from(new_room_id.clone());
                    rooms.join(&user_id, &room, None, Origin::Server).await?;
                }
                Ok::<_, Error>(())
            };
            match moved.await {
                Ok(()) => kicked.push(member),
                Err(err) => {
                    tracing::warn!(%room_id, %user_id, "could not remove a member: {err}");
                    failed.push(member);
                }
            }
        }
        let mut conn = self.db.conn().await?;
        let aliases = match (&options.new_room, &new_room_id) {
            (Some(new_room), Some(new_room_id)) => {
                let sender = Sender {
                    user_id: &new_room.creator,
                    txn: None,
                    ts: None,
                    origin: Origin::Server,
                };
                let content = json!({ "msgtype": "m.text", "body": new_room.message });
                rooms
                    .send_event(sender, new_room_id, "m.room.message", None, content)
                    .await?;
                store::move_aliases_and_unpublish(&conn, room_id.as_str(), new_room_id.as_str())
                    .await?
            }
            _ => store::delete_aliases_and_unpublish(&conn, room_id.as_str()).await?,
        };
        if options.purge {
            crate::storage::transaction::transaction(&mut conn, async |conn| {
                // Under the room's lock, so no write of the room is half-way through.
                lock_room(conn, room_id).await?;
                Ok(store::purge_room(conn, room_id.as_str()).await?)
            })
            .await?;
        }
        Ok(json!({
            "kicked_users": kicked,
            "failed_to_kick_users": failed,
            "local_aliases": aliases,
            "new_room_id": new_room_id,
        }))
    }

    /// The room a shutdown moves members to: public, named, where members who join cannot
    /// speak (`users_default` -10), as Synapse makes it.
    async fn create_replacement_room(
        &self,
        rooms: &Rooms,
        new_room: &NewRoom,
    ) -> Result<OwnedRoomId> {
        let mut power_levels = serde_json::Map::new();
        power_levels.insert("users_default".into(), json!(-10));
        let request = CreateRoom {
            preset: Some(Preset::PublicChat),
            name: Some(new_room.name.clone()),
            power_level_content_override: Some(power_levels),
            ..CreateRoom::default()
        };
        rooms.create_room(&new_room.creator, request).await
    }

    /// Starts a room deletion in the background and returns its ID for the status endpoint.
    pub async fn start_room_deletion(
        services: Arc<Services>,
        room_id: &RoomId,
        admin: &UserId,
        options: DeleteRoom,
    ) -> Result<String> {
        let delete_id = generate_token("del");
        {
            let conn = services.db.conn().await?;
            store::insert_room_deletion(&conn, &delete_id, room_id.as_str(), now_ms()).await?;
        }
        let (id, room_id, admin) = (delete_id.clone(), room_id.to_owned(), admin.to_owned());
        tokio::spawn(async move {
            let admin_service = &services.admin;
            let record = async |status: &str, error: Option<&str>, result: Option<&Value>| {
                let conn = services.db.conn().await?;
                store::update_room_deletion(&conn, &id, status, error, result).await?;
                Ok::<_, Error>(())
            };
            let outcome = async {
                record("active", None, None).await?;
                admin_service
                    .shutdown_room(&services.rooms, &room_id, &admin, &options)
                    .await
            }
            .await;
            let recorded = match outcome {
                Ok(result) => record("complete", None, Some(&result)).await,
                Err(err) => record("failed", Some(&err.to_string()), None).await,
            };
            if let Err(err) = recorded {
                tracing::warn!(%room_id, "could not record a room deletion's outcome: {err}");
            }
        });
        Ok(delete_id)
    }

    /// One room deletion's status; 404 for unknown IDs.
    pub async fn room_deletion(&self, delete_id: &str) -> Result<Value> {
        let conn = self.db.conn().await?;
        let row = store::get_room_deletion(&conn, delete_id)
            .await?
            .ok_or_else(|| Error::not_found("delete id not found"))?;
        Ok(deletion_entry(&row))
    }

    /// The deletions of a room, `{results}`; 404 when there are none.
    pub async fn room_deletions(&self, room_id: &RoomId) -> Result<Value> {
        let conn = self.db.conn().await?;
        let rows = store::get_room_deletions(&conn, room_id.as_str()).await?;
        if rows.is_empty() {
            return Err(Error::not_found("No delete task for room_id found"));
        }
        let results: Vec<Value> = rows.iter().map(deletion_entry).collect();
        Ok(json!({ "results": results }))
    }
}
