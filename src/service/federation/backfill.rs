//! Backfill: history from before this server joined a room (or that it missed), asked of the
//! room's other servers when a client pages back (`/messages`) past the oldest event held here.
//!
//! The events a server answers go through every check, oldest first. An event whose
//! `prev_events` lie beyond what we hold (the oldest of a batch) needs the state before it: we
//! ask the same server for it ([`Federation::fetch_state_before`]), at most
//! [`MAX_STATE_FETCHES`] times a round. Backfilled events take
//! positions below every sync token: history, never news.

use std::collections::HashMap;

use ruma::{
    api::federation::backfill::get_backfill, canonical_json::CanonicalJsonObject,
    room_version_rules::RoomVersionRules, OwnedEventId, OwnedServerName, RoomId, RoomVersionId,
    ServerName, UInt, UserId,
};

use super::{pdus::claimed_depth, Federation};
use crate::{
    error::{Error, Result},
    service::rooms::{
        incoming::{Arrival, Received},
        messages::{Page, PageRequest},
        Rooms,
    },
    storage::{dag, memberships as membership_store, rooms as store},
};

/// Events asked for in one round (Synapse asks for 100 too).
const BACKFILL_LIMIT: u32 = 100;
/// Backward extremities named in one request.
const MAX_EXTREMITIES: i64 = 20;
/// Servers tried in one round before giving up.
const MAX_SERVERS: usize = 3;
/// `/state` requests one round may make for events whose `prev_events` we lack.
const MAX_STATE_FETCHES: usize = 3;

impl Federation {
    /// A `/messages` page; one going back that reaches the start of what this server holds of a
    /// room shared with other servers first asks them for older history, then reads again.
    pub async fn messages(&self, rooms: &Rooms, request: &PageRequest<'_>) -> Result<Page> {
        let page = rooms.messages(request).await?;
        let reached_start = request.backwards && page.end.is_none();
        if !reached_start || !self.enabled() {
            return Ok(page);
        }
        match self.backfill(rooms, request.room_id).await {
            Ok(0) => Ok(page),
            Ok(_) => rooms.messages(request).await,
            Err(problem) => {
                tracing::warn!(room_id = %request.room_id, %problem, "backfill failed");
                Ok(page)
            }
        }
    }

    /// Asks the room's other servers, in turn, for the history before the oldest events held
    /// here, and takes what one of them answers. Answers how many events were added.
    pub async fn backfill(&self, rooms: &Rooms, room_id: &RoomId) -> Result<usize> {
        let conn = self.db.conn().await?;
        let extremities =
            dag::get_backward_extremities(&conn, room_id.as_str(), MAX_EXTREMITIES).await?;
        if extremities.is_empty() {
            return Ok(0);
        }
        let joined =
            membership_store::get_room_members_in(&conn, room_id.as_str(), &["join"]).await?;
        drop(conn);
        let from: Vec<OwnedEventId> = extremities
            .into_iter()
            .filter_map(|id| OwnedEventId::try_from(id).ok())
            .collect();
        let servers = self.servers_by_members(&joined);
        self.backfill_from(rooms, room_id, &from, &servers).await
    }

    /// Asks `servers` in turn (at most [`MAX_SERVERS`]) for the history from `from` back, and
    /// takes what the first to answer with something new gives. Answers how many events were
    /// added.
    pub(super) async fn backfill_from(
        &self,
        rooms: &Rooms,
        room_id: &RoomId,
        from: &[OwnedEventId],
        servers: &[OwnedServerName],
    ) -> Result<usize> {
        let conn = self.db.conn().await?;
        let Some(room) = store::get_room(&conn, room_id.as_str()).await? else {
            return Ok(0);
        };
        drop(conn);
        let version =
            RoomVersionId::try_from(room.room_version.as_str()).map_err(Error::internal)?;
        let rules = version
            .rules()
            .ok_or_else(|| Error::internal("unknown room version"))?;
        for server in servers.iter().take(MAX_SERVERS) {
            let request = get_backfill::v1::Request::new(
                room_id.to_owned(),
                from.to_vec(),
                UInt::from(BACKFILL_LIMIT),
            );
            let pdus = match self.client.send(server, request).await {
                Ok(response) => response.pdus,
                Err(problem) => {
                    tracing::info!(%server, %room_id, %problem, "backfill request failed");
                    continue;
                }
            };
            let added = self
                .take_backfilled(rooms, server, room_id, &rules, &version, &pdus)
                .await?;
            tracing::debug!(%server, %room_id, added, "backfilled");
            if added > 0 {
                return Ok(added);
            }
        }
        Ok(0)
    }

    /// Other servers with joined members, those with the most first (most likely to hold the
    /// room's whole history).
    fn servers_by_members(&self, joined: &[String]) -> Vec<OwnedServerName> {
        let mut counts: HashMap<OwnedServerName, usize> = HashMap::new();
        for user in joined {
            if let Ok(user) = UserId::parse(user.as_str()) {
                if user.server_name() != self.config.server_name {
                    *counts.entry(user.server_name().to_owned()).or_default() += 1;
                }
            }
        }
        let mut servers: Vec<(OwnedServerName, usize)> = counts.into_iter().collect();
        servers.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        servers.into_iter().map(|(server, _)| server).collect()
    }

    /// Takes a `/backfill` answer oldest first, each event through every check; answers how
    /// many were added to the room's history.
    async fn take_backfilled(
        &self,
        rooms: &Rooms,
        server: &ServerName,
        room_id: &RoomId,
        rules: &RoomVersionRules,
        version: &RoomVersionId,
        pdus: &[Box<serde_json::value::RawValue>],
    ) -> Result<usize> {
        let mut objects: Vec<(i64, CanonicalJsonObject)> = pdus
            .iter()
            .take(BACKFILL_LIMIT as usize)
            .filter_map(|raw| serde_json::from_str::<CanonicalJsonObject>(raw.get()).ok())
            .map(|object| (claimed_depth(&object), object))
            .collect();
        objects.sort_by_key(|(depth, _)| *depth);
        let mut added = 0;
        let mut state_fetches = 0;
        for (_, object) in objects {
            let Ok(checked) = self.check_pdu(rules, object).await? else {
                continue;
            };
            let backfilled = Arrival {
                backfilled: true,
                state_before: None,
            };
            let mut received = rooms
                .receive(room_id, rules, checked.clone(), backfilled)
                .await?;
            if received == Received::MissingPrevEvents && state_fetches < MAX_STATE_FETCHES {
                state_fetches += 1;
                if let Some(state) = self
                    .fetch_state_before(rooms, server, room_id, rules, version, &checked)
                    .await?
                {
                    let with_state = Arrival {
                        backfilled: true,
                        state_before: Some(&state),
                    };
                    received = rooms.receive(room_id, rules, checked, with_state).await?;
                }
            }
            tracing::debug!(%room_id, ?received, "backfilled event");
            if received == Received::Accepted {
                added += 1;
            }
        }
        Ok(added)
    }
}
