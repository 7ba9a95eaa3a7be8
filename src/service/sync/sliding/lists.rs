//! The user's room set for sliding sync: which rooms may be listed, their filters, their
//! order (latest activity first) and the lists' windows.

use std::{
    collections::{HashMap, HashSet},
    num::NonZeroUsize,
    sync::{Arc, Mutex},
};

use diesel_async::AsyncPgConnection;
use lru::LruCache;
use serde_json::Value;

use super::model::{ListFilters, ListRequest};
use crate::{
    error::Result,
    service::sync::{memberships::Membership, room_index::LastChange, token::SyncToken},
    storage::{account_data as account_store, sliding_sync as sliding_store},
};

/// One room the user has a membership in (borrowing from the user's membership list).
#[derive(Debug, Clone)]
pub struct UserRoom<'m> {
    /// The room.
    pub room_id: &'m str,
    /// `join`, `invite`, `knock`, `leave` or `ban`.
    pub membership: &'m str,
    /// The membership event.
    pub event_id: &'m str,
    /// Its position.
    pub membership_position: i64,
    /// Position of the newest event the user may see (the membership's for non-joined rooms).
    pub activity: i64,
    /// Position of the newest message-like event (the membership's for non-joined rooms).
    pub bump_stamp: i64,
    /// Whether it may be listed (a room the user left themselves before the `pos` may still
    /// be subscribed to, but is no longer listed).
    pub listed: bool,
    /// Facts from its current state, when a list's filters need them (`None`: not loaded,
    /// or no state here).
    pub meta: Option<Arc<RoomMeta>>,
    /// Its place in the user's rooms (what [`user_rooms`] returned).
    pub index: usize,
}

/// The user's rooms, with what lists need to order them: `memberships` are `(room, membership,
/// event ID, position)` and `changes` where each of those rooms last changed.
pub fn user_rooms<'m>(
    memberships: &'m [Membership],
    senders: &HashMap<String, String>,
    changes: &[LastChange],
    user: &str,
    ignored: &HashSet<String>,
    since: Option<&SyncToken>,
) -> Vec<UserRoom<'m>> {
    memberships
        .iter()
        .zip(changes)
        .filter_map(|((room_id, membership, event_id, position), last)| {
            let position = *position;
            let sender = senders.get(event_id).map(String::as_str);
            let listed = match membership.as_str() {
                "join" | "knock" | "ban" => true,
                "invite" => !sender.is_some_and(|s| ignored.contains(s)),
                // Kicked: stays listed; left by themselves: listed once, in the range it
                // happened in.
                "leave" => sender != Some(user) || since.is_some_and(|s| position > s.events),
                _ => false,
            };
            let (activity, bump_stamp) = if membership == "join" {
                let bump = if last.bump > 0 { last.bump } else { position };
                (last.event.max(position), bump)
            } else {
                (position, position)
            };
            if membership == "invite" && !listed {
                return None;
            }
            Some(UserRoom {
                room_id,
                membership,
                event_id,
                membership_position: position,
                activity,
                bump_stamp: bump_stamp.max(0),
                listed,
                meta: None,
                index: 0,
            })
        })
        .enumerate()
        .map(|(index, room)| UserRoom { index, ..room })
        .collect()
}

/// What the filters of a request need to know about rooms, loaded only when asked for.
#[derive(Default)]
pub struct FilterFacts {
    /// Rooms in the user's `m.direct`.
    pub direct: HashSet<String>,
    /// Space ID -> child room IDs.
    pub space_children: HashMap<String, HashSet<String>>,
    /// Room ID -> tags.
    pub tags: HashMap<String, HashSet<String>>,
}

/// Facts from a room's current state.
#[derive(Default, Debug, Clone)]
pub struct RoomMeta {
    /// Has `m.room.encryption`.
    pub encrypted: bool,
    /// `m.room.create`'s `content.type` (`None`: untyped). Unknown when there is no create
    /// event.
    pub room_type: Option<String>,
    /// Whether a create event was seen.
    pub known: bool,
    /// `m.room.name`.
    pub name: Option<String>,
}

