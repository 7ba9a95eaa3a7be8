//! Storing a room joined through another server: the state and auth events its `send_join`
//! answer brought (checked by the federation service) become outliers, and our join starts the
//! room's timeline here with the state it joined as its state before.

use diesel_async::AsyncPgConnection;
use ruma::{OwnedRoomId, OwnedServerName, OwnedUserId, RoomId, RoomVersionId, UserId};
use serde_json::Value;

use super::{members::record_member_event, pdu::Pdu, writer::lock_room, Rooms};
use crate::{
    error::{Error, Result},
    service::notifier,
    storage::{
        dag, memberships as membership_store, now_ms, room_servers, rooms as store,
        state::{self as state_store},
        streams,
    },
};

/// One entry of a room's state.
pub struct StateEvent {
    /// Event type.
    pub kind: String,
    /// State key.
    pub state_key: String,
    /// The event.
    pub event_id: String,
}

/// A room as another server's `send_join` answer described it, every event checked.
pub struct JoinedRoom {
    /// The room.
    pub room_id: OwnedRoomId,
    /// Its version.
    pub version: RoomVersionId,
    /// Its create event's sender.
    pub creator: String,
    /// The state and auth chain events, `(event ID, PDU)`.
    pub events: Vec<(String, Value)>,
    /// The state before our join.
    pub state: Vec<StateEvent>,
}

impl Rooms {
    /// Whether a user of this server is joined to the room (so this server has its state and
    /// takes part in it).
    pub async fn is_resident(&self, room_id: &RoomId) -> Result<bool> {
        let conn = self.db.conn().await?;
        Ok(room_servers::has_joined_member_of_server(
            &conn,
            room_id.as_str(),
            self.config.server_name.as_str(),
        )
        .await?)
    }

    /// Stores a room joined through another server, and our join as the first event of its
    /// timeline here.
    pub async fn store_joined_room(&self, room: JoinedRoom, join: (Pdu, Value)) -> Result<()> {
        let (pdu, json) = join;
        let _room_lock = self.locks.lock(&room.room_id).await;
        let mut conn = self.db.conn().await?;
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            lock_room(conn, &room.room_id).await?;
            store_in(conn, &self.config.server_name, &room, &pdu, &json).await
        })
        .await?;
        crate::metrics::metrics().events_persisted("federation", 1);
        Ok(())
    }
}

impl Rooms {
    /// Stores events a server in the room gave, each checked on its own (state and auth
    /// events), as outliers: known, but without a place in the room's history.
    pub async fn store_outliers(&self, room_id: &RoomId, events: &[(String, Value)]) -> Result<()> {
        let mut conn = self.db.conn().await?;
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            insert_outliers(conn, room_id.as_str(), events).await
        })
        .await
    }
}

async fn insert_outliers(
    conn: &AsyncPgConnection,
    room_id: &str,
    events: &[(String, Value)],
) -> Result<()> {
    for (event_id, pdu) in events {
        dag::insert_outlier(conn, event_id, room_id, pdu).await?;
    }
    Ok(())
}

