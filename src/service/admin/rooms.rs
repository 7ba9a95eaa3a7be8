//! Rooms through the admin API: the list, details, members, state, blocking and deletion.
//!
//! Deleting a room blocks it first (when asked), so nobody can join again while its local
//! members are made to leave; each leave is an ordinary member event through the rooms
//! service, so the auth rules, sync and federation see it like any other.

use std::sync::Arc;

use diesel_async::AsyncConnection;
use ruma::{OwnedMxcUri, RoomId, UserId};
use serde_json::{json, Value};

use super::{page_bounds, Admin};
use crate::{
    error::{Error, Result},
    service::{
        rooms::{writer::lock_room, Rooms},
        sessions::generate_token,
        Services,
    },
    storage::{
        admin_rooms::{self as store, AdminRoomRow, RoomDeletionRow, RoomQuery},
        now_ms, rooms as rooms_store,
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
#[derive(Debug, Clone, Copy)]
pub struct DeleteRoom {
    /// Block the room so nobody here can join it again.
    pub block: bool,
    /// Then delete the room from the database (events, state, receipts, ...).
    pub purge: bool,
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
        let members = rooms_store::get_room_members(&conn, room_id.as_str(), "join").await?;
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
    /// directory and, with `purge`, deletes it. Returns Synapse's `shutdown_room` result.
    pub async fn shutdown_room(
        &self,
        rooms: &Rooms,
        room_id: &RoomId,
        admin: &UserId,
        options: DeleteRoom,
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
            rooms_store::get_room_members_in(&conn, room_id.as_str(), &["join", "invite", "knock"])
                .await?;
        drop(conn);
        let (mut kicked, mut failed) = (Vec::new(), Vec::new());
        for member in members {
            let Ok(user_id) = UserId::parse(&member) else {
                continue;
            };
            if user_id.server_name() != self.config.server_name {
                continue;
            }
            match rooms.leave(&user_id, room_id, None).await {
                Ok(()) => kicked.push(member),
                Err(err) => {
                    tracing::warn!(%room_id, %user_id, "could not remove a member: {err}");
                    failed.push(member);
                }
            }
        }
        let mut conn = self.db.conn().await?;
        let aliases = store::delete_aliases_and_unpublish(&conn, room_id.as_str()).await?;
        if options.purge {
            conn.transaction::<_, Error, _>(async |conn| {
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
            "new_room_id": null,
        }))
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
                    .shutdown_room(&services.rooms, &room_id, &admin, options)
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
