//! Serving a room's events to other servers (FEDERATION.md §1.5 and §5, "Serving reads"):
//! `/event`, `/state`, `/state_ids`, `/event_auth`, `/backfill` and `/get_missing_events`.
//! Who may read what is [`RoomAccess`]'s to decide; the graph walks are
//! `storage::event_graph`'s. Each request's work is bounded whatever it asks (invariant 9).

use diesel_async::AsyncPgConnection;
use ruma::{EventId, OwnedEventId, RoomId, ServerName};
use serde_json::value::RawValue as RawJsonValue;

use super::{
    room_access::{federation_pdu, RoomAccess},
    Federation,
};
use crate::{
    error::{Error, Result},
    storage::{event_graph, rooms::EventRow},
};

/// Most events one `/backfill` answers, whatever its `limit` asks (Synapse's cap too).
pub const MAX_BACKFILL: usize = 100;
/// Most events one `/get_missing_events` answers, whatever its `limit` asks (Synapse's cap).
pub const MAX_MISSING_EVENTS: usize = 20;
/// Event IDs a `/get_missing_events` walk may look up per event it may answer: a wide graph
/// costs this much at most, not a walk of the room (tuwunel's was unbounded, 35655a859).
const LOOKUPS_PER_MISSING_EVENT: usize = 10;

/// The state before an event: its event IDs and their auth chain.
struct StateAt {
    state: Vec<String>,
    auth_chain: Vec<EventRow>,
}

impl Federation {
    /// `GET /event/{eventId}`: the event for `origin`, redacted when it may not see it.
    pub async fn get_event_for_server(
        &self,
        origin: &ServerName,
        event_id: &EventId,
    ) -> Result<Box<RawJsonValue>> {
        let conn = self.db.conn().await?;
        let (mut access, event) = RoomAccess::open_for_event(&conn, origin, event_id).await?;
        access.serve(&conn, &event).await
    }

    /// `GET /state_ids/{roomId}?event_id=`: the IDs of the state before the event and of its
    /// auth chain.
    pub async fn get_state_ids_for_server(
        &self,
        origin: &ServerName,
        room_id: &RoomId,
        event_id: &EventId,
    ) -> Result<(Vec<OwnedEventId>, Vec<OwnedEventId>)> {
        let conn = self.db.conn().await?;
        let state = state_at(&conn, origin, room_id, event_id).await?;
        let auth_chain = state.auth_chain.into_iter().map(|row| row.event_id);
        Ok((parse_ids(state.state)?, parse_ids(auth_chain)?))
    }

    /// `GET /state/{roomId}?event_id=`: the state before the event and its auth chain, as
    /// PDUs (whole: see [`RoomAccess`]).
    pub async fn get_state_for_server(
        &self,
        origin: &ServerName,
        room_id: &RoomId,
        event_id: &EventId,
    ) -> Result<(Vec<Box<RawJsonValue>>, Vec<Box<RawJsonValue>>)> {
        let conn = self.db.conn().await?;
        let state = state_at(&conn, origin, room_id, event_id).await?;
        let mut events =
            event_graph::get_servable_events(&conn, room_id.as_str(), &state.state).await?;
        events.sort_by_key(|row| (row.depth, row.stream_ordering));
        Ok((pdus(&events)?, pdus(&state.auth_chain)?))
    }

    /// `GET /event_auth/{roomId}/{eventId}`: the event's auth chain, as PDUs.
    pub async fn get_event_auth_for_server(
        &self,
        origin: &ServerName,
        room_id: &RoomId,
        event_id: &EventId,
    ) -> Result<Vec<Box<RawJsonValue>>> {
        let conn = self.db.conn().await?;
        let access = RoomAccess::open(&conn, origin, room_id).await?;
        let event = access.event(&conn, event_id).await?;
        let chain = event_graph::auth_chain(&conn, room_id.as_str(), &[event.event_id]).await?;
        pdus(&chain)
    }

    /// `GET /backfill/{roomId}?v=&limit=`: up to `limit` (at most [`MAX_BACKFILL`]) events from
    /// `from` back through `prev_events`, newest first, `from` included. Events of `from` that
    /// are unknown or of another room are skipped alike (a backfilling server often names
    /// events we lack; failing the request for them would stop its backfill).
    pub async fn backfill_for_server(
        &self,
        origin: &ServerName,
        room_id: &RoomId,
        from: &[OwnedEventId],
        limit: u64,
    ) -> Result<Vec<Box<RawJsonValue>>> {
        let limit = capped(limit, MAX_BACKFILL);
        let conn = self.db.conn().await?;
        let mut access = RoomAccess::open(&conn, origin, room_id).await?;
        let from = ids(from.iter().take(MAX_BACKFILL));
        let events = event_graph::walk_back_by_depth(&conn, room_id.as_str(), &from, limit).await?;
        let mut served = Vec::with_capacity(events.len());
        for event in &events {
            served.push(access.serve(&conn, event).await?);
        }
        Ok(served)
    }