async fn store_in(
    conn: &AsyncPgConnection,
    server_name: &ruma::ServerName,
    room: &JoinedRoom,
    join: &Pdu,
    json: &Value,
) -> Result<()> {
    let room_id = room.room_id.as_str();
    if let Some(user) = join.state_key.as_deref() {
        // An invite or knock that came out of band stops being the room's latest served event
        // here: the state the join brought is what the room's history starts from.
        dag::demote_invites_and_knocks(conn, room_id, user).await?;
    }
    insert_outliers(conn, room_id, &room.events).await?;
    let entries: Vec<(&str, &str, &str)> = room
        .state
        .iter()
        .map(|s| (s.kind.as_str(), s.state_key.as_str(), s.event_id.as_str()))
        .collect();
    let before = state_store::insert_state_snapshot(conn, room_id, None, &entries).await?;
    let user = join
        .state_key
        .as_deref()
        .ok_or_else(|| Error::internal("a join without a state key"))?;
    let join_id = join.event_id.as_str();
    let (after, _) =
        state_store::insert_state_after(conn, room_id, before, &[("m.room.member", user, join_id)])
            .await?;
    if store::get_room(conn, room_id).await?.is_none() {
        store::insert_room(
            conn,
            room_id,
            room.version.as_str(),
            &room.creator,
            after,
            now_ms(),
        )
        .await?;
    }
    let new_event = store::NewEvent {
        event_id: join_id,
        room_id,
        depth: join.depth,
        sender: join.sender.as_str(),
        event_type: "m.room.member",
        state_key: Some(user),
        origin_server_ts: i64::from(join.origin_server_ts.get()),
        pdu: json,
        state_group: after,
    };
    tokio::try_join!(
        streams::next_position(conn, streams::EVENTS),
        store::insert_event(conn, &new_event, None),
        dag::reset_forward_extremities(conn, room_id, join_id, join.depth),
        store::set_current_state_group(conn, room_id, after),
    )?;
    // The current state: the state joined, then our membership.
    let contents: std::collections::HashMap<&str, &Value> = room
        .events
        .iter()
        .map(|(id, pdu)| (id.as_str(), pdu))
        .collect();
    for entry in &room.state {
        store::set_current_state(
            conn,
            room_id,
            &entry.kind,
            &entry.state_key,
            &entry.event_id,
        )
        .await?;
        if entry.kind == "m.room.member" && entry.state_key != user {
            let content = contents
                .get(entry.event_id.as_str())
                .map(|pdu| pdu["content"].clone())
                .unwrap_or_default();
            record_member_event(
                conn,
                server_name,
                room_id,
                &entry.state_key,
                &content,
                &entry.event_id,
            )
            .await?;
        }
    }
    store::set_current_state(conn, room_id, "m.room.member", user, join_id).await?;
    let content = join.content_value();
    record_member_event(conn, server_name, room_id, user, &content, join_id).await?;
    store::notify(conn, notifier::ROOM_CHANNEL, room_id).await?;
    store::notify(conn, notifier::USER_CHANNEL, user).await?;
    Ok(())
}

impl Rooms {
    /// Stores an invite of one of our users from another server, or one of our users' knock
    /// on a room of another server, with the room state it came with (for display: the
    /// invite or knock shows the room's name and avatar), so the user's `/sync` reports it.
    /// In a room we are in, the invite also comes as an ordinary event.
    pub async fn store_out_of_band_membership(
        &self,
        room_id: &RoomId,
        version: &RoomVersionId,
        invite: &Pdu,
        json: &Value,
        state: &[Value],
    ) -> Result<()> {
        if self.is_resident(room_id).await? {
            return Ok(());
        }
        let rules = version
            .rules()
            .ok_or_else(|| Error::internal("room version without rules"))?;
        let _room_lock = self.locks.lock(room_id).await;
        let mut conn = self.db.conn().await?;
        let stored = crate::storage::transaction::transaction(&mut conn, async |conn| {
            lock_room(conn, room_id).await?;
            let room = room_id.as_str();
            let invitee = invite
                .state_key
                .as_deref()
                .ok_or_else(|| Error::internal("an invite without a state key"))?;
            let mut entries: Vec<(String, String, String)> = Vec::new();
            let mut creator = invite.sender.to_string();
            for event in state {
                let Ok(object) = serde_json::from_value::<ruma::CanonicalJsonObject>(event.clone())
                else {
                    continue;
                };
                let Ok(hash) = ruma::signatures::reference_hash(&object, &rules) else {
                    continue;
                };
                let event_id = format!("${hash}");
                let kind = event["type"].as_str().unwrap_or_default().to_owned();
                let key = event["state_key"].as_str().unwrap_or_default().to_owned();
                if kind == "m.room.member" && key == invitee {
                    continue;
                }
                if kind == "m.room.create" {
                    creator = event["sender"].as_str().unwrap_or(&creator).to_owned();
                }
                dag::insert_outlier(conn, &event_id, room, event).await?;
                entries.push((kind, key, event_id));
            }
            let invite_id = invite.event_id.as_str();
            entries.push((
                "m.room.member".into(),
                invitee.to_owned(),
                invite_id.to_owned(),
            ));
            let refs: Vec<(&str, &str, &str)> = entries
                .iter()
                .map(|(k, s, e)| (k.as_str(), s.as_str(), e.as_str()))
                .collect();
            let (group, _) = state_store::insert_state_snapshot(conn, room, None, &refs).await?;
            if store::get_room(conn, room).await?.is_none() {
                store::insert_room(conn, room, version.as_str(), &creator, group, now_ms()).await?;
            }
            let new_event = store::NewEvent {
                event_id: invite_id,
                room_id: room,
                depth: invite.depth,
                sender: invite.sender.as_str(),
                event_type: "m.room.member",
                state_key: Some(invitee),
                origin_server_ts: i64::from(invite.origin_server_ts.get()),
                pdu: json,
                state_group: group,
            };
            if dag::event_exists(conn, invite_id).await? {
                return Ok(false);
            }
            let content = invite.content_value();
            tokio::try_join!(
                streams::next_position(conn, streams::EVENTS),
                store::insert_event(conn, &new_event, None),
            )?;
            let membership = match content.get("membership").and_then(Value::as_str) {
                Some(membership @ ("invite" | "knock")) => membership,
                _ => return Err(Error::internal("neither an invite nor a knock")),
            };
            membership_store::set_membership(
                conn,
                room,
                invitee,
                membership,
                content.get("displayname").and_then(Value::as_str),
                invite_id,
            )
            .await?;
            store::notify(conn, notifier::USER_CHANNEL, invitee).await?;
            Ok(true)
        })
        .await?;
        crate::metrics::metrics().events_persisted("federation", u64::from(stored));
        Ok(())
    }

