//! The rooms' sections of a `/sync` response: each batch of rooms built together, a room's
//! timeline and its state up to the timeline's start, the facts read for every joined room at
//! once (unread counts, summaries) and the section's shape.

use std::{
    collections::{HashMap, HashSet},
    future::Future,
    sync::Arc,
};

use diesel_async::AsyncPgConnection;
use ruma::room_version_rules::RoomVersionRules;
use serde::Serialize;
use serde_json::{json, value::RawValue, Map, Value};

use super::{
    filter::{keep_fields, SyncFilter},
    newest::{read_newest, set_transaction_ids, TimelineExtras},
    to_raw_value, token, JobKind, Range, RoomJob, Section, Sync, SyncRequest, HEROES,
};
use crate::{
    error::{Error, Result},
    service::rooms::{pdu::omit_room_ids, read::SectionState, visibility::Visibility, Rooms},
    storage::{
        client_events,
        memberships::MembershipSummary,
        push::UnreadCounts,
        rooms::{self as store, EventRow},
        state as state_store, timelines,
    },
};

/// A room's state after the last event at or before `position`.
pub(super) async fn state_at(
    conn: &AsyncPgConnection,
    room_id: &str,
    position: i64,
) -> Result<state_store::StateIds> {
    state_with_members_at(conn, room_id, (position, None), None).await
}

/// The state group after the last served event at or before a position, when not already
/// known (`(position, known group)`).
pub(super) async fn group_at(
    conn: &AsyncPgConnection,
    room_id: &str,
    (position, known): (i64, Option<i64>),
) -> Result<Option<i64>> {
    Ok(match known {
        Some(group) => Some(group),
        None => timelines::get_state_group_at(conn, room_id, position).await?,
    })
}

/// [`state_at`] a position whose group may be known, with only `members`' member entries
/// when given (lazy-loaded members).
async fn state_with_members_at(
    conn: &AsyncPgConnection,
    room_id: &str,
    at: (i64, Option<i64>),
    members: Option<&[String]>,
) -> Result<state_store::StateIds> {
    let Some(group) = group_at(conn, room_id, at).await? else {
        return Ok(state_store::StateIds::new());
    };
    Ok(match members {
        Some(members) => state_store::get_state_ids_with_members(conn, group, members).await?,
        None => state_store::get_state_ids(conn, group).await?,
    })
}

/// The IDs of a room section's state up to the timeline's `start` (a position and, when known,
/// its group): all of it for a full section, what changed since the token for a limited one,
/// nothing otherwise.
pub(super) async fn section_state_ids(
    conn: &AsyncPgConnection,
    room_id: &str,
    range: &Range,
    limited: bool,
    start: (i64, Option<i64>),
    members: Option<&[String]>,
) -> Result<Vec<String>> {
    Ok(match range.since {
        None => state_with_members_at(conn, room_id, start, members)
            .await?
            .into_values()
            .collect(),
        Some(_) if !limited => Vec::new(),
        Some(since) => {
            let (before, after) = tokio::try_join!(
                state_with_members_at(conn, room_id, (since, None), members),
                state_with_members_at(conn, room_id, start, members),
            )?;
            after
                .into_iter()
                .filter(|(key, id)| before.get(key) != Some(id))
                .map(|(_, id)| id)
                .collect()
        }
    })
}

/// What the joined rooms' sections need that is read for all of them at once, by room.
pub(super) struct JoinedFacts {
    /// Unread counts (per thread).
    pub(super) counts: HashMap<String, Vec<UnreadCounts>>,
    /// Member counts and first members by membership, of the rooms whose summary is sent.
    summaries: HashMap<String, Vec<MembershipSummary>>,
}

impl JoinedFacts {
    pub(super) fn new(counts: Vec<UnreadCounts>, summaries: Vec<MembershipSummary>) -> Self {
        let mut facts = JoinedFacts {
            counts: HashMap::new(),
            summaries: HashMap::new(),
        };
        for count in counts {
            facts
                .counts
                .entry(count.room_id.clone())
                .or_default()
                .push(count);
        }
        for summary in summaries {
            facts
                .summaries
                .entry(summary.room_id.clone())
                .or_default()
                .push(summary);
        }
        facts
    }

