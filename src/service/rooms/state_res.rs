//! State resolution: one room state from the states of several forks of the room's DAG, with
//! the algorithm of the room's version as ruma implements it: v2 for rooms 10 and 11, v2.1
//! (MSC4297) for 12. Never v2.1 for an older room: servers that disagree on the algorithm
//! disagree on the state (FEDERATION.md §1.2).
//!
//! Used for the state before an event with several `prev_events` and for a room's current
//! state over several forward extremities.

use std::collections::{HashMap, HashSet};

use diesel_async::AsyncPgConnection;
use ruma::{
    events::StateEventType,
    room_version_rules::{RoomVersionRules, StateResolutionVersion},
    state_res::{utils::event_id_set::EventIdSet, StateMap},
    EventId, OwnedEventId,
};

use super::pdu::Pdu;
use crate::{
    error::{Error, Result},
    storage::{event_graph, rooms as rooms_store, state::StateIds},
};

/// The resolution of `states` (each a full state map of `room_id`).
pub async fn resolve(
    conn: &AsyncPgConnection,
    rules: &RoomVersionRules,
    room_id: &str,
    states: &[StateIds],
) -> Result<StateIds> {
    let Some((first, rest)) = states.split_first() else {
        return Ok(StateIds::new());
    };
    if rest.iter().all(|state| state == first) {
        return Ok(first.clone());
    }
    let StateResolutionVersion::V2(state_res_rules) = &rules.state_res else {
        return Err(Error::internal("state resolution v1 is not supported"));
    };
    let maps: Vec<StateMap<OwnedEventId>> = states
        .iter()
        .map(|state| {
            state
                .iter()
                .filter_map(|((kind, key), id)| {
                    Some((
                        (StateEventType::from(kind.as_str()), key.clone()),
                        EventId::parse(id).ok()?,
                    ))
                })
                .collect()
        })
        .collect();
    let graph = AuthGraph::load(conn, room_id, states).await?;
    let auth_chains: Vec<EventIdSet<OwnedEventId>> = maps
        .iter()
        .map(|map| graph.auth_chain(map.values()))
        .collect();
    let resolved = ruma::state_res::resolve(
        &rules.authorization,
        state_res_rules,
        &maps,
        auth_chains,
        |id: &EventId| graph.events.get(id).cloned(),
        |conflicted: &StateMap<Vec<OwnedEventId>>| {
            Some(graph.conflicted_subgraph(conflicted.values().flatten()))
        },
    )
    .map_err(|e| Error::internal(format!("state resolution failed: {e}")))?;
    Ok(resolved
        .into_iter()
        .map(|((kind, key), id)| ((kind.to_string(), key), id.to_string()))
        .collect())
}

/// The events of some states and their full auth chains, loaded at once: ruma's resolution
/// reads events synchronously.
struct AuthGraph {
    events: HashMap<OwnedEventId, Pdu>,
}

impl AuthGraph {
    async fn load(conn: &AsyncPgConnection, room_id: &str, states: &[StateIds]) -> Result<Self> {
        let ids: Vec<String> = states
            .iter()
            .flat_map(|state| state.values().cloned())
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        let (roots, chain) = tokio::try_join!(
            rooms_store::get_state_events(conn, &ids),
            event_graph::auth_chain(conn, room_id, &ids),
        )?;
        let mut events = HashMap::new();
        for row in roots.into_iter().chain(chain) {
            let pdu = Pdu::from_json(&row.event_id, &row.pdu)?;
            events.insert(pdu.event_id.clone(), pdu);
        }
        Ok(AuthGraph { events })
    }

    /// Everything `roots` reach through `auth_events`, without the roots themselves unless
    /// another root reaches them.
    fn auth_chain<'a>(
        &self,
        roots: impl IntoIterator<Item = &'a OwnedEventId>,
    ) -> EventIdSet<OwnedEventId> {
        let mut chain = EventIdSet::new();
        let mut stack: Vec<&OwnedEventId> = roots
            .into_iter()
            .filter_map(|id| self.events.get(id))
            .flat_map(|pdu| pdu.auth_events.iter())
            .collect();
        while let Some(id) = stack.pop() {
            if chain.insert(id.clone()) {
                if let Some(pdu) = self.events.get(id) {
                    stack.extend(pdu.auth_events.iter());
                }
            }
        }
        chain
    }

    /// The conflicted state subgraph of state resolution v2.1: the events on some
    /// `auth_events` path from one conflicted event to another, the conflicted events
    /// included.
    fn conflicted_subgraph<'a>(
        &self,
        conflicted: impl IntoIterator<Item = &'a OwnedEventId>,
    ) -> EventIdSet<OwnedEventId> {
        let conflicted: HashSet<&EventId> = conflicted.into_iter().map(|id| &**id).collect();
        // Whether an event reaches a conflicted event through its auth events (itself
        // included), memoised; the auth DAG has no cycles.
        let mut reaches: HashMap<&EventId, bool> = HashMap::new();
        let mut subgraph = EventIdSet::new();
        for start in &conflicted {
            // Every event the conflicted event reaches, and it, depth first.
            let mut stack: Vec<(&EventId, bool)> = vec![(start, false)];
            while let Some((id, children_done)) = stack.pop() {
                if reaches.contains_key(id) && !children_done {
                    continue;
                }
                let auth_events: &[OwnedEventId] = self
                    .events
                    .get(id)
                    .map_or(&[], |pdu| pdu.auth_events.as_slice());
                if children_done {
                    let found = conflicted.contains(id)
                        || auth_events
                            .iter()
                            .any(|a| reaches.get(&**a).copied().unwrap_or(false));
                    reaches.insert(id, found);
                    continue;
                }
                stack.push((id, true));
                for auth in auth_events {
                    if !reaches.contains_key(&**auth) {
                        stack.push((auth, false));
                    }
                }
            }
        }
        // Reached from a conflicted event (every key of `reaches` is) and reaching one.
        for (id, found) in reaches {
            if found {
                subgraph.insert(id.to_owned());
            }
        }
        subgraph
    }
}
