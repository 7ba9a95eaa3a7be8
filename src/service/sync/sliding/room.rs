//! One room result of a sliding sync response: initial or a delta since what the connection
//! last sent, with the timeline, the required state, counts and the room's summary.

use std::collections::HashSet;

use diesel_async::AsyncPgConnection;
use serde_json::{json, Map, Value};

use super::{lists::UserRoom, model::RoomConfig};
use crate::{
    error::{Error, Result},
    service::{
        rooms::{pdu::omit_room_ids, versions::rules_for, visibility::Visibility, Rooms},
        sync::{
            newest::{set_transaction_ids, Newest},
            section::counts_and_heroes,
            state_at, token, Sync, HEROES,
        },
    },
    storage::{
        dag::HistoryPosition,
        memberships as membership_store, rooms as store, state as state_store,
        timelines::{self, Window},
    },
};

/// One room to build.
pub struct RoomJob<'r> {
    /// The room and the user's membership in it.
    pub room: &'r UserRoom<'r>,
    /// First time on this connection (or joined since).
    pub initial: bool,
    /// Send events after this position (`None`: the newest `timeline_limit`, whatever their
    /// age, as for an initial room or a grown timeline limit).
    pub from: Option<i64>,
    /// What to send.
    pub config: std::sync::Arc<RoomConfig>,
    /// The state the connection sent before, when the required state grew: what it did
    /// not cover is sent now.
    pub previous_config: Option<RoomConfig>,
    /// The timeline limit grew: its newest events are sent again.
    pub expanded_timeline: bool,
    /// Whether the room is in the user's `m.direct`.
    pub is_dm: bool,
    /// Whether the extensions send the room's receipts, account data and typing in full
    /// (first sent, timeline grown, or back after missing updates out of every window).
    pub replay_extensions: bool,
}

impl<'r> RoomJob<'r> {
    /// Where the room's timeline is read (its newest events, one past the timeline), unless
    /// the room has none to send (an invite or a knock).
    pub fn window(&self, ctx: &RoomContext<'_>) -> Option<Window<'r>> {
        if matches!(self.room.membership, "invite" | "knock") {
            return None;
        }
        Some(Window {
            room_id: self.room.room_id,
            after: self.from.filter(|_| !self.expanded_timeline).unwrap_or(0),
            up_to: self.up_to(ctx),
            limit: self.config.timeline_limit as i64 + 1,
        })
    }

    /// The end of the room's timeline: the response's position, or the user's leave.
    fn up_to(&self, ctx: &RoomContext<'_>) -> i64 {
        match self.room.membership {
            "join" => ctx.up_to,
            _ => self.room.membership_position,
        }
    }
}

/// What every room of one response shares.
pub struct RoomContext<'a> {
    /// Rooms service (rendering).
    pub rooms: &'a Rooms,
    /// The syncing user.
    pub user: &'a ruma::UserId,
    /// Their device.
    pub device_id: &'a str,
    /// Users they ignore.
    pub ignored: &'a HashSet<String>,
    /// The request's event position (events after it are "live").
    pub since_events: Option<i64>,
    /// The response's event position.
    pub up_to: i64,
}

/// A built room: its JSON and the IDs of its timeline events (for the receipts extension).
pub struct BuiltRoom {
    /// The room result.
    pub value: Value,
    /// Its timeline's event IDs.
    pub timeline_ids: Vec<String>,
}

