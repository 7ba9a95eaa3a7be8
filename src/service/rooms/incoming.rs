//! Events from other servers into rooms this server is in: the spec's checks 4 to 6 on a PDU
//! that passed checks 1 to 3 ([`crate::service::federation::pdus`]), then persisting it.
//!
//! - Check 4, the auth rules against the event's own `auth_events`, and check 5, against the
//!   state before the event (resolved over its `prev_events`): failing either rejects it. A
//!   rejected event is stored (so it is not fetched and judged again) but never served to
//!   clients or other servers, never an extremity and never in any state.
//! - Check 6, against the room's current state: failing it soft-fails the event (a ban
//!   evader's message built on the state before the ban). It is stored and may be served to
//!   servers, but never reaches clients and never becomes a forward extremity.
//! - An event whose auth events or `prev_events` are not all stored is not taken (nothing is
//!   stored); the caller asks the sender for the auth chain (`/event_auth`) or for the gap
//!   (`get_missing_events`, then `/state`) and tries again.
//!
//! An accepted event takes a stream position like a local one, replaces its `prev_events` among
//! the forward extremities, and the room's current state becomes the resolution of the states
//! at the extremities. Everything happens under the room's locks, in one transaction, through
//! the same storage as local events (push actions for unread counts, relations, memberships).

use std::collections::{HashMap, HashSet};

use diesel_async::AsyncPgConnection;
use ruma::{
    events::{StateEventType, TimelineEventType},
    room_version_rules::RoomVersionRules,
    state_res::{
        auth_types_for_event, check_state_dependent_auth_rules, check_state_independent_auth_rules,
    },
    EventId, OwnedEventId, RoomId, UserId,
};
use serde_json::Value;

use super::{
    members::record_member_event,
    pdu::Pdu,
    push_actions::{silent_by_default, Audience},
    state_res,
    writer::{common_auth_keys, RoomWriter},
    Rooms,
};
use crate::{
    error::{Error, Result},
    service::{federation::pdus::CheckedPdu, notifier},
    storage::{
        dag, event_graph,
        push::{self as push_store, NewPushActions},
        relations as relations_store, rooms as store,
        state::{self as state_store, StateIds},
        streams,
    },
};

/// What became of a PDU from another server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    /// Stored and part of the room.
    Accepted,
    /// Stored, but it fails the current state: never shown to clients.
    SoftFailed,
    /// Stored as rejected, for this reason.
    Rejected(String),
    /// Known already (nothing changed).
    AlreadyKnown,
    /// Not taken (nothing stored), for this reason: it may be sent again.
    NotTaken(String),
    /// Not taken: some of its `prev_events` are unknown here (a gap to fill first).
    MissingPrevEvents,
    /// Not taken: some of its auth events are unknown here (or rejected).
    MissingAuthEvents,
}

impl Received {
    /// Whether the event went into the room's events (soft-failed ones too; rejected ones are
    /// kept apart).
    fn is_persisted(&self) -> bool {
        matches!(self, Received::Accepted | Received::SoftFailed)
    }
}

/// Counts the events a committed transaction took from other servers.
fn count_persisted<'a>(answers: impl IntoIterator<Item = &'a Received>) {
    let persisted = answers.into_iter().filter(|r| r.is_persisted()).count();
    crate::metrics::metrics().events_persisted("federation", persisted as u64);
}

/// How a PDU reached us.
#[derive(Debug, Clone, Copy)]
pub struct Arrival<'a> {
    /// Older history we asked for (`/backfill`): placed in history only, never new to anyone,
    /// never moving the room's current state, raising no unread counts.
    pub backfilled: bool,
    /// The state before the event when its `prev_events` are beyond what we hold, as a server
    /// in the room gave it (its events checked and stored already).
    pub state_before: Option<&'a StateIds>,
}

impl Arrival<'_> {
    /// Sent to us as new, its `prev_events` ours.
    pub const LIVE: Arrival<'static> = Arrival {
        backfilled: false,
        state_before: None,
    };
}

/// A PDU being taken, and how.
struct Arrived<'a> {
    pdu: &'a Pdu,
    json: &'a Value,
    arrival: Arrival<'a>,
    /// Stored already as an outlier: it only takes its place in history.
    placing: bool,
}

/// A checked PDU as the room's code reads it, and as stored.
fn parse_checked(checked: &CheckedPdu) -> Result<(Pdu, Value)> {
    let json = serde_json::to_value(&checked.pdu).map_err(Error::internal)?;
    let pdu = Pdu::from_json(checked.event_id.as_str(), &json)?;
    Ok((pdu, json))
}