    /// `user_id`'s knock (its event ID), when their current membership in a room this server
    /// is not in is a knock.
    pub async fn out_of_band_knock(
        &self,
        room_id: &RoomId,
        user_id: &UserId,
    ) -> Result<Option<String>> {
        let conn = self.db.conn().await?;
        let knock =
            match membership_store::get_membership(&conn, room_id.as_str(), user_id.as_str())
                .await?
            {
                Some((membership, event_id)) if membership == "knock" => event_id,
                _ => return Ok(None),
            };
        drop(conn);
        Ok((!self.is_resident(room_id).await?).then_some(knock))
    }

    /// The servers whose users sent the room state an invite or knock of ours came with, as
    /// far as this server (not in the room) knows the room's servers; ours left out.
    pub async fn servers_in_room_state_of(&self, event_id: &str) -> Result<Vec<OwnedServerName>> {
        let conn = self.db.conn().await?;
        let Some(group) = store::get_state_event(&conn, event_id)
            .await?
            .and_then(|row| row.state_group)
        else {
            return Ok(Vec::new());
        };
        let ids: Vec<String> = state_store::get_state_ids(&conn, group)
            .await?
            .into_values()
            .collect();
        let mut servers: Vec<OwnedServerName> = store::get_state_events(&conn, &ids)
            .await?
            .into_iter()
            .filter_map(|row| Some(UserId::parse(row.sender).ok()?.server_name().to_owned()))
            .filter(|server| server != &self.config.server_name)
            .collect();
        servers.sort();
        servers.dedup();
        Ok(servers)
    }

    /// Who invited `user_id` to a room, when their current membership is an invite.
    pub async fn inviter(&self, room_id: &RoomId, user_id: &UserId) -> Result<Option<OwnedUserId>> {
        let conn = self.db.conn().await?;
        let Some((membership, event_id)) =
            membership_store::get_membership(&conn, room_id.as_str(), user_id.as_str()).await?
        else {
            return Ok(None);
        };
        if membership != "invite" {
            return Ok(None);
        }
        Ok(store::get_state_event(&conn, &event_id)
            .await?
            .and_then(|row| UserId::parse(row.sender).ok()))
    }
}