impl Sync {
    /// Builds one room result.
    pub(super) async fn sliding_room(
        &self,
        conn: &AsyncPgConnection,
        ctx: &RoomContext<'_>,
        job: RoomJob<'_>,
        newest: Newest<'_>,
    ) -> Result<BuiltRoom> {
        let room = job.room;
        let mut result = Map::new();
        if job.initial {
            result.insert("initial".into(), Value::Bool(true));
        }
        result.insert("bump_stamp".into(), json!(room.bump_stamp));
        if matches!(room.membership, "invite" | "knock") {
            let stripped = self.stripped_state(conn, room.event_id).await?;
            result.insert("invite_state".into(), Value::Array(stripped));
            return Ok(BuiltRoom {
                value: Value::Object(result),
                timeline_ids: Vec::new(),
            });
        }
        let user = ctx.user.as_str();
        let up_to = job.up_to(ctx);
        let limit = job.config.timeline_limit as usize;
        let Newest { mut rows, extras } = newest;
        let delta_from = job.from.filter(|_| !job.initial);
        // For a delta, the state group the last response ended with: a joined room whose
        // current group is still that one has the same state, and neither state is read.
        let (room_row, group_before) = tokio::try_join!(
            async { Ok::<_, Error>(store::get_room(conn, room.room_id).await?) },
            async {
                Ok(match delta_from {
                    Some(from) => timelines::get_state_group_at(conn, room.room_id, from).await?,
                    None => None,
                })
            },
        )?;
        let room_row = room_row.ok_or_else(|| Error::internal("membership in unknown room"))?;
        let state_unchanged = room.membership == "join"
            && job.previous_config.is_none()
            && group_before.is_some_and(|group| group == room_row.current_state_group);
        // A joined room's current state (a state event committed after `up_to` may come now
        // and again with the next delta, which clients take); a left room's state as of the
        // leave. For a delta whose state moved, also the state the last one ended with.
        let (current, before) = if state_unchanged {
            (
                state_store::StateIds::new(),
                Some(state_store::StateIds::new()),
            )
        } else {
            tokio::try_join!(
                async {
                    Ok::<state_store::StateIds, Error>(if room.membership == "join" {
                        store::get_current_state_ids(conn, room.room_id)
                            .await?
                            .into_iter()
                            .map(|(kind, key, id)| ((kind, key), id))
                            .collect()
                    } else {
                        state_at(conn, room.room_id, up_to).await?
                    })
                },
                async {
                    Ok(match (delta_from, group_before) {
                        (None, _) => None,
                        (Some(_), Some(group)) => {
                            Some(state_store::get_state_ids(conn, group).await?)
                        }
                        (Some(_), None) => Some(state_store::StateIds::new()),
                    })
                },
            )?
        };
        let rules = rules_for(&room_row.room_version)?;
        let limited = rows.len() > limit;
        rows.truncate(limit);
        rows.reverse();
        let mut visibility = Visibility::new(ctx.user);
        visibility.know_membership(room.room_id, room.membership, room.membership_position);
        let mut timeline = Vec::new();
        for row in rows {
            if !ctx.ignored.contains(&row.sender) && visibility.can_see(conn, &row).await? {
                timeline.push(row);
            }
        }
        let prev_batch = match timeline.first() {
            Some(first) => token::pagination(HistoryPosition::before(first)),
            None => token::stream_pagination(up_to),
        };

        // Which state to send: all that matches when initial, else what changed since
        // `from`, plus what a grown config newly covers.
        let config = &job.config.required_state;
        let mut wanted: HashSet<String> = HashSet::new();
        let mut changed_keys: HashSet<(String, String)> = HashSet::new();
        match before {
            None => {
                for ((kind, key), id) in &current {
                    if config.matches(kind, key) {
                        wanted.insert(id.clone());
                    }
                }
            }
            Some(before) => {
                for (key, id) in &current {
                    if before.get(key) != Some(id) {
                        changed_keys.insert(key.clone());
                        let (kind, state_key) = key;
                        // Lazy members: every membership change of a complete range.
                        let lazy_member =
                            config.lazy_members && kind == "m.room.member" && !limited;
                        if config.matches(kind, state_key) || lazy_member {
                            wanted.insert(id.clone());
                        }
                    }
                }
                if let Some(previous) = &job.previous_config {
                    for ((kind, key), id) in &current {
                        if config.matches(kind, key) && !previous.required_state.matches(kind, key)
                        {
                            wanted.insert(id.clone());
                        }
                    }
                }
            }
        }
        // Lazy members: those of the timeline's senders and of its membership events'
        // targets (the user's own comes with `$ME`); from the current state already read, or
        // read for just them when the state did not move.
        let mut lazy_keys: Vec<(&str, &str)> = Vec::new();
        if config.lazy_members {
            let mut members: HashSet<&str> = timeline.iter().map(|e| e.sender.as_str()).collect();
            members.extend(
                timeline
                    .iter()
                    .filter(|e| e.event_type == "m.room.member")
                    .filter_map(|e| e.state_key.as_deref()),
            );
            for member in members {
                if state_unchanged {
                    lazy_keys.push(("m.room.member", member));
                } else if let Some(id) =
                    current.get(&("m.room.member".to_owned(), member.to_owned()))
                {
                    wanted.insert(id.clone());
                }
            }
        }
        let wanted: Vec<String> = wanted.into_iter().collect();
        let (mut state_rows, mut timeline_events) = tokio::try_join!(
            async {
                Ok::<_, Error>(if state_unchanged {
                    store::get_current_state_events(conn, room.room_id, &lazy_keys).await?
                } else {
                    store::get_state_events(conn, &wanted).await?
                })
            },
            ctx.rooms
                .render_with_bundled(conn, &rules, ctx.user, &timeline, &extras.bundled),
        )?;
        state_rows.sort_by_key(|r| r.stream_ordering);
        set_transaction_ids(&mut timeline_events, &extras.transaction_ids);
        let mut state_events = ctx.rooms.render(conn, &rules, &state_rows).await?;
        timeline_events
            .iter_mut()
            .chain(state_events.iter_mut())
            .for_each(omit_room_ids);
        let num_live = match ctx.since_events {
            Some(since) => timeline
                .iter()
                .filter(|e| e.stream_ordering > since)
                .count(),
            None => 0,
        };
        let timeline_ids = timeline.iter().map(|e| e.event_id.clone()).collect();

        // Name and avatar when first sent or changed; heroes and member counts when first
        // sent or when memberships changed.
        let name_changed = job.initial || changed_keys.contains(&key("m.room.name"));
        let avatar_changed = job.initial || changed_keys.contains(&key("m.room.avatar"));
        let members_changed = job.initial || changed_keys.iter().any(|(t, _)| t == "m.room.member");
        let mut summary_ids = Vec::new();
        for (wanted_key, changed) in [
            ("m.room.name", name_changed),
            ("m.room.avatar", avatar_changed),
        ] {
            if let Some(id) = current.get(&key(wanted_key)).filter(|_| changed) {
                summary_ids.push(id.clone());
            }
        }
        let summary_rows = store::get_state_events(conn, &summary_ids).await?;
        let content_of = |kind: &str| {
            summary_rows
                .iter()
                .find(|r| r.event_type == kind)
                .and_then(|r| {
                    r.redacted_by
                        .is_none()
                        .then(|| r.pdu.get("content").cloned())
                })
                .flatten()
        };
        let name = content_of("m.room.name")
            .and_then(|c| c.get("name").and_then(Value::as_str).map(str::to_owned))
            .filter(|n| !n.is_empty());
        if let Some(name) = &name {
            result.insert("name".into(), json!(name));
        }
        if avatar_changed {
            let url = content_of("m.room.avatar")
                .and_then(|c| c.get("url").and_then(Value::as_str).map(str::to_owned));
            match url {
                Some(url) => {
                    result.insert("avatar".into(), json!(url));
                }
                // A removed avatar is `null`; an initial room without one says nothing.
                None if !job.initial => {
                    result.insert("avatar".into(), Value::Null);
                }
                None => {}
            }
        }
        let has_name =
            current.contains_key(&key("m.room.name")) && (name.is_some() || !name_changed);
        if room.membership == "join" && members_changed {
            let (joined, invited, heroes) = self
                .members_summary(conn, room.room_id, user, &current)
                .await?;
            result.insert("joined_count".into(), json!(joined));
            result.insert("invited_count".into(), json!(invited));
            if !has_name && !heroes.is_empty() {
                result.insert("heroes".into(), Value::Array(heroes));
            }
        }
        if job.is_dm {
            result.insert("is_dm".into(), Value::Bool(true));
        }
        result.insert("timeline".into(), Value::Array(timeline_events));
        result.insert("required_state".into(), Value::Array(state_events));
        result.insert("prev_batch".into(), json!(prev_batch));
        result.insert("limited".into(), Value::Bool(limited));
        result.insert("num_live".into(), json!(num_live));
        if job.expanded_timeline {
            result.insert("unstable_expanded_timeline".into(), Value::Bool(true));
        }
        Ok(BuiltRoom {
            value: Value::Object(result),
            timeline_ids,
        })
    }