/// The room's current state, and whether the event fails it (check 6).
struct Current {
    ids: StateIds,
    soft_failed: bool,
}

/// The state before an event: its entries, and the stored group holding exactly them, if any.
struct StateBefore {
    ids: StateIds,
    group: Option<i64>,
}

impl Rooms {
    /// Takes a checked PDU (checks 1 to 3 passed) of a room this server knows, sent to us as
    /// new.
    pub async fn receive_pdu(
        &self,
        room_id: &RoomId,
        rules: &RoomVersionRules,
        checked: CheckedPdu,
    ) -> Result<Received> {
        self.receive(room_id, rules, checked, Arrival::LIVE).await
    }

    /// Takes a checked PDU (checks 1 to 3 passed) as [`Arrival`] says it came.
    pub async fn receive(
        &self,
        room_id: &RoomId,
        rules: &RoomVersionRules,
        checked: CheckedPdu,
        arrival: Arrival<'_>,
    ) -> Result<Received> {
        let (pdu, json) = parse_checked(&checked)?;
        if !pdu.is_in_room(room_id, rules) {
            return Ok(Received::NotTaken("The event is not in this room".into()));
        }
        let _room_lock = self.locks.lock(room_id).await;
        let mut conn = self.db.conn().await?;
        let received = crate::storage::transaction::transaction(&mut conn, async |conn| {
            // The room's advisory lock (and that the room exists) first.
            RoomWriter::open(conn, &self.keys, &self.config.server_name, room_id, &[]).await?;
            self.receive_locked(conn, room_id, rules, &pdu, &json, arrival)
                .await
        })
        .await?;
        count_persisted([&received]);
        Ok(received)
    }

    /// Takes checked PDUs of one room sent to us as new, in the order given, under one hold of
    /// the room's locks and in one database transaction: a sender's burst costs one commit
    /// per transaction, not one per event. Stops after the first PDU that cannot be taken
    /// before its auth or prev events are fetched, which the caller handles on its own; the
    /// answers are for the PDUs tried, in order.
    pub async fn receive_live_batch(
        &self,
        room_id: &RoomId,
        rules: &RoomVersionRules,
        batch: &[CheckedPdu],
    ) -> Result<Vec<Received>> {
        let parsed = batch
            .iter()
            .map(parse_checked)
            .collect::<Result<Vec<_>>>()?;
        let _room_lock = self.locks.lock(room_id).await;
        let mut conn = self.db.conn().await?;
        let answers = crate::storage::transaction::transaction(&mut conn, async |conn| {
            RoomWriter::open(conn, &self.keys, &self.config.server_name, room_id, &[]).await?;
            let mut answers = Vec::with_capacity(parsed.len());
            for (pdu, json) in &parsed {
                let received = match pdu.is_in_room(room_id, rules) {
                    true => {
                        self.receive_locked(conn, room_id, rules, pdu, json, Arrival::LIVE)
                            .await?
                    }
                    false => Received::NotTaken("The event is not in this room".into()),
                };
                let must_fetch = matches!(
                    received,
                    Received::MissingAuthEvents | Received::MissingPrevEvents
                );
                answers.push(received);
                if must_fetch {
                    break;
                }
            }
            Ok(answers)
        })
        .await?;
        count_persisted(&answers);
        Ok(answers)
    }

    /// [`Self::receive`]'s work inside the transaction, the room's locks held.
    async fn receive_locked(
        &self,
        conn: &AsyncPgConnection,
        room_id: &RoomId,
        rules: &RoomVersionRules,
        pdu: &Pdu,
        json: &Value,
        arrival: Arrival<'_>,
    ) -> Result<Received> {
        let event_id = pdu.event_id.as_str();
        // An outlier (an auth or state event fetched on its own) found again in older
        // history takes its place there.
        let placing = arrival.backfilled && dag::is_placeable_outlier(conn, event_id).await?;
        if !placing && dag::event_exists(conn, event_id).await? {
            return Ok(Received::AlreadyKnown);
        }
        let arrived = Arrived {
            pdu,
            json,
            arrival,
            placing,
        };
        self.receive_in(conn, room_id, rules, &arrived).await
    }

