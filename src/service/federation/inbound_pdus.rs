//! The PDUs of a `/send` transaction: each passes the checks that need no room state
//! ([`super::pdus`]) and the room's server ACL, then the room's own checks and is stored.
//!
//! A room's PDUs go in depth order (an event's prev events from the same transaction come
//! first) and are taken together, in one database transaction ([`Rooms::receive_live_batch`]):
//! a burst of 50 costs one commit, not 50. A PDU whose auth events or prev events are unknown
//! here stops the batch; it is taken alone once the missing events are fetched (the auth chain
//! with `/event_auth`; a gap with `get_missing_events`, then `/state` and backfill), and the
//! batch goes on after it.

use std::collections::BTreeMap;

use ruma::{
    api::federation::event::get_missing_events, room_version_rules::RoomVersionRules,
    CanonicalJsonObject, CanonicalJsonValue, EventId, OwnedEventId, OwnedRoomId, RoomId,
    RoomVersionId, ServerName,
};
use serde_json::{json, value::RawValue as RawJsonValue, Value};

use super::{
    pdus::{claimed_depth, CheckedPdu},
    room_access::acl_allows,
    Federation,
};
use crate::{
    error::Result,
    service::rooms::{
        incoming::{Arrival, Received},
        Rooms,
    },
    storage::{dag, rooms as rooms_store},
};

/// Most events asked for to fill one gap.
const GAP_LIMIT: u32 = 20;

/// A PDU of a transaction, parsed far enough to order and route it.
struct Incoming {
    room_id: OwnedRoomId,
    depth: i64,
    object: CanonicalJsonObject,
}

/// The PDUs of one room that passed checks 1 to 3, in depth order.
struct RoomRun {
    room_id: OwnedRoomId,
    version: RoomVersionId,
    rules: RoomVersionRules,
    pdus: Vec<CheckedPdu>,
}

/// What the transaction's PDUs need to know of their room.
enum RoomFacts {
    Unknown,
    AclDenies(RoomVersionRules),
    Known(RoomVersionId, RoomVersionRules),
}

impl Federation {
    /// Takes the PDUs of a transaction and answers the `/send` result for them, keyed by event
    /// ID: `{}` for an event taken (or known already), an error for one dropped, rejected or
    /// not taken. A PDU whose ID cannot be computed gets no entry.
    pub(super) async fn receive_pdus(
        &self,
        rooms: &Rooms,
        origin: &ServerName,
        pdus: &[Box<RawJsonValue>],
    ) -> Result<Value> {
        let mut answers = BTreeMap::new();
        let mut incoming = Vec::new();
        for pdu in pdus {
            let Ok(object) = serde_json::from_str::<CanonicalJsonObject>(pdu.get()) else {
                continue;
            };
            let room_id = match object.get("room_id") {
                Some(CanonicalJsonValue::String(room_id)) => RoomId::parse(room_id).ok(),
                _ => None,
            };
            let depth = claimed_depth(&object);
            match room_id {
                Some(room_id) => incoming.push(Incoming {
                    room_id,
                    depth,
                    object,
                }),
                None => {
                    if let Some(event_id) = fallback_event_id(&object) {
                        answers.insert(event_id, json!({ "error": "Unknown room" }));
                    }
                }
            }
        }
        incoming.sort_by(|a, b| (&a.room_id, a.depth).cmp(&(&b.room_id, b.depth)));

        // Checks 1 to 3 and the ACL, PDU by PDU (they may fetch keys from other servers).
        let mut runs: Vec<RoomRun> = Vec::new();
        let mut facts: Option<(OwnedRoomId, RoomFacts)> = None;
        for Incoming {
            room_id, object, ..
        } in incoming
        {
            if facts.as_ref().is_none_or(|(known, _)| *known != room_id) {
                facts = Some((room_id.clone(), self.room_facts(&room_id, origin).await?));
            }
            let (version, rules) = match &facts {
                Some((_, RoomFacts::Known(version, rules))) => (version, rules),
                Some((_, RoomFacts::AclDenies(rules))) => {
                    if let Some(event_id) = event_id_under(&object, rules) {
                        answers.insert(
                            event_id,
                            json!({ "error": "The room's server ACL denies this server" }),
                        );
                    }
                    continue;
                }
                _ => {
                    if let Some(event_id) = fallback_event_id(&object) {
                        answers.insert(event_id, json!({ "error": "Unknown room" }));
                    }
                    continue;
                }
            };
            let event_id = event_id_under(&object, rules);
            match self.check_pdu(rules, object).await? {
                Ok(checked) => match runs.last_mut() {
                    Some(run) if run.room_id == room_id => run.pdus.push(checked),
                    _ => runs.push(RoomRun {
                        room_id,
                        version: version.clone(),
                        rules: rules.clone(),
                        pdus: vec![checked],
                    }),
                },
                Err(dropped) => {
                    if let Some(event_id) = event_id {
                        answers.insert(event_id, json!({ "error": format!("Dropped: {dropped}") }));
                    }
                }
            }
        }

        for run in runs {
            self.receive_run(rooms, origin, run, &mut answers).await?;
        }
        Ok(json!({ "pdus": answers }))
    }