    /// A room's joined and invited counts, and up to five heroes (joined and invited members
    /// other than the user, else those who left) with their names and avatars.
    async fn members_summary(
        &self,
        conn: &AsyncPgConnection,
        room_id: &str,
        user: &str,
        current: &state_store::StateIds,
    ) -> Result<(i64, i64, Vec<Value>)> {
        let summaries = membership_store::get_membership_summaries(
            conn,
            &[room_id.to_owned()],
            user,
            HEROES as i32,
        )
        .await?;
        let (joined, invited, heroes) = counts_and_heroes(&summaries);
        let mut heroes: Vec<String> = heroes.into_iter().cloned().collect();
        if heroes.is_empty() {
            // Nobody else is here: those who left name the room (a DM whose peer left).
            heroes = current
                .keys()
                .filter(|(kind, key)| kind == "m.room.member" && key != user)
                .map(|(_, key)| key.clone())
                .take(HEROES)
                .collect();
        }
        let ids: Vec<String> = heroes
            .iter()
            .filter_map(|h| {
                current
                    .get(&("m.room.member".to_owned(), h.clone()))
                    .cloned()
            })
            .collect();
        let members = store::get_state_events(conn, &ids).await?;
        let heroes = heroes
            .iter()
            .map(|hero| {
                let mut entry = json!({ "user_id": hero });
                if let Some(content) = members
                    .iter()
                    .find(|m| m.state_key.as_deref() == Some(hero))
                    .and_then(|m| m.pdu.get("content"))
                {
                    if let Some(name) = content.get("displayname").and_then(Value::as_str) {
                        entry["displayname"] = json!(name);
                    }
                    if let Some(url) = content.get("avatar_url").and_then(Value::as_str) {
                        entry["avatar_url"] = json!(url);
                    }
                }
                entry
            })
            .collect();
        Ok((joined, invited, heroes))
    }
}

fn key(kind: &str) -> (String, String) {
    (kind.to_owned(), String::new())
}