    async fn receive_in(
        &self,
        conn: &AsyncPgConnection,
        room_id: &RoomId,
        rules: &RoomVersionRules,
        arrived: &Arrived<'_>,
    ) -> Result<Received> {
        let pdu = arrived.pdu;
        let room = room_id.as_str();
        // Check 4: the event's own auth events, all stored and none rejected.
        let auth_ids: Vec<String> = pdu.auth_events.iter().map(|id| id.to_string()).collect();
        // Since v12 the create event is never an auth event, but the rules read it: its ID
        // is the room ID's.
        let create_id = rules
            .authorization
            .room_create_event_id_as_room_id
            .then(|| format!("${}", &room[1..]));
        let mut wanted = auth_ids.clone();
        wanted.extend(create_id.clone());
        let loaded = load_pdus(conn, &wanted).await?;
        let auth_events: Vec<Pdu> = loaded
            .iter()
            .filter(|p| auth_ids.iter().any(|id| id == p.event_id.as_str()))
            .cloned()
            .collect();
        if auth_events.len() < auth_ids.len() {
            return Ok(Received::MissingAuthEvents);
        }
        let by_id: HashMap<OwnedEventId, Pdu> = loaded
            .iter()
            .map(|p| (p.event_id.clone(), p.clone()))
            .collect();
        if let Err(reason) =
            check_state_independent_auth_rules(&rules.authorization, pdu, |id: &EventId| {
                by_id.get(id).cloned()
            })
        {
            return self
                .store_rejected(conn, room, arrived, None, reason.to_string())
                .await;
        }
        // The create event's rules apply to every event: in v12 it joins the event's own
        // auth events for this check.
        let mut own_auth = auth_events.clone();
        own_auth.extend(
            loaded
                .iter()
                .filter(|p| create_id.as_deref() == Some(p.event_id.as_str()))
                .cloned(),
        );
        let by_key = keyed(&own_auth);
        if let Err(reason) = check_against(rules, pdu, &by_key) {
            return self.store_rejected(conn, room, arrived, None, reason).await;
        }

        // Check 5: the state before the event, from its prev events.
        let prev_ids: Vec<String> = pdu.prev_events.iter().map(|id| id.to_string()).collect();
        let prev_groups = event_graph::get_state_groups(conn, room, &prev_ids).await?;
        let before = match (
            prev_groups.len() < prev_ids.len(),
            arrived.arrival.state_before,
        ) {
            (false, _) => state_before(conn, rules, room, &prev_groups).await?,
            // Its prev events are beyond what we hold: the state before it, as a server in
            // the room gave it (every event in it checked and stored), is all there is.
            (true, Some(ids)) => StateBefore {
                ids: ids.clone(),
                group: None,
            },
            (true, None) => return Ok(Received::MissingPrevEvents),
        };
        let needed = auth_keys(rules, pdu)?;
        let at_before = load_state_pdus(conn, &before.ids, &needed).await?;
        if let Err(reason) = check_against(rules, pdu, &at_before) {
            return self
                .store_rejected(conn, room, arrived, Some(before), reason)
                .await;
        }

        if arrived.arrival.backfilled {
            // Old history is not judged by today's state (Synapse does not soft-fail it
            // either): the ban it predates would hide what the room really said.
            return self
                .persist(conn, room_id, rules, arrived, before, None)
                .await;
        }
        // Check 6: the current state.
        let current_ids: StateIds = store::get_current_state_ids(conn, room)
            .await?
            .into_iter()
            .map(|(kind, key, id)| ((kind, key), id))
            .collect();
        let at_current = load_state_pdus(conn, &current_ids, &needed).await?;
        let soft_failed = check_against(rules, pdu, &at_current).is_err();
        let current = Current {
            ids: current_ids,
            soft_failed,
        };
        self.persist(conn, room_id, rules, arrived, before, Some(current))
            .await
    }

