//! The newest events of a batch of rooms, read together for a sync's room sections (`/sync`'s
//! and sliding sync's): each room's newest events in its window, one past its timeline (which
//! says whether the timeline is limited), and the bundled relations and the syncing device's
//! transaction IDs of those events, one statement each for the whole batch.

use std::collections::HashMap;

use diesel_async::AsyncPgConnection;
use serde_json::Value;

use crate::{
    error::Result,
    storage::{
        relations::{self as relations_store, Bundled},
        rooms::{self as store, EventRow},
        timelines::{self, Window},
    },
};

/// What a batch's timelines share: their events' bundled relations and transaction IDs.
pub(super) struct TimelineExtras {
    pub bundled: Bundled,
    /// The transaction IDs of the syncing device's events.
    pub transaction_ids: HashMap<String, String>,
}

/// One room's newest events in its window, newest first and one past its timeline, with what
/// its batch read for them.
pub(super) struct Newest<'b> {
    pub rows: Vec<EventRow>,
    pub extras: &'b TimelineExtras,
}

/// Reads the newest events of every window (each window's `limit` one past its timeline), by
/// room, and their extras; relations only when `bundle` (federation-format timelines carry
/// none).
pub(super) async fn read_newest(
    conn: &AsyncPgConnection,
    user: &str,
    device_id: &str,
    windows: &[Window<'_>],
    bundle: bool,
) -> Result<(HashMap<String, Vec<EventRow>>, TimelineExtras)> {
    let newest = timelines::get_newest_events_of_rooms(conn, windows).await?;
    let timelines = || {
        windows.iter().flat_map(|window| {
            let timeline = (window.limit - 1).max(0) as usize;
            newest
                .get(window.room_id)
                .into_iter()
                .flat_map(move |rows| rows.iter().take(timeline))
        })
    };
    let parents: Vec<String> = timelines()
        .filter(|row| row.state_key.is_none())
        .map(|row| row.event_id.clone())
        .collect();
    let own: Vec<String> = timelines()
        .filter(|row| row.sender == user)
        .map(|row| row.event_id.clone())
        .collect();
    let (bundled, transaction_ids) = tokio::try_join!(
        async {
            match parents.is_empty() || !bundle {
                true => Ok(Bundled::default()),
                false => relations_store::get_bundled(conn, &parents, user).await,
            }
        },
        async {
            match own.is_empty() {
                true => Ok(HashMap::new()),
                false => store::get_txn_ids_for_device(conn, user, device_id, &own)
                    .await
                    .map(|ids| ids.into_iter().collect()),
            }
        },
    )?;
    Ok((
        newest,
        TimelineExtras {
            bundled,
            transaction_ids,
        },
    ))
}

/// The remote echo, from the transaction IDs read: each event the device sent gets its own.
pub(super) fn set_transaction_ids(events: &mut [Value], transaction_ids: &HashMap<String, String>) {
    for event in events.iter_mut() {
        if let Some(txn) = event["event_id"]
            .as_str()
            .and_then(|id| transaction_ids.get(id))
        {
            event["unsigned"]["transaction_id"] = Value::from(txn.as_str());
        }
    }
}
