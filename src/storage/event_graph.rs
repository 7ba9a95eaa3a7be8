//! The room DAG as stored: auth chains (the closure of `auth_events`) and walks back through
//! `prev_events`, both read from the stored PDUs. Every walk stays inside one room and its
//! work is bounded: an auth chain by the room's events (each visited once), a `prev_events`
//! walk by the budget its caller gives.

use std::collections::{BinaryHeap, HashSet};

use diesel::{
    dsl::sql,
    prelude::*,
    sql_types::{Array, Bool, Text},
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::Value;

use super::{rooms::EventRow, schema::events};

/// The condition, in SQL over the unaliased `events` table, for an event this server may hand
/// to another server: stored in full, with its signed PDU, and not rejected (outliers and
/// soft-failed events are served). Every federation read takes its events through it.
pub const SERVABLE: &str = "events.pdu IS NOT NULL AND events.rejected_reason IS NULL";

/// An event that may be served ([`SERVABLE`]), whatever its room.
pub async fn get_servable_event(
    mut conn: &AsyncPgConnection,
    event_id: &str,
) -> QueryResult<Option<EventRow>> {
    events::table
        .filter(events::event_id.eq(event_id))
        .filter(sql::<Bool>(SERVABLE))
        .select(EventRow::as_select())
        .first(&mut conn)
        .await
        .optional()
}

/// An event of `room_id` that may be served ([`SERVABLE`]); `None` for an unknown event and
/// for an event of another room alike.
pub async fn get_servable_room_event(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    event_id: &str,
) -> QueryResult<Option<EventRow>> {
    events::table
        .filter(events::event_id.eq(event_id))
        .filter(events::room_id.eq(room_id))
        .filter(sql::<Bool>(SERVABLE))
        .select(EventRow::as_select())
        .first(&mut conn)
        .await
        .optional()
}

/// The events of `room_id` among `event_ids` (others skipped), each with whether it may be
/// served: walks pass through events they do not serve.
async fn get_room_events_marked(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    event_ids: &[String],
) -> QueryResult<Vec<(EventRow, bool)>> {
    if event_ids.is_empty() {
        return Ok(Vec::new());
    }
    events::table
        .filter(events::event_id.eq_any(event_ids))
        .filter(events::room_id.eq(room_id))
        .select((EventRow::as_select(), sql::<Bool>(SERVABLE)))
        .load(&mut conn)
        .await
}

/// The events of `room_id` among `event_ids` that may be served, in no particular order.
pub async fn get_servable_events(
    conn: &AsyncPgConnection,
    room_id: &str,
    event_ids: &[String],
) -> QueryResult<Vec<EventRow>> {
    Ok(get_room_events_marked(conn, room_id, event_ids)
        .await?
        .into_iter()
        .filter_map(|(row, servable)| servable.then_some(row))
        .collect())
}

/// The auth chain of `event_ids` in `room_id`: every event reachable from them through
/// `auth_events`, recursively (the given events only when reachable from another), oldest
/// first by depth. One recursive query over `pdu->'auth_events'`, confined to the room; its
/// `UNION` visits each event once, so the work is bounded by the room's events. The walk
/// passes through events that may not be served and leaves them out; an auth event that is
/// not stored ends its branch.
pub async fn auth_chain(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    event_ids: &[String],
) -> QueryResult<Vec<EventRow>> {
    if event_ids.is_empty() {
        return Ok(Vec::new());
    }
    let auth_events = pdu_id_list("e.pdu", "auth_events");
    let closure = sql::<Bool>(&format!(
        "events.event_id IN ( \
             WITH RECURSIVE chain (event_id) AS ( \
                 SELECT a.id FROM events e \
                 CROSS JOIN LATERAL jsonb_array_elements_text({auth_events}) a (id) \
                 WHERE e.room_id = "
    ))
    .bind::<Text, _>(room_id)
    .sql(" AND e.event_id = ANY(")
    .bind::<Array<Text>, _>(event_ids)
    .sql(") UNION SELECT a.id FROM chain c JOIN events e ON e.event_id = c.event_id AND e.room_id = ")
    .bind::<Text, _>(room_id)
    .sql(&format!(
        " CROSS JOIN LATERAL jsonb_array_elements_text({auth_events}) a (id) \
         ) SELECT event_id FROM chain)"
    ));
    events::table
        .filter(events::room_id.eq(room_id))
        .filter(sql::<Bool>(SERVABLE))
        .filter(closure)
        .order((events::depth, events::stream_ordering))
        .select(EventRow::as_select())
        .load(&mut conn)
        .await
}

/// SQL of a stored PDU's list of event IDs (`prev_events`, `auth_events`) as a JSON array:
/// an array of IDs in every room version served here; anything else (a malformed PDU) reads as
/// no IDs rather than failing the query.
pub fn pdu_id_list(pdu: &str, field: &str) -> String {
    format!(
        "CASE jsonb_typeof({pdu}->'{field}') \
         WHEN 'array' THEN {pdu}->'{field}' ELSE '[]'::jsonb END"
    )
}

/// The `prev_events` of a stored PDU.
pub fn prev_event_ids(pdu: &Value) -> Vec<String> {
    pdu.get("prev_events")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect()
}

/// An event reached by a walk, ordered deepest first (then the later stream position).
struct Reached(EventRow, bool);

impl Reached {
    fn key(&self) -> (i64, i64) {
        (self.0.depth, self.0.stream_ordering)
    }
}

impl PartialEq for Reached {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Reached {}

impl PartialOrd for Reached {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Reached {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key().cmp(&other.key())
    }
}

/// `/backfill`: from the events `from` of `room_id` back through `prev_events`, the events
/// taken deepest first among those reached so far (ties: the later stream position), as
/// Synapse's backfill does; that order is the reached events sorted newest first. `from`
/// itself is included. At most `limit` events are taken (one query each, for its
/// `prev_events`); a taken event that may not be served counts but is left out. Events of
/// `from` that are unknown or of another room are skipped.
pub async fn walk_back_by_depth(
    conn: &AsyncPgConnection,
    room_id: &str,
    from: &[String],
    limit: usize,
) -> QueryResult<Vec<EventRow>> {
    let mut seen: HashSet<String> = from.iter().cloned().collect();
    let mut reached: BinaryHeap<Reached> = get_room_events_marked(conn, room_id, from)
        .await?
        .into_iter()
        .map(|(row, servable)| Reached(row, servable))
        .collect();
    let mut taken = Vec::new();
    for _ in 0..limit {
        let Some(Reached(row, servable)) = reached.pop() else {
            break;
        };
        let prevs: Vec<String> = prev_event_ids(&row.pdu)
            .into_iter()
            .filter(|id| seen.insert(id.clone()))
            .collect();
        reached.extend(
            get_room_events_marked(conn, room_id, &prevs)
                .await?
                .into_iter()
                .map(|(row, servable)| Reached(row, servable)),
        );
        if servable {
            taken.push(row);
        }
    }
    Ok(taken)
}

/// `/get_missing_events`: the events before `latest` in `room_id`, breadth first back through
/// `prev_events`, never into an event of `earliest` (the asker has those) nor below
/// `min_depth`; `latest` itself is not included. At most `limit` events are returned, oldest
/// first, and at most `max_lookups` event IDs are looked up however wide the graph is (one
/// query per generation). Events that may not be served are walked through, not returned.
pub async fn walk_back_breadth_first(
    conn: &AsyncPgConnection,
    room_id: &str,
    earliest: &[String],
    latest: &[String],
    limit: usize,
    min_depth: i64,
    max_lookups: usize,
) -> QueryResult<Vec<EventRow>> {
    let mut seen: HashSet<String> = earliest.iter().cloned().collect();
    let starts: Vec<String> = latest
        .iter()
        .filter(|id| seen.insert((*id).clone()))
        .cloned()
        .collect();
    let mut lookups = starts.len();
    let mut front: Vec<EventRow> = get_room_events_marked(conn, room_id, &starts)
        .await?
        .into_iter()
        .map(|(row, _)| row)
        .collect();
    let mut found = Vec::new();
    while !front.is_empty() && found.len() < limit && lookups < max_lookups {
        let mut prevs: Vec<String> = front
            .iter()
            .flat_map(|row| prev_event_ids(&row.pdu))
            .filter(|id| seen.insert(id.clone()))
            .collect();
        prevs.truncate(max_lookups - lookups);
        lookups += prevs.len();
        let mut generation: Vec<(EventRow, bool)> = get_room_events_marked(conn, room_id, &prevs)
            .await?
            .into_iter()
            .filter(|(row, _)| row.depth >= min_depth)
            .collect();
        // When the generation overflows the limit, its newest events are the ones kept.
        generation.sort_by_key(|(row, _)| std::cmp::Reverse((row.depth, row.stream_ordering)));
        front = Vec::new();
        for (row, servable) in generation {
            if found.len() >= limit {
                break;
            }
            if servable {
                found.push(row.clone());
            }
            front.push(row);
        }
    }
    found.sort_by_key(|row| (row.depth, row.stream_ordering));
    Ok(found)
}

/// The state groups (the state after each) of the events of `room_id` among `event_ids`, as
/// `(event ID, group)`; unknown events, outliers and events of other rooms are absent.
pub async fn get_state_groups(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    event_ids: &[String],
) -> QueryResult<Vec<(String, i64)>> {
    if event_ids.is_empty() {
        return Ok(Vec::new());
    }
    events::table
        .filter(events::event_id.eq_any(event_ids))
        .filter(events::room_id.eq(room_id))
        .filter(events::state_group.is_not_null())
        .select((events::event_id, events::state_group.assume_not_null()))
        .load(&mut conn)
        .await
}
