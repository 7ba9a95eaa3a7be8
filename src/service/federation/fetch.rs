//! Asking another server for events we lack to judge one it sent: the state before an event
//! whose `prev_events` are beyond what we hold (`/state`), and the auth chain of an event whose
//! auth events we lack (`/event_auth`). Answers are checked event by event as a `send_join`
//! answer is (format, signatures, hashes, the auth rules against each event's own auth events)
//! and what passes is stored as outliers: known, without a place in the room's history.

use ruma::{
    api::federation::{authorization::get_event_authorization, event::get_room_state},
    room_version_rules::RoomVersionRules,
    RoomId, RoomVersionId, ServerName,
};
use serde_json::value::RawValue as RawJsonValue;

use super::{pdus::CheckedPdu, room_access::federation_pdu, Federation};
use crate::{
    error::Result,
    service::rooms::{remote_join::JoinedRoom, Rooms},
    storage::{rooms as store, state::StateIds},
};

impl Federation {
    /// The state before `event` as `server` gives it (`/state`), every event of the answer
    /// checked as a `send_join` answer's are and stored as an outlier; `None` when the server
    /// does not answer usably. For an event whose `prev_events` are beyond what we hold (the
    /// oldest of a backfilled batch, or one past a gap too wide to fill).
    pub(super) async fn fetch_state_before(
        &self,
        rooms: &Rooms,
        server: &ServerName,
        room_id: &RoomId,
        rules: &RoomVersionRules,
        version: &RoomVersionId,
        event: &CheckedPdu,
    ) -> Result<Option<StateIds>> {
        let request = get_room_state::v1::Request::new(event.event_id.clone(), room_id.to_owned());
        let response = match self.client.send(server, request).await {
            Ok(response) => response,
            Err(problem) => {
                tracing::info!(%server, %room_id, %problem, "state request failed");
                return Ok(None);
            }
        };
        let Some(answer) = self
            .checked_answer(
                server,
                room_id,
                rules,
                version,
                &response.pdus,
                &response.auth_chain,
            )
            .await?
        else {
            return Ok(None);
        };
        rooms.store_outliers(room_id, &answer.events).await?;
        Ok(Some(
            answer
                .state
                .into_iter()
                .map(|s| ((s.kind, s.state_key), s.event_id))
                .collect(),
        ))
    }

    /// Fetches the auth chain of `event` from `server` (`/event_auth`) and stores what passes
    /// the checks as outliers. Answers whether anything usable came back.
    pub(super) async fn fetch_auth_chain(
        &self,
        rooms: &Rooms,
        server: &ServerName,
        room_id: &RoomId,
        rules: &RoomVersionRules,
        version: &RoomVersionId,
        event: &CheckedPdu,
    ) -> Result<bool> {
        let request =
            get_event_authorization::v1::Request::new(room_id.to_owned(), event.event_id.clone());
        let mut chain = match self.client.send(server, request).await {
            Ok(response) => response.auth_chain,
            Err(problem) => {
                tracing::info!(%server, %room_id, %problem, "auth chain request failed");
                return Ok(false);
            }
        };
        chain.truncate(MAX_AUTH_CHAIN);
        // The checks start from the room's create event; a chain that leaves it out (since v12
        // no event lists it) gets ours.
        let conn = self.db.conn().await?;
        if let Some(create) =
            store::get_current_state_event(&conn, room_id.as_str(), "m.room.create", "").await?
        {
            chain.push(federation_pdu(&create.pdu)?);
        }
        drop(conn);
        let Some(answer) = self
            .checked_answer(server, room_id, rules, version, &[], &chain)
            .await?
        else {
            return Ok(false);
        };
        rooms.store_outliers(room_id, &answer.events).await?;
        Ok(!answer.events.is_empty())
    }

    /// A server's answer of state and auth chain events, each checked; `None` when it is
    /// unusable (no valid create event among them).
    async fn checked_answer(
        &self,
        server: &ServerName,
        room_id: &RoomId,
        rules: &RoomVersionRules,
        version: &RoomVersionId,
        state: &[Box<RawJsonValue>],
        auth_chain: &[Box<RawJsonValue>],
    ) -> Result<Option<JoinedRoom>> {
        match self
            .check_room_state(rules, version, room_id, state, auth_chain)
            .await
        {
            Ok(answer) => Ok(Some(answer)),
            Err(problem) => {
                tracing::info!(%server, %room_id, %problem, "unusable answer");
                Ok(None)
            }
        }
    }
}

/// Most auth chain events taken from one `/event_auth` answer.
const MAX_AUTH_CHAIN: usize = 1_000;