    /// A room's summary: member counts and heroes.
    pub(super) fn summary(&self, room_id: &str) -> Value {
        let summaries = self.summaries.get(room_id).map_or(&[][..], Vec::as_slice);
        let (joined, invited, heroes) = counts_and_heroes(summaries);
        json!({
            "m.heroes": heroes,
            "m.joined_member_count": joined,
            "m.invited_member_count": invited,
        })
    }
}

/// A room's joined and invited member counts and its heroes (the first [`HEROES`] members by
/// user ID, whatever their membership), from its membership summaries.
pub(super) fn counts_and_heroes(summaries: &[MembershipSummary]) -> (i64, i64, Vec<&String>) {
    let count = |membership: &str| {
        summaries
            .iter()
            .find(|s| s.membership == membership)
            .map_or(0, |s| s.count)
    };
    let mut heroes: Vec<&String> = summaries.iter().flat_map(|s| s.first.iter()).collect();
    heroes.sort();
    heroes.truncate(HEROES);
    (count("join"), count("invite"), heroes)
}

/// Sets `unread_notifications`, the MSC2654 `unread_count` and, when the filter asks,
/// `unread_thread_notifications` on a joined room's section, from the room's counts.
pub(super) fn add_unread_counts(
    section: &mut Map<String, Value>,
    counts: &[UnreadCounts],
    filter: &SyncFilter,
) {
    let (mut notifications, mut highlights, mut unread) = (0, 0, 0);
    let mut threads = Map::new();
    for count in counts {
        unread += count.unread;
        if filter.unread_thread_notifications && !count.thread_id.is_empty() {
            if count.notifications > 0 || count.highlights > 0 {
                threads.insert(
                    count.thread_id.clone(),
                    json!({
                        "notification_count": count.notifications,
                        "highlight_count": count.highlights,
                    }),
                );
            }
        } else {
            notifications += count.notifications;
            highlights += count.highlights;
        }
    }
    section.insert(
        "unread_notifications".into(),
        json!({ "notification_count": notifications, "highlight_count": highlights }),
    );
    section.insert("org.matrix.msc2654.unread_count".into(), json!(unread));
    if filter.unread_thread_notifications {
        section.insert("unread_thread_notifications".into(), Value::Object(threads));
    }
}

/// One room's section (joined or left) before it is serialised; its state events are JSON
/// text already.
#[derive(Serialize)]
pub(super) struct RoomSection {
    pub(super) timeline: Timeline,
    pub(super) state: Events<Box<RawValue>>,
    /// Account data, and for a joined room its ephemeral events, summary and unread counts.
    #[serde(flatten)]
    pub(super) rest: Map<String, Value>,
}

#[derive(Serialize)]
pub(super) struct Timeline {
    pub(super) events: Vec<Value>,
    pub(super) limited: bool,
    pub(super) prev_batch: String,
}

#[derive(Serialize)]
pub(super) struct Events<T> {
    pub(super) events: Vec<T>,
}

/// A room's section with its timeline chosen, before its state is read.
struct Draft {
    rules: RoomVersionRules,
    /// The timeline's events the user may see, oldest first.
    timeline: Vec<EventRow>,
    limited: bool,
    prev_batch: String,
    /// The timeline's start: the position before it and, when known, the state group there.
    start: (i64, Option<i64>),
    /// With lazy-loaded members, the members whose member events are sent: the timeline's
    /// senders and the user.
    members: Option<Vec<String>>,
}

