//! Purging a room's history (`/_synapse/admin/v1/purge_history`): events older than a point
//! are deleted in the background, while the room keeps working.
//!
//! What stays, as in Synapse: every state event (current state, memberships and the state
//! groups name them, and new events are authorised against them), the room's forward
//! extremities (new events point at them), and, unless `delete_local_events`, the events of
//! local senders (they may be the only copies), which become outliers no client is served.

use std::sync::Arc;

use ruma::RoomId;
use serde_json::{json, Value};

use super::Admin;
use crate::{
    error::{Error, Result},
    service::{rooms::writer::lock_room, sessions::generate_token, Services},
    storage::{admin_history as store, now_ms},
};

/// Where a purge stops: events before it go, it stays.
#[derive(Debug, Clone)]
pub enum PurgePoint {
    /// This event, and every event at its depth, stay.
    Event(ruma::OwnedEventId),
    /// The room's last event sent before this time (ms since 1970) stays.
    Ts(i64),
}

impl Admin {
    /// Checks the purge point, then purges the room's history up to it in the background;
    /// returns the purge's ID for the status endpoint.
    pub async fn start_history_purge(
        services: Arc<Services>,
        room_id: &RoomId,
        point: &PurgePoint,
        delete_local_events: bool,
    ) -> Result<String> {
        let depth = services.admin.purge_depth(room_id, point).await?;
        let purge_id = generate_token("purge");
        {
            let conn = services.db.conn().await?;
            store::insert_history_purge(&conn, &purge_id, room_id.as_str(), now_ms()).await?;
        }
        let (id, room_id) = (purge_id.clone(), room_id.to_owned());
        tokio::spawn(async move {
            let admin = &services.admin;
            let outcome = admin
                .purge_history(&room_id, depth, delete_local_events)
                .await;
            let (status, error) = match &outcome {
                Ok(deleted) => {
                    tracing::info!(%room_id, deleted, "purged room history");
                    ("complete", None)
                }
                Err(err) => ("failed", Some(err.to_string())),
            };
            let recorded = async {
                let conn = services.db.conn().await?;
                store::update_history_purge(&conn, &id, status, error.as_deref()).await?;
                Ok::<_, Error>(())
            };
            if let Err(err) = recorded.await {
                tracing::warn!(%room_id, "could not record a history purge's outcome: {err}");
            }
        });
        Ok(purge_id)
    }

    /// The depth events are purged below: the event's own (404 for an unknown event, 400 for
    /// another room's), or that of the room's last event before the time (404 when none).
    async fn purge_depth(&self, room_id: &RoomId, point: &PurgePoint) -> Result<i64> {
        let conn = self.db.conn().await?;
        match point {
            PurgePoint::Event(event_id) => {
                let (event_room, depth) =
                    store::get_event_depth(&conn, event_id.as_str())
                        .await?
                        .ok_or_else(|| Error::not_found(format!("Event {event_id} not found")))?;
                if event_room != room_id.as_str() {
                    return Err(Error::unknown("Event is for wrong room."));
                }
                Ok(depth)
            }
            PurgePoint::Ts(ts) => store::get_depth_before_ts(&conn, room_id.as_str(), *ts)
                .await?
                .ok_or_else(|| Error::not_found("there is no event to be purged")),
        }
    }

    /// Purges in one transaction, under the room's lock (so no write of the room is half-way
    /// through); returns how many events were deleted.
    async fn purge_history(
        &self,
        room_id: &RoomId,
        depth: i64,
        delete_local_events: bool,
    ) -> Result<usize> {
        let keep_suffix = (!delete_local_events).then(|| format!(":{}", self.config.server_name));
        let mut conn = self.db.conn().await?;
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            lock_room(conn, room_id).await?;
            Ok(store::purge_history(conn, room_id.as_str(), depth, keep_suffix.as_deref()).await?)
        })
        .await
    }

    /// One purge's status, `{status, error?}`; 404 for unknown IDs.
    pub async fn history_purge(&self, purge_id: &str) -> Result<Value> {
        let conn = self.db.conn().await?;
        let row = store::get_history_purge(&conn, purge_id)
            .await?
            .ok_or_else(|| Error::not_found(format!("purge id '{purge_id}' not found")))?;
        let mut status = json!({ "status": row.status });
        if let Some(error) = row.error {
            status["error"] = json!(error);
        }
        Ok(status)
    }
}
