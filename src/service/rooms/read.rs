//! Reading rooms: state, members, single events, context, and timestamps.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use diesel_async::AsyncPgConnection;
use ruma::{room_version_rules::RoomVersionRules, OwnedRoomId, RoomId, UserId};
use serde_json::{json, value::RawValue, Value};

use super::{
    pdu::{client_event, client_event_from_parts, omit_room_ids, RoomIdField},
    state_parts::KeptEvent,
    versions::rules_for,
    visibility::Visibility,
    Rooms,
};
use crate::{
    error::{Error, Result},
    service::sync::token::{pagination, Pagination},
    storage::{
        client_events::{self, ClientEventParts},
        dag::{self, HistoryPosition},
        memberships as membership_store, now_ms,
        rooms::{self as store, EventRow},
        state as state_store, summaries as summaries_store, timelines,
    },
};

/// Which state of a room a reader may see.
enum View {
    /// The current state (joined, or the room is world-readable).
    Current,
    /// The state when the reader left (or was kicked or banned).
    AtGroup(i64),
}

/// A sync section's state before it is rendered: events kept in memory, and parts read.
#[derive(Default)]
pub struct SectionState {
    pub kept: Vec<Arc<KeptEvent>>,
    pub read: Vec<ClientEventParts>,
}

/// `/context` result.
pub struct Context {
    /// Events before the target, newest first.
    pub before: Vec<Value>,
    /// The target event.
    pub event: Value,
    /// Events after the target, oldest first.
    pub after: Vec<Value>,
    /// State at the last returned event.
    pub state: Vec<Value>,
    /// Pagination token at the start.
    pub start: String,
    /// Pagination token at the end.
    pub end: String,
}

impl Rooms {
    /// Rooms the user is joined to.
    pub async fn joined_rooms(&self, user_id: &UserId) -> Result<Vec<OwnedRoomId>> {
        let conn = self.db.conn().await?;
        let rooms = membership_store::get_rooms_for_user(&conn, user_id.as_str(), "join").await?;
        rooms
            .into_iter()
            .map(|r| RoomId::parse(r).map_err(Error::internal))
            .collect()
    }

    pub(super) async fn room_rules(
        &self,
        conn: &AsyncPgConnection,
        room_id: &RoomId,
    ) -> Result<(RoomVersionRules, i64)> {
        let room = store::get_room(conn, room_id.as_str())
            .await?
            .ok_or_else(|| Error::forbidden("You are not in this room"))?;
        Ok((rules_for(&room.room_version)?, room.current_state_group))
    }

    /// A room's version rules, `None` for a room this server does not have. A room's version
    /// never changes, so each process reads it once (a sync needs it for every room).
    pub(crate) async fn version_rules(
        &self,
        conn: &AsyncPgConnection,
        room_id: &str,
    ) -> Result<Option<RoomVersionRules>> {
        let cached = self
            .versions
            .lock()
            .expect("not poisoned")
            .get(room_id)
            .cloned();
        let version = match cached {
            Some(version) => version,
            None => {
                let Some(room) = store::get_room(conn, room_id).await? else {
                    return Ok(None);
                };
                let mut versions = self.versions.lock().expect("not poisoned");
                versions.put(room_id.to_owned(), room.room_version.clone());
                room.room_version
            }
        };
        rules_for(&version).map(Some)
    }