impl Sync {
    /// The sections of a batch of rooms. Their newest events are one statement for the whole
    /// batch, and those events' relations and transaction IDs one more each; then each room's
    /// timeline is chosen, with lazy-loaded members the state of the rooms sent in full is
    /// read in one statement, and each room's section is built.
    pub(super) async fn batch_sections<'r>(
        &self,
        rooms: &Rooms,
        conn: &AsyncPgConnection,
        ignored: &HashSet<String>,
        request: &SyncRequest,
        batch: Vec<RoomJob<'r>>,
        joined_facts: impl Future<Output = Result<Arc<JoinedFacts>, String>> + Clone,
    ) -> Result<Vec<Option<Section<'r>>>> {
        // One past the timeline: the row before it says whether it is limited and where its
        // state starts.
        let windows: Vec<timelines::Window> = batch
            .iter()
            .filter_map(|job| {
                job.range().map(|range| timelines::Window {
                    room_id: job.room_id,
                    after: range.since.unwrap_or(0),
                    up_to: range.up_to,
                    limit: request.filter.timeline_limit as i64 + 1,
                })
            })
            .collect();
        let (mut newest, extras) = read_newest(
            conn,
            request.user_id.as_str(),
            request.device_id.as_str(),
            &windows,
            !request.filter.federation_format,
        )
        .await?;
        let drafts = batch.iter().map(|job| {
            let rows = newest.remove(job.room_id).unwrap_or_default();
            async move {
                match job.range() {
                    Some(range) => self
                        .draft(rooms, conn, ignored, request, job, range, rows)
                        .await
                        .map(Some),
                    None => Ok(None),
                }
            }
        });
        let drafts = futures_util::future::try_join_all(drafts).await?;
        let full_states = self
            .lazy_full_states(rooms, conn, request, &batch, &drafts)
            .await?;
        let sections =
            batch
                .into_iter()
                .zip(drafts)
                .zip(full_states)
                .map(|((job, draft), full_state)| {
                    self.room_job(
                        rooms,
                        conn,
                        ignored,
                        request,
                        job,
                        draft.map(|draft| (draft, full_state)),
                        &extras,
                        joined_facts.clone(),
                    )
                });
        futures_util::future::try_join_all(sections).await
    }

    /// Chooses a room's timeline over its range from its newest events (newest first, one
    /// past the timeline): what the user may see, and where the state before it starts.
    #[allow(clippy::too_many_arguments)]
    async fn draft(
        &self,
        rooms: &Rooms,
        conn: &AsyncPgConnection,
        ignored: &HashSet<String>,
        request: &SyncRequest,
        job: &RoomJob<'_>,
        range: &Range,
        mut rows: Vec<EventRow>,
    ) -> Result<Draft> {
        let limit = request.filter.timeline_limit;
        let rules = rooms
            .version_rules(conn, job.room_id)
            .await?
            .ok_or_else(|| Error::internal("membership in unknown room"))?;
        let limited = rows.len() > limit;
        // The row read past the timeline is the newest served event before its start: its
        // group is the state there, as `get_state_group_at` would find it.
        let group_at_start = rows.get(limit).and_then(|row| row.state_group);
        rows.truncate(limit);
        rows.reverse();
        // The timeline's start in history (topological order); with no events in the range, the
        // range's end in stream order, placed in history by the `/messages` that needs it.
        let prev_batch = match rows.first() {
            Some(first) => token::pagination(crate::storage::dag::HistoryPosition::before(first)),
            None => token::stream_pagination(range.up_to),
        };
        let start = rows.first().map_or(range.up_to, |r| r.stream_ordering - 1);

        let mut visibility = Visibility::new(&request.user_id);
        visibility.know_membership(job.room_id, job.membership, job.membership_position);
        let mut timeline = Vec::new();
        for row in rows {
            if request.filter.timeline.allows_row(&row)
                && !ignored.contains(&row.sender)
                && visibility.can_see(conn, &row).await?
            {
                timeline.push(row);
            }
        }
        // Lazy-loaded members: only those of the timeline's senders and the user's own, read
        // alone (a big room's other members are not read).
        let members = request.filter.lazy_load_members.then(|| {
            let mut needed: HashSet<&str> = timeline.iter().map(|e| e.sender.as_str()).collect();
            needed.insert(request.user_id.as_str());
            needed.into_iter().map(str::to_owned).collect()
        });
        Ok(Draft {
            rules,
            timeline,
            limited,
            prev_batch,
            start: (start, group_at_start),
            members,
        })
    }

    /// With lazy-loaded members, the state up to their timelines' start of the batch's rooms
    /// sent in full as client events, by place in the batch (`None` for the others), their
    /// event IDs read in one statement. Without, each room's state is read with its section,
    /// so that its rendering goes on while PostgreSQL reads the next room's (a full sync of 300
    /// rooms of 300 members took 1.2x as long with the batch read first).
    async fn lazy_full_states(
        &self,
        rooms: &Rooms,
        conn: &AsyncPgConnection,
        request: &SyncRequest,
        batch: &[RoomJob<'_>],
        drafts: &[Option<Draft>],
    ) -> Result<Vec<Option<SectionState>>> {
        let mut states: Vec<Option<SectionState>> = batch.iter().map(|_| None).collect();
        if request.filter.federation_format || !request.filter.lazy_load_members {
            return Ok(states);
        }
        let full: Vec<(usize, &str, &Draft)> = batch
            .iter()
            .zip(drafts)
            .enumerate()
            .filter_map(|(i, (job, draft))| {
                let draft = draft.as_ref()?;
                job.range()
                    .is_some_and(|range| range.since.is_none())
                    .then_some((i, job.room_id, draft))
            })
            .collect();
        let groups = futures_util::future::try_join_all(
            full.iter()
                .map(|(_, room_id, draft)| group_at(conn, room_id, draft.start)),
        )
        .await?;
        // A room without state before its timeline (none served yet) has an empty one.
        let mut with_group = Vec::new();
        for ((i, room_id, draft), group) in full.into_iter().zip(groups) {
            match group {
                Some(group) => with_group.push((i, (room_id, group), draft)),
                None => states[i] = Some(SectionState::default()),
            }
        }
        let groups: Vec<(&str, i64)> = with_group.iter().map(|(_, group, _)| *group).collect();
        let members: Vec<&[String]> = with_group
            .iter()
            .map(|(_, _, draft)| draft.members.as_deref().unwrap_or_default())
            .collect();
        let read = rooms
            .member_states_of_groups(conn, &groups, &members)
            .await?;
        for ((i, _, _), state) in with_group.into_iter().zip(read) {
            states[i] = Some(state);
        }
        Ok(states)
    }

    /// Builds one room's section: `("join" | "invite" | "knock" | "leave", room, section)`, or
    /// nothing when there is nothing to say about the room. A room with a timeline comes with
    /// its draft and, when sent in full, its state.
    #[allow(clippy::too_many_arguments)]
    async fn room_job<'r>(
        &self,
        rooms: &Rooms,
        conn: &AsyncPgConnection,
        ignored: &HashSet<String>,
        request: &SyncRequest,
        job: RoomJob<'r>,
        drafted: Option<(Draft, Option<SectionState>)>,
        extras: &TimelineExtras,
        joined_facts: impl Future<Output = Result<Arc<JoinedFacts>, String>>,
    ) -> Result<Option<Section<'r>>> {
        let RoomJob {
            room_id,
            membership_event,
            data,
            kind,
            ..
        } = job;
        let undrafted = || Error::internal("a room with a timeline was not drafted");
        match kind {
            JobKind::Join {
                range,
                ephemeral,
                summary,
            } => {
                let (draft, full_state) = drafted.ok_or_else(undrafted)?;
                let mut section = self
                    .room_section(
                        rooms, conn, request, room_id, &range, draft, full_state, extras,
                    )
                    .await?;
                let is_empty = section.timeline.events.is_empty()
                    && section.state.events.is_empty()
                    && data.is_empty()
                    && ephemeral.is_empty();
                if is_empty && range.since.is_some() {
                    return Ok(None);
                }
                section
                    .rest
                    .insert("account_data".into(), json!({ "events": data }));
                section
                    .rest
                    .insert("ephemeral".into(), json!({ "events": ephemeral }));
                let facts = joined_facts.await.map_err(Error::internal)?;
                let summary = match summary {
                    true => facts.summary(room_id),
                    false => json!({}),
                };
                section.rest.insert("summary".into(), summary);
                add_unread_counts(
                    &mut section.rest,
                    facts.counts.get(room_id).map_or(&[], Vec::as_slice),
                    &request.filter,
                );
                Ok(Some(("join", room_id, to_raw_value(&section)?)))
            }
            JobKind::Stripped { knock } => {
                let inviter = store::get_state_event(conn, membership_event)
                    .await?
                    .map(|e| e.sender);
                if inviter.is_some_and(|sender| ignored.contains(&sender)) {
                    return Ok(None);
                }
                let stripped = self.stripped_state(conn, membership_event).await?;
                Ok(Some(if knock {
                    (
                        "knock",
                        room_id,
                        to_raw_value(&json!({ "knock_state": { "events": stripped } }))?,
                    )
                } else {
                    (
                        "invite",
                        room_id,
                        to_raw_value(&json!({ "invite_state": { "events": stripped } }))?,
                    )
                }))
            }
            JobKind::Leave { range } => {
                let (draft, full_state) = drafted.ok_or_else(undrafted)?;
                let mut section = self
                    .room_section(
                        rooms, conn, request, room_id, &range, draft, full_state, extras,
                    )
                    .await?;
                section
                    .rest
                    .insert("account_data".into(), json!({ "events": data }));
                Ok(Some(("leave", room_id, to_raw_value(&section)?)))
            }
        }
    }

    /// The timeline and state of one room over a range, from its draft; `full_state` is the
    /// state before the timeline of a room sent in full as client events when read with its
    /// batch's (lazy-loaded members).
    #[allow(clippy::too_many_arguments)]
    async fn room_section(
        &self,
        rooms: &Rooms,
        conn: &AsyncPgConnection,
        request: &SyncRequest,
        room_id: &str,
        range: &Range,
        draft: Draft,
        full_state: Option<SectionState>,
        extras: &TimelineExtras,
    ) -> Result<RoomSection> {
        let Draft {
            rules,
            timeline,
            limited,
            prev_batch,
            start,
            members,
        } = draft;
        let members = members.as_deref();
        let (mut timeline_events, mut state_events) = if request.filter.federation_format {
            let state_ids =
                section_state_ids(conn, room_id, range, limited, start, members).await?;
            // Redacted events go out pruned, as federation would serve them.
            let pdus = |rows: &[EventRow]| {
                rows.iter()
                    .map(|r| match r.redacted_by {
                        Some(_) => crate::service::rooms::pdu::prune(&r.pdu, &rules),
                        None => r.pdu.clone(),
                    })
                    .collect::<Vec<_>>()
            };
            let mut state_rows = store::get_state_events(conn, &state_ids).await?;
            state_rows.retain(|r| request.filter.state.allows_row(r));
            state_rows.sort_by_key(|r| r.stream_ordering);
            let state = pdus(&state_rows)
                .iter()
                .map(to_raw_value)
                .collect::<Result<Vec<_>>>()?;
            (pdus(&timeline), state)
        } else {
            // State is most of a full sync's bytes (every member event): it is read as the
            // parts clients get and written without a tree per event.
            let mut state = match (full_state, range.since) {
                (Some(state), _) => state,
                (None, None) => match group_at(conn, room_id, start).await? {
                    Some(group) => rooms.state_of_group(conn, room_id, group).await?,
                    None => SectionState::default(),
                },
                // What changed since the token, when limited.
                (None, Some(_)) => {
                    let ids =
                        section_state_ids(conn, room_id, range, limited, start, members).await?;
                    SectionState {
                        kept: Vec::new(),
                        read: client_events::get_state_event_parts(conn, &ids).await?,
                    }
                }
            };
            state.kept.retain(|e| request.filter.state.allows_kept(e));
            state.read.retain(|p| request.filter.state.allows_parts(p));
            let (mut timeline, state) = tokio::try_join!(
                rooms.render_with_bundled(
                    conn,
                    &rules,
                    &request.user_id,
                    &timeline,
                    &extras.bundled
                ),
                rooms.render_section_state(conn, &rules, state),
            )?;
            timeline.iter_mut().for_each(omit_room_ids);
            (timeline, state)
        };
        set_transaction_ids(&mut timeline_events, &extras.transaction_ids);
        if let Some(fields) = &request.filter.event_fields {
            for event in timeline_events.iter_mut() {
                *event = keep_fields(event, fields);
            }
            for event in state_events.iter_mut() {
                let value: Value = serde_json::from_str(event.get()).map_err(Error::internal)?;
                *event = to_raw_value(&keep_fields(&value, fields))?;
            }
        }
        Ok(RoomSection {
            timeline: Timeline {
                events: timeline_events,
                limited,
                prev_batch,
            },
            state: Events {
                events: state_events,
            },
            rest: Map::new(),
        })
    }
}
