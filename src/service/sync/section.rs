//! One room's section of a `/sync` response: its state up to the timeline's start, the facts
//! read for every joined room at once (unread counts, summaries) and the section's shape.

use std::collections::HashMap;

use diesel_async::AsyncPgConnection;
use serde::Serialize;
use serde_json::{json, value::RawValue, Map, Value};

use super::{filter::SyncFilter, Range, HEROES};
use crate::{
    error::Result,
    storage::{
        memberships::MembershipSummary, push::UnreadCounts, state as state_store, timelines,
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