    /// Stores an event that passed checks 4 and 5: a live one with the outcome of check 6
    /// against the room's current state, a backfilled one (`current` is `None`) in history
    /// only.
    async fn persist(
        &self,
        conn: &AsyncPgConnection,
        room_id: &RoomId,
        rules: &RoomVersionRules,
        arrived: &Arrived<'_>,
        before: StateBefore,
        current: Option<Current>,
    ) -> Result<Received> {
        let (pdu, json) = (arrived.pdu, arrived.json);
        let soft_failed = current.as_ref().is_some_and(|c| c.soft_failed);
        let room = room_id.as_str();
        let event_id = pdu.event_id.as_str();
        let kind = pdu.kind.to_string();
        // The state after the event.
        let mut after_ids = before.ids.clone();
        let after_group = match &pdu.state_key {
            Some(key) => {
                after_ids.insert((kind.clone(), key.clone()), event_id.to_owned());
                let delta = [(kind.as_str(), key.as_str(), event_id)];
                store_group(conn, room, before.group, &after_ids, &delta).await?
            }
            None => match before.group {
                Some(group) => group,
                None => store_group(conn, room, None, &after_ids, &[]).await?,
            },
        };
        let content = pdu.content_value();
        // Old history raises no unread counts and no notifications.
        let audience = match soft_failed || current.is_none() {
            true => None,
            false => Some(
                Audience::load(
                    conn,
                    &self.config.server_name,
                    rules,
                    room_id,
                    pdu.sender.as_str(),
                    silent_by_default(&kind, &content),
                )
                .await?,
            ),
        };
        let push_actions = match &audience {
            Some(audience) => audience.rows_for(room_id, event_id, json).await,
            None => NewPushActions::default(),
        };
        // A malformed relation from another server is not a reason to refuse its event: it is
        // just not indexed as one.
        let relation = match soft_failed {
            true => None,
            false => super::relations::check(
                conn,
                room_id,
                &pdu.sender,
                &kind,
                pdu.state_key.as_deref(),
                &content,
            )
            .await
            .ok()
            .flatten()
            .map(|mut relation| {
                relation.event_id = event_id.to_owned();
                relation
            }),
        };
        let new_event = store::NewEvent {
            event_id,
            room_id: room,
            depth: pdu.depth,
            sender: pdu.sender.as_str(),
            event_type: &kind,
            state_key: pdu.state_key.as_deref(),
            origin_server_ts: i64::from(pdu.origin_server_ts.get()),
            pdu: json,
            state_group: after_group,
        };
        let prev_ids: Vec<&str> = pdu.prev_events.iter().map(|id| id.as_str()).collect();
        let insert_relation = async {
            match &relation {
                Some(relation) => relations_store::insert_relation(conn, relation, None).await,
                None => Ok(()),
            }
        };
        let Some(current) = current else {
            // Backfilled: a position below every token (or the one it has as an outlier).
            if arrived.placing {
                tokio::try_join!(
                    dag::place_outlier(conn, event_id, after_group),
                    insert_relation
                )?;
            } else {
                let position = dag::next_backfill_position(conn).await?;
                tokio::try_join!(
                    store::insert_event(conn, &new_event, Some(position)),
                    insert_relation,
                )?;
            }
            if pdu.kind == TimelineEventType::RoomRedaction {
                self.apply_remote_redaction(conn, rules, room, pdu).await?;
            }
            return Ok(Received::Accepted);
        };
        // The position, then the rows written at it, in one pipeline.
        tokio::try_join!(
            streams::next_position(conn, streams::EVENTS),
            store::insert_event(conn, &new_event, None),
            dag::set_soft_failed(conn, event_id, soft_failed),
            push_store::insert_new_push_actions(conn, &push_actions, false),
            insert_relation,
        )?;
        if soft_failed {
            return Ok(Received::SoftFailed);
        }
        dag::update_forward_extremities(conn, room, event_id, &prev_ids, pdu.depth).await?;
        self.move_current_state(
            conn,
            room,
            rules,
            event_id,
            &after_ids,
            after_group,
            current.ids,
        )
        .await?;
        if pdu.kind == TimelineEventType::RoomRedaction {
            self.apply_remote_redaction(conn, rules, room, pdu).await?;
        }
        store::notify(conn, notifier::ROOM_CHANNEL, room).await?;
        if let (TimelineEventType::RoomMember, Some(target)) = (&pdu.kind, &pdu.state_key) {
            store::notify(conn, notifier::USER_CHANNEL, target).await?;
        }
        Ok(Received::Accepted)
    }

