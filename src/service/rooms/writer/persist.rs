//! The last step of an append: the built event's statements, sent together in one pipeline
//! (its row and stream position, relation, push actions, extremities, client transaction,
//! state, a redaction's target, and the notifications sent once the transaction commits).

use ruma::{RoomId, UserId};

use super::{Built, NewEvent, RoomWriter};
use crate::{
    error::Result,
    service::rooms::{
        deferred::DeferredPositions, members::record_member_event, push_actions::Audience,
    },
    storage::{
        dag, now_ms,
        push::{self as push_store, NewPushActions},
        relations as relations_store, rooms as store, streams,
    },
};

impl RoomWriter<'_> {
    /// Writes the event at its stream position (taken here, or the next provisional one of a
    /// multi-event transaction) with all it changes: its relation, push actions, the room's
    /// extremities, the client transaction, the state, a redaction's target, and the
    /// notifications sent once the transaction commits. The statements go out together, so readers are held
    /// below the position only from this one round trip to the commit. Returns the position.
    pub(super) async fn write(
        &self,
        event: &NewEvent<'_>,
        room_id: &RoomId,
        built: &Built,
        group: i64,
        relation: Option<relations_store::RelationRow>,
        audience: Option<&Audience>,
    ) -> Result<i64> {
        let conn = self.conn;
        let event_id = built.event_id.as_str();
        let new_event = store::NewEvent {
            event_id,
            room_id: room_id.as_str(),
            depth: built.depth,
            sender: event.sender.as_str(),
            event_type: event.kind,
            state_key: event.state_key,
            origin_server_ts: built.origin_server_ts,
            pdu: &built.json,
            state_group: group,
        };
        let member_target = event.state_key.filter(|_| event.kind == "m.room.member");
        let for_other_servers = self.is_for_other_servers(audience, member_target);
        let prev_ids: Vec<&str> = built.prev_events.iter().map(|id| id.as_str()).collect();
        let provisional = self.deferred.map(DeferredPositions::take);
        let mut push_actions = match audience {
            Some(audience) => audience.rows_for(room_id, event_id, &built.json).await,
            None => NewPushActions::default(),
        };
        if let Some(position) = provisional {
            push_actions.set_position(position);
        }
        let (stream_ordering, ..) = tokio::try_join!(
            async {
                match provisional {
                    Some(position) => Ok(position),
                    None => streams::next_position(conn, streams::EVENTS).await,
                }
            },
            store::insert_event(conn, &new_event, provisional),
            async {
                match &relation {
                    Some(relation) => {
                        relations_store::insert_relation(conn, relation, provisional).await
                    }
                    None => Ok(()),
                }
            },
            push_store::insert_new_push_actions(conn, &push_actions, provisional.is_some()),
            dag::update_forward_extremities(
                conn,
                room_id.as_str(),
                event_id,
                &prev_ids,
                built.depth
            ),
            async {
                match event.txn {
                    Some((device_id, txn_id)) => {
                        store::insert_txn(
                            conn,
                            event.sender.as_str(),
                            device_id,
                            txn_id,
                            event_id,
                            now_ms(),
                        )
                        .await
                    }
                    None => Ok(()),
                }
            },
            async {
                match event.state_key {
                    Some(state_key) => {
                        self.apply_state(room_id, event, state_key, event_id, group)
                            .await
                    }
                    None => Ok(()),
                }
            },
            async {
                match &built.redaction {
                    Some(target) => {
                        let redacts = target.event_id.as_str();
                        tokio::try_join!(
                            store::set_redacted(conn, redacts, event_id, &target.pruned_pdu),
                            push_store::delete_for_event(conn, redacts),
                            relations_store::delete_relation(conn, redacts),
                        )
                        .map(drop)
                    }
                    None => Ok(()),
                }
            },
            store::notify(
                conn,
                crate::service::notifier::ROOM_CHANNEL,
                room_id.as_str()
            ),
            async {
                match for_other_servers {
                    true => {
                        let channel = crate::service::notifier::FEDERATION_CHANNEL;
                        store::notify(conn, channel, room_id.as_str()).await
                    }
                    false => Ok(()),
                }
            },
            async {
                match member_target {
                    // The target may not be in the room any more (kick, ban, rejected invite).
                    Some(target) => {
                        store::notify(conn, crate::service::notifier::USER_CHANNEL, target).await
                    }
                    None => Ok(()),
                }
            },
        )?;
        Ok(stream_ordering)
    }

    /// Whether a new event may go to other servers, so the federation sender is woken at
    /// commit to queue it at once: a user of another server is joined (as the `audience` read
    /// the room) or is the member event's target, or the audience does not know. The sender
    /// passes over other events on its tick; a room's create event (no audience: nobody else
    /// can be in the room yet) never leaves.
    fn is_for_other_servers(
        &self,
        audience: Option<&Audience>,
        member_target: Option<&str>,
    ) -> bool {
        let Some(audience) = audience else {
            return false;
        };
        let target_elsewhere = member_target
            .and_then(|target| UserId::parse(target).ok())
            .is_some_and(|target| target.server_name() != self.server_name);
        target_elsewhere || audience.other_servers_joined() != Some(false)
    }

    /// Moves the room's current state (and, for a membership event, the member's membership)
    /// to include a new state event. The statements go out together, after the event's row in
    /// the same pipeline (the membership takes its position from that row).
    async fn apply_state(
        &self,
        room_id: &RoomId,
        event: &NewEvent<'_>,
        state_key: &str,
        event_id: &str,
        group: i64,
    ) -> diesel::QueryResult<()> {
        let conn = self.conn;
        let room = room_id.as_str();
        tokio::try_join!(
            store::set_current_state(conn, room, event.kind, state_key, event_id),
            store::set_current_state_group(conn, room, group),
            async {
                match event.kind == "m.room.member" {
                    true => {
                        let server_name = self.server_name;
                        record_member_event(
                            conn,
                            server_name,
                            room,
                            state_key,
                            &event.content,
                            event_id,
                        )
                        .await
                    }
                    false => Ok(()),
                }
            },
        )
        .map(drop)
    }
}