/// The rooms in the user's `m.direct` account data.
pub fn direct_rooms(content: Option<&Value>) -> HashSet<String> {
    content
        .and_then(Value::as_object)
        .map(|by_user| {
            by_user
                .values()
                .filter_map(Value::as_array)
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Joined rooms' filter facts this process has read, each with the room's activity position
/// when read: any event of a joined room (a state change among them) moves that position, so
/// an entry whose position still matches is current, and a request reloads only the rooms
/// that changed (and the rooms the user is not joined to, whose activity is their membership).
pub struct MetaCache(Mutex<LruCache<String, CachedMeta>>);

/// A room's activity position when its facts were read, and the facts (`None`: no state).
type CachedMeta = (i64, Option<Arc<RoomMeta>>);

impl Default for MetaCache {
    fn default() -> Self {
        MetaCache(Mutex::new(LruCache::new(
            NonZeroUsize::new(META_CACHED).expect("non-zero"),
        )))
    }
}

/// Rooms whose filter facts one process keeps.
const META_CACHED: usize = 100_000;

/// Loads what the requested filters need (the rooms' own facts into `rooms`).
pub async fn load_facts(
    conn: &AsyncPgConnection,
    user: &str,
    rooms: &mut [UserRoom<'_>],
    lists: impl Iterator<Item = &ListRequest> + Clone,
    (direct, account_data_position): (HashSet<String>, i64),
    cache: &MetaCache,
) -> Result<FilterFacts> {
    let mut facts = FilterFacts {
        direct,
        ..FilterFacts::default()
    };
    let needs_state = lists.clone().any(|l| l.filters.needs_state());
    let needs_tags = lists.clone().any(|l| l.filters.needs_tags());
    if needs_state {
        // A fact that cannot change is not read again: a room's type is fixed at creation,
        // and encryption once on stays on. Only names, and encryption when filtered on and
        // still off, follow a room's events.
        let needs_name = lists.clone().any(|l| l.filters.room_name_like.is_some());
        let needs_encryption = lists.clone().any(|l| l.filters.is_encrypted.is_some());
        let may_have_changed = |meta: &Option<Arc<RoomMeta>>| match meta {
            Some(meta) if meta.known => needs_name || (needs_encryption && !meta.encrypted),
            _ => true,
        };
        // One pass over the cache: a current entry fills its room in, the rest are read.
        let mut stale: Vec<usize> = Vec::new();
        {
            let mut cached = cache.0.lock().unwrap_or_else(|e| e.into_inner());
            for (i, room) in rooms.iter_mut().enumerate() {
                match cached.get(room.room_id) {
                    // Only a joined room's activity follows its every event.
                    Some((at, meta))
                        if room.membership == "join"
                            && (*at == room.activity || !may_have_changed(meta)) =>
                    {
                        room.meta = meta.clone();
                    }
                    _ => stale.push(i),
                }
            }
        }
        let metrics = crate::metrics::metrics();
        metrics
            .cache_requests
            .get_or_create(&crate::metrics::CacheLabels {
                cache: "sliding_room_meta",
                result: "miss",
            })
            .inc_by(stale.len() as u64);
        metrics
            .cache_requests
            .get_or_create(&crate::metrics::CacheLabels {
                cache: "sliding_room_meta",
                result: "hit",
            })
            .inc_by((rooms.len() - stale.len()) as u64);
        let stale_ids: Vec<String> = stale.iter().map(|&i| rooms[i].room_id.to_owned()).collect();
        let mut spaces: Vec<String> = lists
            .clone()
            .filter_map(|l| l.filters.spaces.clone())
            .flatten()
            .filter(|space| {
                rooms
                    .iter()
                    .any(|r| r.room_id == space && r.membership == "join")
            })
            .collect();
        spaces.sort();
        spaces.dedup();
        let mut loaded: HashMap<String, RoomMeta> = HashMap::new();
        let state = if stale_ids.is_empty() && spaces.is_empty() {
            Vec::new()
        } else {
            sliding_store::get_filter_state(conn, &stale_ids, &spaces).await?
        };
        for (room_id, kind, state_key, content) in state {
            if kind == "m.space.child" {
                // A child event with `via` names a child; an emptied one removed it.
                if content.get("via").and_then(Value::as_array).is_some() {
                    facts
                        .space_children
                        .entry(room_id)
                        .or_default()
                        .insert(state_key);
                }
                continue;
            }
            let meta = loaded.entry(room_id).or_default();
            match kind.as_str() {
                "m.room.encryption" => meta.encrypted = true,
                "m.room.create" => {
                    meta.known = true;
                    meta.room_type = content
                        .get("type")
                        .and_then(Value::as_str)
                        .map(str::to_owned);
                }
                "m.room.name" => {
                    meta.name = content
                        .get("name")
                        .and_then(Value::as_str)
                        .filter(|n| !n.is_empty())
                        .map(str::to_owned)
                }
                _ => {}
            }
        }
        let mut cached = cache.0.lock().unwrap_or_else(|e| e.into_inner());
        for i in stale {
            let room = &mut rooms[i];
            room.meta = loaded.remove(room.room_id).map(Arc::new);
            cached.put(room.room_id.to_owned(), (room.activity, room.meta.clone()));
        }
    }
    if needs_tags {
        for (room_id, kind, content) in
            account_store::get_account_data_changed(conn, user, 0, account_data_position).await?
        {
            if kind == "m.tag" && !room_id.is_empty() {
                let tags = content
                    .get("tags")
                    .and_then(Value::as_object)
                    .map(|t| t.keys().cloned().collect())
                    .unwrap_or_default();
                facts.tags.insert(room_id, tags);
            }
        }
    }
    Ok(facts)
}

/// Whether a room passes a list's filters.
pub fn passes(room: &UserRoom<'_>, filters: &ListFilters, facts: &FilterFacts) -> bool {
    if !room.listed {
        return false;
    }
    if let Some(is_dm) = filters.is_dm {
        if facts.direct.contains(room.room_id) != is_dm {
            return false;
        }
    }
    if let Some(is_invite) = filters.is_invite {
        if (room.membership == "invite") != is_invite {
            return false;
        }
    }
    let meta = room.meta.as_deref();
    if let Some(is_encrypted) = filters.is_encrypted {
        // A room with unknown state (no create event here) is dropped when filtered on.
        match meta {
            Some(meta) if meta.known => {
                if meta.encrypted != is_encrypted {
                    return false;
                }
            }
            _ => return false,
        }
    }
    if filters.room_types.is_some() || !filters.not_room_types.is_empty() {
        let Some(meta) = meta.filter(|m| m.known) else {
            return false;
        };
        if filters.not_room_types.contains(&meta.room_type) {
            return false;
        }
        if let Some(types) = &filters.room_types {
            if !types.contains(&meta.room_type) {
                return false;
            }
        }
    }
    if let Some(like) = &filters.room_name_like {
        let like = like.to_lowercase();
        let name = meta.and_then(|m| m.name.as_deref()).unwrap_or_default();
        if !name.to_lowercase().contains(&like) {
            return false;
        }
    }
    if let Some(spaces) = &filters.spaces {
        if !spaces.iter().any(|space| {
            facts
                .space_children
                .get(space)
                .is_some_and(|children| children.contains(room.room_id))
        }) {
            return false;
        }
    }
    let tags = facts.tags.get(room.room_id);
    if let Some(wanted) = &filters.tags {
        if !wanted
            .iter()
            .any(|t| tags.is_some_and(|tags| tags.contains(t)))
        {
            return false;
        }
    }
    if filters
        .not_tags
        .iter()
        .any(|t| tags.is_some_and(|tags| tags.contains(t)))
    {
        return false;
    }
    true
}

/// One list's rooms in order (latest activity first, then room ID) and its windows.
pub struct ListResult<'r> {
    /// Every matching room, in order.
    pub rooms: Vec<&'r UserRoom<'r>>,
    /// `(start, end, rooms)` per requested range, the end capped at the list's last room.
    pub windows: Vec<(u64, u64, Vec<&'r UserRoom<'r>>)>,
}

/// Filters, orders and windows one list.
pub fn build_list<'r>(
    rooms: &'r [UserRoom<'r>],
    list: &ListRequest,
    facts: &FilterFacts,
) -> ListResult<'r> {
    let mut matching: Vec<&UserRoom<'_>> = rooms
        .iter()
        .filter(|r| passes(r, &list.filters, facts))
        .collect();
    matching.sort_by(|a, b| {
        b.activity
            .cmp(&a.activity)
            .then_with(|| a.room_id.cmp(b.room_id))
    });
    let count = matching.len() as u64;
    let ranges = match &list.ranges {
        Some(ranges) => ranges.clone(),
        None if count > 0 => vec![(0, count - 1)],
        None => Vec::new(),
    };
    let windows = ranges
        .into_iter()
        .filter(|(start, _)| *start < count)
        .map(|(start, end)| {
            let end = end.min(count - 1);
            let slice = matching[start as usize..=end as usize].to_vec();
            (start, end, slice)
        })
        .collect();
    ListResult {
        rooms: matching,
        windows,
    }
}

/// The senders of membership events (who invited, who kicked), for the non-joined rooms.
pub async fn membership_senders(
    conn: &AsyncPgConnection,
    memberships: &[Membership],
) -> Result<HashMap<String, String>> {
    let ids: Vec<String> = memberships
        .iter()
        .filter(|m| m.1 != "join")
        .map(|m| m.2.clone())
        .collect();
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    Ok(sliding_store::get_event_senders(conn, &ids)
        .await?
        .into_iter()
        .collect())
}