impl Rooms {
    /// Rejects an invite to a room this server is not in (or withdraws a knock no server of the
    /// room took the withdrawal of): our leave, built on the invite and the room state it came
    /// with, signed here and stored in place of the invite. The
    /// federation sender then sends it to the servers that invite state shows joined (the
    /// inviter's), which take it like any event: a leave of an invited user is theirs to make.
    pub(super) async fn reject_remote_invite(
        &self,
        user_id: &UserId,
        room_id: &RoomId,
        invite_id: &str,
        reason: Option<&str>,
    ) -> Result<()> {
        let _room_lock = self.locks.lock(room_id).await;
        let mut conn = self.db.conn().await?;
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            lock_room(conn, room_id).await?;
            let room = room_id.as_str();
            let room_row = store::get_room(conn, room)
                .await?
                .ok_or_else(|| Error::not_found("Unknown room"))?;
            let rules = super::versions::rules_for(&room_row.room_version)?;
            let invite = store::get_state_event(conn, invite_id)
                .await?
                .ok_or_else(|| Error::forbidden("You are not invited to this room"))?;
            let group = invite
                .state_group
                .ok_or_else(|| Error::forbidden("You are not invited to this room"))?;
            let state = state_store::get_state_ids(conn, group).await?;
            let mut auth_events: Vec<ruma::OwnedEventId> = Vec::new();
            let mut wanted = vec![
                ("m.room.power_levels", ""),
                ("m.room.member", user_id.as_str()),
            ];
            if !rules.authorization.room_create_event_id_as_room_id {
                wanted.push(("m.room.create", ""));
            }
            for (kind, key) in wanted {
                if let Some(id) = state.get(&(kind.to_owned(), key.to_owned())) {
                    auth_events
                        .push(ruma::OwnedEventId::try_from(id.as_str()).map_err(Error::internal)?);
                }
            }
            let mut content = serde_json::json!({ "membership": "leave" });
            if let Some(reason) = reason {
                content["reason"] = serde_json::json!(reason);
            }
            let prev_events = [ruma::OwnedEventId::try_from(invite_id).map_err(Error::internal)?];
            let template = super::pdu::PduTemplate {
                room_id: Some(room_id),
                sender: user_id,
                kind: "m.room.member",
                state_key: Some(user_id.as_str()),
                content: &content,
                redacts: None,
                prev_events: &prev_events,
                auth_events: &auth_events,
                depth: invite.depth + 1,
                origin_server_ts: now_ms(),
            };
            let (event_id, json) = super::pdu::build_pdu(
                &template,
                &rules,
                &self.config.server_name,
                &self.keys.key_pair,
            )?;
            let pdu = Pdu::from_json(event_id.as_str(), &json)?;
            store_leave_in_place(conn, room_id, user_id, group, &pdu, &json).await
        })
        .await?;
        // Written here alone, without another server's part in it.
        crate::metrics::metrics().events_persisted(super::send::Origin::Client.metric_label(), 1);
        Ok(())
    }
}

impl Rooms {
    /// Stores our leave `(pdu, json)`, which the room's resident server has taken, in place of
    /// our invite or knock `replaced` in a room this server is not in.
    pub async fn store_remote_leave(
        &self,
        user_id: &UserId,
        room_id: &RoomId,
        replaced: &str,
        pdu: &Pdu,
        json: &Value,
    ) -> Result<()> {
        let _room_lock = self.locks.lock(room_id).await;
        let mut conn = self.db.conn().await?;
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            lock_room(conn, room_id).await?;
            let group = store::get_state_event(conn, replaced)
                .await?
                .and_then(|row| row.state_group)
                .ok_or_else(|| Error::forbidden("You are not in this room"))?;
            store_leave_in_place(conn, room_id, user_id, group, pdu, json).await
        })
        .await?;
        crate::metrics::metrics().events_persisted("federation", 1);
        Ok(())
    }
}

/// Stores our leave on the state (group `group`) of the invite or knock it ends, in a room
/// this server is not in, and tells the user's `/sync`.
async fn store_leave_in_place(
    conn: &AsyncPgConnection,
    room_id: &RoomId,
    user_id: &UserId,
    group: i64,
    pdu: &Pdu,
    json: &Value,
) -> Result<()> {
    let room = room_id.as_str();
    let event = pdu.event_id.as_str();
    let place = state_store::get_place(conn, group).await?;
    let (after, _) = state_store::insert_state_after(
        conn,
        room,
        (group, place),
        &[("m.room.member", user_id.as_str(), event)],
    )
    .await?;
    let new_event = store::NewEvent {
        event_id: event,
        room_id: room,
        depth: pdu.depth,
        sender: user_id.as_str(),
        event_type: "m.room.member",
        state_key: Some(user_id.as_str()),
        origin_server_ts: i64::from(pdu.origin_server_ts.get()),
        pdu: json,
        state_group: after,
    };
    tokio::try_join!(
        streams::next_position(conn, streams::EVENTS),
        store::insert_event(conn, &new_event, None),
    )?;
    membership_store::set_membership(conn, room, user_id.as_str(), "leave", None, event).await?;
    store::notify(conn, notifier::USER_CHANNEL, user_id.as_str()).await?;
    Ok(())
}