    /// Makes the room's current state the resolution of the states at its forward extremities
    /// (just the new event's state when it is the only one), writing what changed.
    #[allow(clippy::too_many_arguments)]
    async fn move_current_state(
        &self,
        conn: &AsyncPgConnection,
        room: &str,
        rules: &RoomVersionRules,
        event_id: &str,
        after_ids: &StateIds,
        after_group: i64,
        current: StateIds,
    ) -> Result<()> {
        let extremities = dag::get_forward_extremities(conn, room).await?;
        let (resolved, group) = if extremities.len() == 1 && extremities[0].0 == event_id {
            (after_ids.clone(), after_group)
        } else {
            let ids: Vec<String> = extremities.into_iter().map(|(id, _)| id).collect();
            let groups = event_graph::get_state_groups(conn, room, &ids).await?;
            let mut states = Vec::with_capacity(groups.len());
            for (_, group) in &groups {
                states.push(state_store::get_state_ids(conn, *group).await?);
            }
            let resolved = state_res::resolve(conn, rules, room, &states).await?;
            let group = store_group(conn, room, None, &resolved, &[]).await?;
            (resolved, group)
        };
        let changed: Vec<(&(String, String), &String)> = resolved
            .iter()
            .filter(|(key, id)| current.get(*key) != Some(*id))
            .collect();
        let changed_ids: Vec<String> = changed.iter().map(|(_, id)| (*id).clone()).collect();
        let changed_events: HashMap<String, Pdu> = load_pdus(conn, &changed_ids)
            .await?
            .into_iter()
            .map(|p| (p.event_id.to_string(), p))
            .collect();
        store::set_current_state_group(conn, room, group).await?;
        for ((kind, key), id) in changed {
            store::set_current_state(conn, room, kind, key, id).await?;
            if kind != "m.room.member" {
                continue;
            }
            let content = changed_events
                .get(id)
                .map(Pdu::content_value)
                .unwrap_or_default();
            record_member_event(conn, &self.config.server_name, room, key, &content, id).await?;
        }
        Ok(())
    }

    /// Applies a redaction from another server when the spec lets it take effect: the
    /// redacted event is in the room and was sent from the same server, or the redaction's
    /// sender has the room's `redact` power (a creator of a room whose version privileges
    /// creators has every power, listed in the power levels or not).
    async fn apply_remote_redaction(
        &self,
        conn: &AsyncPgConnection,
        rules: &RoomVersionRules,
        room: &str,
        pdu: &Pdu,
    ) -> Result<()> {
        let Some(target) = &pdu.redacts else {
            return Ok(());
        };
        let Some(row) = store::get_event(conn, target.as_str())
            .await?
            .filter(|row| row.room_id == room)
        else {
            return Ok(());
        };
        let same_server = UserId::parse(row.sender.as_str())
            .is_ok_and(|sender| sender.server_name() == pdu.sender.server_name());
        if !same_server {
            let state = store::get_current_state_events(
                conn,
                room,
                &[("m.room.power_levels", ""), ("m.room.create", "")],
            )
            .await?;
            let content_of = |kind: &str| {
                state
                    .iter()
                    .find(|row| row.event_type == kind)
                    .map(|row| row.pdu["content"].clone())
                    .unwrap_or_default()
            };
            let creator = rules.authorization.explicitly_privilege_room_creators
                && state.iter().any(|row| {
                    row.event_type == "m.room.create"
                        && super::power::is_room_creator(
                            &row.sender,
                            &content_of("m.room.create"),
                            &pdu.sender,
                        )
                });
            let levels = content_of("m.room.power_levels");
            let needed = levels.get("redact").and_then(Value::as_i64).unwrap_or(50);
            if !creator && super::power::listed_power_level(&levels, &pdu.sender) < needed {
                return Ok(());
            }
        }
        let pruned = super::pdu::prune(&row.pdu, rules);
        tokio::try_join!(
            store::set_redacted(conn, target.as_str(), pdu.event_id.as_str(), &pruned),
            push_store::delete_for_event(conn, target.as_str()),
            relations_store::delete_relation(conn, target.as_str()),
        )?;
        Ok(())
    }

    /// Stores a rejected event: with the state before it when known (a state group is what a
    /// stored, non-outlier event has), as an outlier otherwise.
    async fn store_rejected(
        &self,
        conn: &AsyncPgConnection,
        room: &str,
        arrived: &Arrived<'_>,
        before: Option<StateBefore>,
        reason: String,
    ) -> Result<Received> {
        let (pdu, json) = (arrived.pdu, arrived.json);
        tracing::info!(event_id = %pdu.event_id, %reason, "event from another server rejected");
        if arrived.placing {
            // An outlier stays one: its place in history is not where it belongs.
            return Ok(Received::Rejected(reason));
        }
        let group = match before {
            Some(StateBefore {
                group: Some(group), ..
            }) => Some(group),
            Some(StateBefore { ids, group: None }) => {
                Some(store_group(conn, room, None, &ids, &[]).await?)
            }
            None => None,
        };
        let kind = pdu.kind.to_string();
        let rejected = dag::RejectedEvent {
            event_id: pdu.event_id.as_str(),
            room_id: room,
            depth: pdu.depth,
            sender: pdu.sender.as_str(),
            event_type: &kind,
            state_key: pdu.state_key.as_deref(),
            origin_server_ts: i64::from(pdu.origin_server_ts.get()),
            pdu: json,
            state_group: group,
            reason: &reason,
        };
        dag::insert_rejected_event(conn, &rejected).await?;
        Ok(Received::Rejected(reason))
    }
}