    /// The room's version and whether its server ACL lets `origin` in.
    async fn room_facts(&self, room_id: &RoomId, origin: &ServerName) -> Result<RoomFacts> {
        // A connection given back before the checks: they may wait on other servers (keys,
        // missing events), and the room's own step takes its own.
        let conn = self.db.conn().await?;
        let (room, acl) = tokio::try_join!(
            rooms_store::get_room(&conn, room_id.as_str()),
            rooms_store::get_current_state_event(&conn, room_id.as_str(), "m.room.server_acl", ""),
        )?;
        drop(conn);
        let version =
            room.and_then(|room| RoomVersionId::try_from(room.room_version.as_str()).ok());
        let Some((version, rules)) =
            version.and_then(|version| Some((version.clone(), version.rules()?)))
        else {
            return Ok(RoomFacts::Unknown);
        };
        if acl.is_some_and(|acl| !acl_allows(&acl.pdu["content"], origin)) {
            return Ok(RoomFacts::AclDenies(rules));
        }
        Ok(RoomFacts::Known(version, rules))
    }

    /// Takes one room's checked PDUs in batches, each PDU that needs events fetched first on
    /// its own, and writes the answer for each.
    async fn receive_run(
        &self,
        rooms: &Rooms,
        origin: &ServerName,
        run: RoomRun,
        answers: &mut BTreeMap<String, Value>,
    ) -> Result<()> {
        let RoomRun {
            room_id,
            version,
            rules,
            pdus,
        } = run;
        let mut rest = &pdus[..];
        while !rest.is_empty() {
            let outcomes = rooms.receive_live_batch(&room_id, &rules, rest).await?;
            let tried = outcomes.len().max(1);
            for (checked, received) in rest.iter().zip(outcomes) {
                let received = match received {
                    Received::MissingAuthEvents | Received::MissingPrevEvents => {
                        self.receive_after_fetching(
                            rooms, origin, &room_id, &rules, &version, checked, received,
                        )
                        .await?
                    }
                    taken => taken,
                };
                answers.insert(checked.event_id.to_string(), answer_for(received));
            }
            rest = &rest[tried..];
        }
        Ok(())
    }

    /// Takes a PDU that could not be taken for want of its auth events or prev events, after
    /// fetching them from `origin`.
    #[allow(clippy::too_many_arguments)]
    async fn receive_after_fetching(
        &self,
        rooms: &Rooms,
        origin: &ServerName,
        room_id: &RoomId,
        rules: &RoomVersionRules,
        version: &RoomVersionId,
        checked: &CheckedPdu,
        mut received: Received,
    ) -> Result<Received> {
        if received == Received::MissingAuthEvents
            && self
                .fetch_auth_chain(rooms, origin, room_id, rules, version, checked)
                .await?
        {
            received = rooms.receive_pdu(room_id, rules, checked.clone()).await?;
        }
        if received == Received::MissingPrevEvents {
            self.fill_gap(rooms, origin, room_id, rules, &checked.event_id)
                .await?;
            received = rooms.receive_pdu(room_id, rules, checked.clone()).await?;
        }
        if received != Received::MissingPrevEvents {
            return Ok(received);
        }
        // A gap wider than get_missing_events fills: the state before the event, as the
        // sender gives it, stands in for its prev events.
        let Some(state) = self
            .fetch_state_before(rooms, origin, room_id, rules, version, checked)
            .await?
        else {
            return Ok(received);
        };
        let arrival = Arrival {
            backfilled: false,
            state_before: Some(&state),
        };
        let prev_events = checked.prev_events();
        let received = rooms
            .receive(room_id, rules, checked.clone(), arrival)
            .await?;
        if received == Received::Accepted {
            // What the gap held is history now: backfilled, never news.
            self.backfill_from(rooms, room_id, &prev_events, &[origin.to_owned()])
                .await?;
        }
        Ok(received)
    }