    /// The version rules of the room of a stored event, looked up once per room for a list of
    /// events from many rooms.
    pub(super) async fn cached_rules<'a>(
        &self,
        conn: &AsyncPgConnection,
        cache: &'a mut HashMap<String, RoomVersionRules>,
        room_id: &str,
    ) -> Result<&'a RoomVersionRules> {
        if !cache.contains_key(room_id) {
            let room = store::get_room(conn, room_id)
                .await?
                .ok_or_else(|| Error::internal("an event of an unknown room"))?;
            cache.insert(room_id.to_owned(), rules_for(&room.room_version)?);
        }
        Ok(&cache[room_id])
    }

    /// Renders stored events for clients, with redactions applied.
    pub(crate) async fn render(
        &self,
        conn: &AsyncPgConnection,
        rules: &RoomVersionRules,
        rows: &[EventRow],
    ) -> Result<Vec<Value>> {
        let now = now_ms();
        let redaction_ids: Vec<String> =
            rows.iter().filter_map(|r| r.redacted_by.clone()).collect();
        let redactions: BTreeMap<String, EventRow> = store::get_events(conn, &redaction_ids)
            .await?
            .into_iter()
            .map(|r| (r.event_id.clone(), r))
            .collect();
        Ok(rows
            .iter()
            .map(|row| {
                let redaction = row
                    .redacted_by
                    .as_ref()
                    .and_then(|id| redactions.get(id))
                    .map(|r| client_event(&r.event_id, &r.room_id, &r.pdu, rules, None, now));
                client_event(&row.event_id, &row.room_id, &row.pdu, rules, redaction, now)
            })
            .collect())
    }

    /// Renders state events read as their client parts, in the order given, each as JSON text:
    /// most straight from their parts, redacted ones (and redactions) through [`Self::render`].
    pub(crate) async fn render_parts(
        &self,
        conn: &AsyncPgConnection,
        rules: &RoomVersionRules,
        parts: Vec<ClientEventParts>,
        room_id_field: RoomIdField,
    ) -> Result<Vec<Box<RawValue>>> {
        let rendered = self
            .render_parts_in_place(conn, rules, parts, room_id_field)
            .await?;
        Ok(rendered.into_iter().flatten().collect())
    }

    /// [`Self::render_parts`], each in the place of its parts: `None` for an event purged
    /// between the reads.
    async fn render_parts_in_place(
        &self,
        conn: &AsyncPgConnection,
        rules: &RoomVersionRules,
        parts: Vec<ClientEventParts>,
        room_id_field: RoomIdField,
    ) -> Result<Vec<Option<Box<RawValue>>>> {
        let now = now_ms();
        let mut rendered = Vec::with_capacity(parts.len());
        // (index in `rendered`, event ID) of the events that need their whole PDU.
        let mut whole = Vec::new();
        for part in parts {
            let event_id = part.event_id.clone();
            match client_event_from_parts(part, now, room_id_field)? {
                Some(event) => rendered.push(Some(event)),
                None => {
                    whole.push((rendered.len(), event_id));
                    rendered.push(None);
                }
            }
        }
        if whole.is_empty() {
            return Ok(rendered);
        }
        let ids: Vec<String> = whole.iter().map(|(_, id)| id.clone()).collect();
        let rows = store::get_state_events(conn, &ids).await?;
        let mut events = self.render(conn, rules, &rows).await?;
        if room_id_field == RoomIdField::Omitted {
            events.iter_mut().for_each(omit_room_ids);
        }
        let by_id: HashMap<&str, &Value> = rows
            .iter()
            .map(|r| r.event_id.as_str())
            .zip(events.iter())
            .collect();
        // One purged between the two reads is left out, as if read a moment later.
        for (index, event_id) in whole {
            if let Some(event) = by_id.get(event_id.as_str()) {
                rendered[index] =
                    Some(serde_json::value::to_raw_value(event).map_err(Error::internal)?);
            }
        }
        Ok(rendered)
    }

    /// The state of group `group` of `room_id` for a sync section, in no order.
    pub(crate) async fn state_of_group(
        &self,
        conn: &AsyncPgConnection,
        room_id: &str,
        group: i64,
    ) -> Result<SectionState> {
        if let Some((events, kept_at)) = self.state_parts.find_group(group) {
            if store::get_redaction_count(conn, room_id).await? == Some(kept_at) {
                return Ok(SectionState {
                    kept: events.to_vec(),
                    read: Vec::new(),
                });
            }
            // Redacted since: kept again below unless a redacted event is in its state now.
            self.state_parts.forget_group(group);
        }
        let state = state_store::get_counted_state_ids(conn, group).await?;
        let room_redactions = state.room_redactions;
        let state = self
            .section_states(conn, vec![(room_id, state)])
            .await?
            .pop()
            .unwrap_or_default();
        // Kept whole only when every event is kept: redacted ones are read each time.
        if state.read.is_empty() {
            self.state_parts
                .keep_group(group, &state.kept, room_redactions);
        }
        Ok(state)
    }

    /// The state of each `(room, group)` for a lazy-loading sync's sections, in no order
    /// within each, with only the member events of `members` (one list per room); their event
    /// IDs are one statement, and the events not kept in memory one more.
    pub(crate) async fn member_states_of_groups(
        &self,
        conn: &AsyncPgConnection,
        groups: &[(&str, i64)],
        members: &[&[String]],
    ) -> Result<Vec<SectionState>> {
        let ids: Vec<i64> = groups.iter().map(|(_, group)| *group).collect();
        let states =
            state_store::get_counted_member_state_ids_of_groups(conn, &ids, members).await?;
        let rooms = groups.iter().map(|(room_id, _)| *room_id).zip(states);
        self.section_states(conn, rooms.collect()).await
    }

    /// Rooms' state events for sync sections, by room: those kept in memory serve when their
    /// room had no redaction since they were read; the others are read (one statement for
    /// all) and kept, and served as kept (rendered once), but for those never kept.
    async fn section_states(
        &self,
        conn: &AsyncPgConnection,
        states: Vec<(&str, state_store::CountedStateIds)>,
    ) -> Result<Vec<SectionState>> {
        let found: Vec<_> = states
            .into_iter()
            .map(|(room_id, state)| {
                let found = self
                    .state_parts
                    .find(state.event_ids, state.room_redactions);
                (room_id, found)
            })
            .collect();
        let missing: Vec<String> = found
            .iter()
            .flat_map(|(_, found)| found.missing.iter().cloned())
            .collect();
        let mut read = client_events::get_counted_state_event_parts(conn, &missing).await?;
        Ok(found
            .into_iter()
            .map(|(room_id, found)| {
                let mut kept = found.kept;
                let (newly_kept, not_kept) = match read.remove(room_id) {
                    Some((parts, room_redactions)) => self.state_parts.keep(parts, room_redactions),
                    None => Default::default(),
                };
                kept.extend(newly_kept);
                SectionState {
                    kept,
                    read: not_kept,
                }
            })
            .collect())
    }

    /// A sync section's state as JSON texts (without `room_id`), in stream order.
    pub(crate) async fn render_section_state(
        &self,
        conn: &AsyncPgConnection,
        rules: &RoomVersionRules,
        state: SectionState,
    ) -> Result<Vec<Box<RawValue>>> {
        let now = now_ms();
        let mut ordered = state
            .kept
            .iter()
            .map(|event| Ok((event.stream_ordering, event.render(now)?)))
            .collect::<Result<Vec<_>>>()?;
        let orderings: Vec<i64> = state.read.iter().map(|p| p.stream_ordering).collect();
        let read = self
            .render_parts_in_place(conn, rules, state.read, RoomIdField::Omitted)
            .await?;
        ordered.extend(
            orderings
                .into_iter()
                .zip(read)
                .filter_map(|(ordering, event)| Some((ordering, event?))),
        );
        ordered.sort_by_key(|(ordering, _)| *ordering);
        Ok(ordered.into_iter().map(|(_, event)| event).collect())
    }

    /// What the user may see of the room's state; `M_FORBIDDEN` when nothing.
    async fn view(
        &self,
        conn: &AsyncPgConnection,
        user_id: &UserId,
        room_id: &RoomId,
        current_group: i64,
    ) -> Result<View> {
        match membership_store::get_membership(conn, room_id.as_str(), user_id.as_str()).await? {
            Some((m, _)) if m == "join" => return Ok(View::Current),
            // A room the user has forgotten is one they were never in.
            Some((m, event_id)) if m == "leave" || m == "ban" => {
                let forgotten =
                    membership_store::is_forgotten(conn, room_id.as_str(), user_id.as_str())
                        .await?;
                let event = store::get_state_event(conn, &event_id).await?;
                // An out-of-band membership (an outlier) has no state to show.
                if let Some(group) = event.and_then(|e| e.state_group).filter(|_| !forgotten) {
                    return Ok(View::AtGroup(group));
                }
            }
            _ => {}
        }
        let state = state_store::get_state_ids(conn, current_group).await?;
        if let Some(id) = state.get(&("m.room.history_visibility".to_owned(), String::new())) {
            let visible = store::get_state_event(conn, id)
                .await?
                .and_then(|e| e.pdu.pointer("/content/history_visibility").cloned());
            if visible == Some(json!("world_readable")) {
                return Ok(View::Current);
            }
        }
        Err(Error::forbidden("You are not in this room"))
    }

    /// The state the user may see, at a point in history when given (never later than what
    /// their membership allows), as its map of IDs.
    async fn visible_state_ids(
        &self,
        conn: &AsyncPgConnection,
        user_id: &UserId,
        room_id: &RoomId,
        at: Option<Pagination>,
    ) -> Result<(RoomVersionRules, state_store::StateIds)> {
        let (rules, current_group) = self.room_rules(conn, room_id).await?;
        // A point in topological order is the position of the event at it.
        let at = match at {
            Some(Pagination::Topological(point)) => Some(
                dag::get_stream_at_position(conn, room_id.as_str(), point)
                    .await?
                    .unwrap_or(0),
            ),
            Some(Pagination::Stream(stream)) => Some(stream),
            None => None,
        };
        let group = match self.view(conn, user_id, room_id, current_group).await? {
            View::AtGroup(group) if at.is_none() => group,
            View::Current if at.is_none() => current_group,
            view => {
                let limit = match view {
                    View::AtGroup(_) => membership_store::get_membership_position(
                        conn,
                        room_id.as_str(),
                        user_id.as_str(),
                    )
                    .await?
                    .map_or(0, |(_, position)| position),
                    View::Current => i64::MAX,
                };
                let position = at.unwrap_or(i64::MAX).min(limit);
                // Before the room's first event there is no state; never fall forward to a
                // later state than the view allows.
                let bound = match view {
                    View::AtGroup(group) => group,
                    View::Current => current_group,
                };
                timelines::get_state_group_at(conn, room_id.as_str(), position)
                    .await?
                    .unwrap_or(bound)
            }
        };
        Ok((rules, state_store::get_state_ids(conn, group).await?))
    }

    /// The room state the user may see (`GET /rooms/{id}/state`), in stream order.
    pub async fn room_state(
        &self,
        user_id: &UserId,
        room_id: &RoomId,
    ) -> Result<Vec<Box<RawValue>>> {
        let conn = self.db.conn().await?;
        let (rules, state) = self
            .visible_state_ids(&conn, user_id, room_id, None)
            .await?;
        let ids: Vec<String> = state.into_values().collect();
        let mut parts = client_events::get_state_event_parts(&conn, &ids).await?;
        parts.sort_by_key(|p| p.stream_ordering);
        self.render_parts(&conn, &rules, parts, RoomIdField::Carried)
            .await
    }

    /// The room's whole current state as clients see events, with no membership check (for
    /// the admin API); `M_NOT_FOUND` for an unknown room.
    pub async fn current_state_unchecked(&self, room_id: &RoomId) -> Result<Vec<Value>> {
        let conn = self.db.conn().await?;
        let room = store::get_room(&conn, room_id.as_str())
            .await?
            .ok_or_else(|| Error::not_found("Room not found"))?;
        let ids: Vec<String> = state_store::get_state_ids(&conn, room.current_state_group)
            .await?
            .into_values()
            .collect();
        let mut rows = store::get_state_events(&conn, &ids).await?;
        rows.sort_by_key(|r| r.stream_ordering);
        self.render(&conn, &rules_for(&room.room_version)?, &rows)
            .await
    }

    /// One state event (`GET /rooms/{id}/state/{type}/{key}`); `M_NOT_FOUND` when unset.
    pub async fn room_state_event(
        &self,
        user_id: &UserId,
        room_id: &RoomId,
        kind: &str,
        state_key: &str,
    ) -> Result<Value> {
        let conn = self.db.conn().await?;
        let (rules, state) = self
            .visible_state_ids(&conn, user_id, room_id, None)
            .await?;
        let event_id = state
            .get(&(kind.to_owned(), state_key.to_owned()))
            .ok_or_else(|| Error::not_found("Event not found"))?;
        let rows = store::get_state_events(&conn, std::slice::from_ref(event_id)).await?;
        self.render(&conn, &rules, &rows)
            .await?
            .pop()
            .ok_or_else(|| Error::not_found("Event not found"))
    }

    /// Member events (`GET /rooms/{id}/members`), filtered by membership.
    pub async fn members(
        &self,
        user_id: &UserId,
        room_id: &RoomId,
        membership: Option<&str>,
        not_membership: Option<&str>,
        at: Option<Pagination>,
    ) -> Result<Vec<Box<RawValue>>> {
        let conn = self.db.conn().await?;
        let (rules, state) = self.visible_state_ids(&conn, user_id, room_id, at).await?;
        let ids: Vec<String> = state
            .into_iter()
            .filter(|((kind, _), _)| kind == "m.room.member")
            .map(|(_, id)| id)
            .collect();
        let mut members = client_events::get_state_event_parts(&conn, &ids).await?;
        members.retain(|event| {
            let m = event.membership.as_deref().unwrap_or_default();
            membership.is_none_or(|want| want == m) && not_membership.is_none_or(|skip| skip != m)
        });
        members.sort_by_key(|p| p.stream_ordering);
        self.render_parts(&conn, &rules, members, RoomIdField::Carried)
            .await
    }

    /// Joined members with their profiles (`GET /rooms/{id}/joined_members`), for members only:
    /// not for peekers of world-readable rooms (as Synapse).
    pub async fn joined_members(
        &self,
        user_id: &UserId,
        room_id: &RoomId,
    ) -> Result<Vec<summaries_store::JoinedProfile>> {
        let conn = self.db.conn().await?;
        // An unknown room has no members: the same answer.
        let membership =
            membership_store::get_membership(&conn, room_id.as_str(), user_id.as_str()).await?;
        if membership.is_none_or(|(m, _)| m != "join") {
            return Err(Error::forbidden("You are not in this room"));
        }
        Ok(summaries_store::get_joined_profiles(&conn, room_id.as_str()).await?)
    }

    /// One event the user may see (`GET /rooms/{id}/event/{eventId}`); `M_NOT_FOUND` otherwise.
    pub async fn event(&self, user_id: &UserId, room_id: &RoomId, event_id: &str) -> Result<Value> {
        let conn = self.db.conn().await?;
        let (rules, row) = self
            .visible_event(&conn, user_id, room_id, event_id)
            .await?;
        Ok(self
            .render_with_relations(&conn, &rules, user_id, &[row])
            .await?
            .remove(0))
    }

    pub(super) async fn visible_event(
        &self,
        conn: &AsyncPgConnection,
        user_id: &UserId,
        room_id: &RoomId,
        event_id: &str,
    ) -> Result<(RoomVersionRules, EventRow)> {
        let not_found = || Error::not_found("Event not found");
        let row = store::get_event(conn, event_id)
            .await?
            .filter(|r| r.room_id == room_id.as_str())
            .ok_or_else(not_found)?;
        if !Visibility::new(user_id).can_see(conn, &row).await? {
            return Err(not_found());
        }
        let (rules, _) = self.room_rules(conn, room_id).await?;
        Ok((rules, row))
    }

    /// Events around one event (`GET /rooms/{id}/context/{eventId}`), visibility-checked.
    pub async fn context(
        &self,
        user_id: &UserId,
        room_id: &RoomId,
        event_id: &str,
        limit: i64,
        filter: &crate::service::sync::EventFilter,
    ) -> Result<Context> {
        let conn = self.db.conn().await?;
        let (rules, target) = self
            .visible_event(&conn, user_id, room_id, event_id)
            .await?;
        // Seeing one event (a knocker or invitee sees their own member event) is not seeing
        // the room's state: that takes the view `/state` gives.
        let (_, current_group) = self.room_rules(&conn, room_id).await?;
        let state_visible = self
            .view(&conn, user_id, room_id, current_group)
            .await
            .is_ok();
        let before_limit = limit / 2;
        let after_limit = limit - before_limit;
        let mut visibility = Visibility::new(user_id);
        let (before, after) = events_around(
            &conn,
            &mut visibility,
            &target,
            (before_limit, after_limit),
            filter,
        )
        .await?;
        // Pagination tokens sit between events: `start` just before the earliest one returned.
        let start = HistoryPosition::before(before.last().unwrap_or(&target));
        let last = after.last().unwrap_or(&target);
        let end = HistoryPosition::at(last);
        let state_ids: Vec<String> = match (state_visible, last.state_group) {
            (true, Some(group)) => state_store::get_state_ids(&conn, group)
                .await?
                .into_values()
                .collect(),
            _ => Vec::new(),
        };
        let mut state_rows = store::get_state_events(&conn, &state_ids).await?;
        state_rows.sort_by_key(|r| r.stream_ordering);
        Ok(Context {
            before: self
                .render_with_relations(&conn, &rules, user_id, &before)
                .await?,
            event: self
                .render_with_relations(&conn, &rules, user_id, std::slice::from_ref(&target))
                .await?
                .remove(0),
            after: self
                .render_with_relations(&conn, &rules, user_id, &after)
                .await?,
            state: self.render(&conn, &rules, &state_rows).await?,
            start: pagination(start),
            end: pagination(end),
        })
    }

    /// The visible event closest to a timestamp in one direction (`/timestamp_to_event`):
    /// events the user may not see are skipped. At most [`TIMESTAMP_SCAN_LIMIT`] events are
    /// looked at; "none found" is one 404 whether or not the room has invisible events there.
    pub async fn event_near_timestamp(
        &self,
        user_id: &UserId,
        room_id: &RoomId,
        ts: i64,
        forward: bool,
    ) -> Result<(String, i64)> {
        const PAGE: i64 = 100;
        let conn = self.db.conn().await?;
        let mut visibility = Visibility::new(user_id);
        let mut after = None;
        for _ in 0..TIMESTAMP_SCAN_LIMIT / PAGE {
            let rows =
                timelines::get_events_near_ts(&conn, room_id.as_str(), ts, forward, after, PAGE)
                    .await?;
            for row in &rows {
                if visibility.can_see(&conn, row).await? {
                    let origin_ts = row.pdu["origin_server_ts"].as_i64().unwrap_or_default();
                    return Ok((row.event_id.clone(), origin_ts));
                }
            }
            let Some(last) = rows.last().filter(|_| rows.len() as i64 == PAGE) else {
                break;
            };
            let last_ts = last.pdu["origin_server_ts"].as_i64().unwrap_or_default();
            after = Some((last_ts, last.stream_ordering));
        }
        Err(Error::not_found("No event found near that time"))
    }
}