/// The state before an event whose prev events have these state groups: the one group when
/// they agree, otherwise the resolution of their states.
async fn state_before(
    conn: &AsyncPgConnection,
    rules: &RoomVersionRules,
    room: &str,
    prev_groups: &[(String, i64)],
) -> Result<StateBefore> {
    let groups: Vec<i64> = prev_groups
        .iter()
        .map(|(_, group)| *group)
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    if let [group] = groups.as_slice() {
        return Ok(StateBefore {
            ids: state_store::get_state_ids(conn, *group).await?,
            group: Some(*group),
        });
    }
    let mut states = Vec::with_capacity(groups.len());
    for group in groups {
        states.push(state_store::get_state_ids(conn, group).await?);
    }
    Ok(StateBefore {
        ids: state_res::resolve(conn, rules, room, &states).await?,
        group: None,
    })
}

/// Stores a state group for `full`: `delta` on `parent`, or with no parent a snapshot.
async fn store_group(
    conn: &AsyncPgConnection,
    room: &str,
    parent: Option<i64>,
    full: &StateIds,
    delta: &[(&str, &str, &str)],
) -> Result<i64> {
    if let Some(parent) = parent {
        let place = state_store::get_place(conn, parent).await?;
        return Ok(
            state_store::insert_state_after(conn, room, (parent, place), delta)
                .await?
                .0,
        );
    }
    let entries: Vec<(&str, &str, &str)> = full
        .iter()
        .map(|((kind, key), id)| (kind.as_str(), key.as_str(), id.as_str()))
        .collect();
    Ok(
        state_store::insert_state_snapshot(conn, room, None, &entries)
            .await?
            .0,
    )
}

/// The `(type, state_key)` pairs the auth rules may read for `pdu`.
fn auth_keys(rules: &RoomVersionRules, pdu: &Pdu) -> Result<Vec<(String, String)>> {
    let types = auth_types_for_event(
        &pdu.kind,
        &pdu.sender,
        pdu.state_key.as_deref(),
        &pdu.content,
        &rules.authorization,
    )
    .map_err(|e| Error::bad_json(format!("Invalid event content: {e}")))?;
    let mut keys: Vec<(String, String)> = types
        .into_iter()
        .map(|(kind, key)| (kind.to_string(), key))
        .collect();
    for (kind, key) in common_auth_keys(pdu.sender.as_str(), None) {
        keys.push((kind.to_owned(), key.to_owned()));
    }
    Ok(keys)
}

/// The events of `state` at `keys`, keyed by `(type, state_key)`.
async fn load_state_pdus(
    conn: &AsyncPgConnection,
    state: &StateIds,
    keys: &[(String, String)],
) -> Result<HashMap<(String, String), Pdu>> {
    let ids: Vec<String> = keys.iter().filter_map(|k| state.get(k).cloned()).collect();
    Ok(keyed(&load_pdus(conn, &ids).await?))
}

/// Stored, unrejected events by ID (outliers included), parsed.
async fn load_pdus(conn: &AsyncPgConnection, ids: &[String]) -> Result<Vec<Pdu>> {
    store::get_state_events(conn, ids)
        .await?
        .iter()
        .map(|row| Pdu::from_json(&row.event_id, &row.pdu))
        .collect()
}

/// State events keyed by `(type, state_key)`.
fn keyed(pdus: &[Pdu]) -> HashMap<(String, String), Pdu> {
    pdus.iter()
        .filter_map(|p| Some(((p.kind.to_string(), p.state_key.clone()?), p.clone())))
        .collect()
}

/// The state-dependent auth rules for `pdu` against `state`.
fn check_against(
    rules: &RoomVersionRules,
    pdu: &Pdu,
    state: &HashMap<(String, String), Pdu>,
) -> std::result::Result<(), String> {
    check_state_dependent_auth_rules(
        &rules.authorization,
        pdu,
        |kind: &StateEventType, key: &str| state.get(&(kind.to_string(), key.to_owned())).cloned(),
    )
    .map_err(|reason| reason.to_string())
}