    /// `POST /get_missing_events/{roomId}`: up to `limit` (at most [`MAX_MISSING_EVENTS`])
    /// events before `latest` back through `prev_events`, not past `earliest` nor below
    /// `min_depth`, oldest first.
    pub async fn get_missing_events_for_server(
        &self,
        origin: &ServerName,
        room_id: &RoomId,
        earliest: &[OwnedEventId],
        latest: &[OwnedEventId],
        limit: u64,
        min_depth: u64,
    ) -> Result<Vec<Box<RawJsonValue>>> {
        let limit = capped(limit, MAX_MISSING_EVENTS);
        let conn = self.db.conn().await?;
        let mut access = RoomAccess::open(&conn, origin, room_id).await?;
        let events = event_graph::walk_back_breadth_first(
            &conn,
            room_id.as_str(),
            &ids(earliest.iter()),
            &ids(latest.iter().take(MAX_MISSING_EVENTS)),
            limit,
            i64::try_from(min_depth).unwrap_or(i64::MAX),
            limit * LOOKUPS_PER_MISSING_EVENT,
        )
        .await?;
        let mut served = Vec::with_capacity(events.len());
        for event in &events {
            served.push(access.serve(&conn, event).await?);
        }
        Ok(served)
    }
}

impl Federation {
    /// `GET /timestamp_to_event/{roomId}?ts=&dir=`: the event of the room whose
    /// `origin_server_ts` is nearest `ts` in direction `dir` (the first at or after it going
    /// forwards, at or before it going backwards), for a server in the room, as Synapse
    /// answers it: by the room's access rules only (an event ID and a time say little, and
    /// `/event` applies the visibility rules to the event itself).
    pub async fn timestamp_to_event_for_server(
        &self,
        origin: &ServerName,
        room_id: &RoomId,
        ts: i64,
        forward: bool,
    ) -> Result<(OwnedEventId, i64)> {
        let conn = self.db.conn().await?;
        RoomAccess::open(&conn, origin, room_id).await?;
        let nearest = crate::storage::timelines::get_events_near_ts(
            &conn,
            room_id.as_str(),
            ts,
            forward,
            None,
            1,
        )
        .await?;
        let row = nearest
            .into_iter()
            .next()
            .ok_or_else(|| Error::not_found("No event found near that time"))?;
        let origin_ts = row.pdu["origin_server_ts"].as_i64().unwrap_or_default();
        let event_id = OwnedEventId::try_from(row.event_id).map_err(Error::internal)?;
        Ok((event_id, origin_ts))
    }
}

/// The state before an event of the room and its auth chain, for `origin`.
async fn state_at(
    conn: &AsyncPgConnection,
    origin: &ServerName,
    room_id: &RoomId,
    event_id: &EventId,
) -> Result<StateAt> {
    let mut access = RoomAccess::open(conn, origin, room_id).await?;
    let event = access.event(conn, event_id).await?;
    let mut state: Vec<String> = access
        .state_before(conn, &event)
        .await?
        .into_values()
        .collect();
    state.sort_unstable();
    let auth_chain = event_graph::auth_chain(conn, room_id.as_str(), &state).await?;
    Ok(StateAt { state, auth_chain })
}

/// A request's `limit`, capped.
fn capped(limit: u64, cap: usize) -> usize {
    usize::try_from(limit).unwrap_or(usize::MAX).min(cap)
}

/// Event IDs as stored.
fn ids<'a>(ids: impl Iterator<Item = &'a OwnedEventId>) -> Vec<String> {
    ids.map(|id| id.as_str().to_owned()).collect()
}

/// Stored event IDs as ruma's.
fn parse_ids(ids: impl IntoIterator<Item = String>) -> Result<Vec<OwnedEventId>> {
    ids.into_iter()
        .map(|id| OwnedEventId::try_from(id).map_err(Error::internal))
        .collect()
}

/// Events in federation form, whole.
fn pdus(events: &[EventRow]) -> Result<Vec<Box<RawJsonValue>>> {
    events.iter().map(|row| federation_pdu(&row.pdu)).collect()
}
