//! Knocking on a room of another server, and withdrawing the knock.
//!
//! A knock goes through `make_knock` for a template and `send_knock` with our signed event, to
//! the servers a join would try ([`Federation::route`]). The resident answers the room state a
//! knocker sees; the knock is stored with it like an invite from another server, so the
//! knocker's `/sync` shows the room under `rooms.knock`. The resident's later invite comes over
//! `/v2/invite` as any invite does.
//!
//! Only the room's servers can make a withdrawal known (this server is not in the room), so a
//! leave of a knocked room goes through `make_leave`/`send_leave` to the servers whose events
//! the knock state shows and the room ID's server; when none takes it, the leave is made here
//! alone, as for an invite from a server that cannot be reached.

use ruma::{
    api::federation::membership::{
        create_knock_event, create_leave_event, prepare_knock_event, prepare_leave_event,
        RawStrippedState,
    },
    OwnedRoomId, OwnedServerName, RoomId, RoomOrAliasId, UserId,
};
use serde_json::{value::to_raw_value, Value};

use super::{
    join::{bad_gateway, member_content, supported},
    query::client_error,
    Federation,
};
use crate::{
    error::{Error, Result},
    service::rooms::{pdu::Pdu, send::Origin, Rooms, SUPPORTED_VERSIONS},
};

impl Federation {
    /// Knocks on a room as `user_id`: through another server when this one is not in the
    /// room, locally otherwise.
    pub async fn knock(
        &self,
        rooms: &Rooms,
        user_id: &UserId,
        room: &RoomOrAliasId,
        via: &[OwnedServerName],
        reason: Option<&str>,
    ) -> Result<OwnedRoomId> {
        let (room_id, servers) = self.route(rooms, user_id, room, via).await?;
        let Some(servers) = servers else {
            let room = ruma::OwnedRoomOrAliasId::from(room_id);
            return rooms.knock(user_id, &room, reason).await;
        };
        self.through_each(&servers, &room_id, "knock", async |server| {
            self.knock_through(rooms, server, user_id, &room_id, reason)
                .await
        })
        .await?;
        Ok(room_id)
    }

    /// One attempt at knocking through `server`.
    async fn knock_through(
        &self,
        rooms: &Rooms,
        server: &OwnedServerName,
        user_id: &UserId,
        room_id: &RoomId,
        reason: Option<&str>,
    ) -> Result<()> {
        let mut request =
            prepare_knock_event::v1::Request::new(room_id.to_owned(), user_id.to_owned());
        request.ver = SUPPORTED_VERSIONS.to_vec();
        let made = self
            .client
            .send(server, request)
            .await
            .map_err(|e| client_error(e, "room (make_knock)"))?;
        let (version, rules) = supported(Some(made.room_version))?;
        if !rules.authorization.knocking {
            return Err(Error::forbidden(
                "The room's version does not allow knocking",
            ));
        }
        let extra = member_content(rooms.own_member_profile(user_id).await?, reason);
        let (event_id, knock) =
            self.sign_member(&made.event, &rules, user_id, room_id, "knock", extra)?;
        let raw = to_raw_value(&knock).map_err(Error::internal)?;
        let answer = self
            .client
            .send(
                server,
                create_knock_event::v1::Request::new(room_id.to_owned(), event_id.clone(), raw),
            )
            .await
            .map_err(|e| client_error(e, "room (send_knock)"))?;
        // Full PDUs (the spec since v1.16) or stripped events (older servers): shown as
        // stripped state either way, nothing decided on it.
        #[allow(deprecated)]
        let state: Vec<Value> = answer
            .knock_room_state
            .iter()
            .filter_map(|entry| match entry {
                RawStrippedState::Pdu(pdu) => serde_json::from_str(pdu.get()).ok(),
                RawStrippedState::Stripped(stripped) => stripped.deserialize_as().ok(),
                _ => None,
            })
            .filter(|event: &Value| event.get("state_key").is_some() && event.get("type").is_some())
            .collect();
        if !state.iter().any(|event| event["type"] == "m.room.create") {
            // Synapse always sends it; a knock we cannot show is still made.
            tracing::info!(%server, %room_id, "knock_room_state without the create event");
        }
        let json = serde_json::to_value(&knock).map_err(Error::internal)?;
        let pdu = Pdu::from_json(event_id.as_str(), &json)?;
        rooms
            .store_out_of_band_membership(room_id, &version, &pdu, &json, &state)
            .await
    }

    /// Leaves a room; a knock on a room this server is not in is withdrawn through the room's
    /// servers, or here alone when none of them takes it.
    pub async fn leave(
        &self,
        rooms: &Rooms,
        user_id: &UserId,
        room_id: &RoomId,
        reason: Option<&str>,
    ) -> Result<()> {
        if self.enabled() {
            if let Some(knock_id) = rooms.out_of_band_knock(room_id, user_id).await? {
                let mut servers = rooms.servers_in_room_state_of(&knock_id).await?;
                servers.extend(room_id.server_name().map(ToOwned::to_owned));
                let servers = self.candidates(servers);
                let withdrawn = self
                    .through_each(&servers, room_id, "leave", async |server| {
                        self.withdraw_knock_through(
                            rooms, server, user_id, room_id, &knock_id, reason,
                        )
                        .await
                    })
                    .await;
                match withdrawn {
                    Ok(()) => return Ok(()),
                    Err(problem) => {
                        tracing::warn!(%room_id, %problem, "no server took the withdrawal of a knock; leaving here only")
                    }
                }
            }
        }
        rooms.leave(user_id, room_id, reason, Origin::Client).await
    }

    /// One attempt at withdrawing our knock `knock_id` through `server`.
    async fn withdraw_knock_through(
        &self,
        rooms: &Rooms,
        server: &OwnedServerName,
        user_id: &UserId,
        room_id: &RoomId,
        knock_id: &str,
        reason: Option<&str>,
    ) -> Result<()> {
        let made = self
            .client
            .send(
                server,
                prepare_leave_event::v1::Request::new(room_id.to_owned(), user_id.to_owned()),
            )
            .await
            .map_err(|e| client_error(e, "room (make_leave)"))?;
        let (_, rules) = supported(made.room_version)?;
        let extra = member_content(Default::default(), reason);
        let (event_id, leave) =
            self.sign_member(&made.event, &rules, user_id, room_id, "leave", extra)?;
        let raw = to_raw_value(&leave).map_err(Error::internal)?;
        self.client
            .send(
                server,
                create_leave_event::v2::Request::new(room_id.to_owned(), event_id.clone(), raw),
            )
            .await
            .map_err(|e| client_error(e, "room (send_leave)"))?;
        let json = serde_json::to_value(&leave).map_err(Error::internal)?;
        let pdu = Pdu::from_json(event_id.as_str(), &json)
            .map_err(|_| bad_gateway("The make_leave template is not a valid event"))?;
        rooms
            .store_remote_leave(user_id, room_id, knock_id, &pdu, &json)
            .await
    }
}