    /// Asks `origin` for the events between the room's forward extremities here and `latest`
    /// (`get_missing_events`, at most [`GAP_LIMIT`]) and takes them oldest first, each through
    /// every check. What cannot be had is left: the event that needed it is then not taken.
    async fn fill_gap(
        &self,
        rooms: &Rooms,
        origin: &ServerName,
        room_id: &RoomId,
        rules: &RoomVersionRules,
        latest: &EventId,
    ) -> Result<()> {
        let conn = self.db.conn().await?;
        let extremities = dag::get_forward_extremities(&conn, room_id.as_str()).await?;
        drop(conn);
        let earliest: Vec<OwnedEventId> = extremities
            .into_iter()
            .filter_map(|(id, _)| OwnedEventId::try_from(id).ok())
            .collect();
        let mut request = get_missing_events::v1::Request::new(
            room_id.to_owned(),
            earliest,
            vec![latest.to_owned()],
        );
        request.limit = GAP_LIMIT.into();
        let events = match self.client.send(origin, request).await {
            Ok(response) => response.events,
            Err(problem) => {
                tracing::info!(%origin, %room_id, %problem, "get_missing_events failed");
                return Ok(());
            }
        };
        let mut missing: Vec<(i64, CanonicalJsonObject)> = events
            .iter()
            .filter_map(|raw| serde_json::from_str::<CanonicalJsonObject>(raw.get()).ok())
            .filter(|object| {
                matches!(object.get("room_id"), Some(CanonicalJsonValue::String(r)) if r == room_id.as_str())
            })
            .map(|object| (claimed_depth(&object), object))
            .collect();
        missing.sort_by_key(|(depth, _)| *depth);
        for (_, object) in missing.into_iter().take(GAP_LIMIT as usize) {
            if let Ok(checked) = self.check_pdu(rules, object).await? {
                let received = rooms.receive_pdu(room_id, rules, checked).await?;
                tracing::debug!(%room_id, ?received, "event of a gap");
            }
        }
        Ok(())
    }
}

/// The `/send` answer for one PDU.
fn answer_for(received: Received) -> Value {
    match received {
        Received::Accepted | Received::AlreadyKnown | Received::SoftFailed => json!({}),
        Received::Rejected(reason) => json!({ "error": format!("Rejected: {reason}") }),
        Received::NotTaken(reason) => json!({ "error": reason }),
        Received::MissingAuthEvents => json!({
            "error": "Some of its auth events are unknown here and the sender did not give them"
        }),
        Received::MissingPrevEvents => json!({
            "error": "Some of its prev_events are unknown here and the sender did not fill the gap"
        }),
    }
}

/// The event ID of a PDU of a room we do not know: its `event_id` in room versions 1 and 2,
/// otherwise its reference hash as room version 11 computes it (12 for a create event
/// without `room_id`; their redaction rules agree with older versions for ordinary events).
fn fallback_event_id(object: &CanonicalJsonObject) -> Option<String> {
    if let Some(CanonicalJsonValue::String(id)) = object.get("event_id") {
        return Some(id.clone());
    }
    let version = match object.get("room_id") {
        Some(CanonicalJsonValue::String(_)) => RoomVersionId::V11,
        _ => RoomVersionId::V12,
    };
    let rules = version.rules()?;
    event_id_under(object, &rules)
}

/// A PDU's event ID under its room's rules (the reference hash).
fn event_id_under(object: &CanonicalJsonObject, rules: &RoomVersionRules) -> Option<String> {
    ruma::signatures::reference_hash(object, rules)
        .ok()
        .map(|hash| format!("${hash}"))
}