/// How many events `/timestamp_to_event` looks at for one the user may see.
pub const TIMESTAMP_SCAN_LIMIT: i64 = 1000;

/// The visible events just before (newest first) and just after (oldest first) an event of
/// its room in topological order, that the filter lets through.
pub(super) async fn events_around(
    conn: &AsyncPgConnection,
    visibility: &mut Visibility<'_>,
    target: &EventRow,
    (before_limit, after_limit): (i64, i64),
    filter: &crate::service::sync::EventFilter,
) -> Result<(Vec<EventRow>, Vec<EventRow>)> {
    let room_id = target.room_id.as_str();
    let mut before = Vec::new();
    if before_limit > 0 {
        let up_to = HistoryPosition::before(target);
        for row in dag::get_room_history(
            conn,
            room_id,
            HistoryPosition::START,
            up_to,
            true,
            before_limit,
        )
        .await?
        {
            if filter.allows_row(&row) && visibility.can_see(conn, &row).await? {
                before.push(row);
            }
        }
    }
    let mut after = Vec::new();
    if after_limit > 0 {
        for row in dag::get_room_history(
            conn,
            room_id,
            HistoryPosition::at(target),
            HistoryPosition::END,
            false,
            after_limit,
        )
        .await?
        {
            if filter.allows_row(&row) && visibility.can_see(conn, &row).await? {
                after.push(row);
            }
        }
    }
    Ok((before, after))
}
