//! `POST /search` (`room_events`): ranked or recent full-text search over the rooms the user
//! is in, visibility-checked, with context, state and groupings.

use std::collections::HashMap;

use diesel_async::AsyncPgConnection;
use ruma::{api::client::filter::RoomEventFilter, RoomId, UserId};
use serde_json::{json, Map, Value};

use super::{read::events_around, visibility::Visibility, Rooms};
use crate::{
    error::{Error, Result},
    service::sync::{token, EventFilter},
    storage::{
        dag::HistoryPosition,
        memberships as membership_store,
        rooms::{self as rooms_store, EventRow},
        search::{self as store, SearchQuery},
        state as state_store,
    },
};

/// Results per page when the filter does not say.
const DEFAULT_LIMIT: i64 = 10;
/// Most results per page.
const MAX_LIMIT: i64 = 50;
/// `count` is the number of visible matches among the newest this many (the spec calls the
/// count approximate; counting only what the user may see keeps it from telling them what
/// the history they cannot see contains).
const MAX_COUNTED: i64 = 1000;

/// A parsed `room_events` search.
struct Criteria {
    term: String,
    filter: RoomEventFilter,
    by_rank: bool,
    context: Option<(i64, i64, bool)>,
    include_state: bool,
    group_by: Vec<String>,
}

fn parse(body: &Value) -> Result<Criteria> {
    let criteria = body
        .pointer("/search_categories/room_events")
        .ok_or_else(|| Error::bad_json("Only search_categories.room_events is supported"))?;
    let term = criteria
        .get("search_term")
        .and_then(Value::as_str)
        .filter(|t| !t.trim().is_empty())
        .ok_or_else(|| Error::missing_param("search_term is required"))?
        .to_owned();
    let keys: Vec<&str> = match criteria.get("keys") {
        None => vec!["content.body"],
        Some(keys) => keys
            .as_array()
            .ok_or_else(|| Error::bad_json("keys must be a list"))?
            .iter()
            .map(|k| {
                k.as_str()
                    .ok_or_else(|| Error::bad_json("keys must be strings"))
            })
            .collect::<Result<_>>()?,
    };
    if let Some(bad) = keys
        .iter()
        .find(|k| !["content.body", "content.name", "content.topic"].contains(k))
    {
        return Err(Error::invalid_param(format!("Unknown search key {bad}")));
    }
    if !keys.contains(&"content.body") {
        return Err(Error::invalid_param(
            "Only message bodies (content.body) are searchable",
        ));
    }
    let filter: RoomEventFilter = match criteria.get("filter") {
        None => RoomEventFilter::default(),
        Some(filter) => serde_json::from_value(filter.clone())
            .map_err(|e| Error::bad_json(format!("filter: {e}")))?,
    };
    let by_rank = match criteria.get("order_by").and_then(Value::as_str) {
        None | Some("rank") => true,
        Some("recent") => false,
        Some(other) => return Err(Error::invalid_param(format!("Unknown order_by {other}"))),
    };
    let context = criteria.get("event_context").map(|c| {
        let limit = |key: &str| c.get(key).and_then(Value::as_i64).unwrap_or(5).clamp(0, 20);
        (
            limit("before_limit"),
            limit("after_limit"),
            c.get("include_profile")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        )
    });
    let group_by = criteria
        .pointer("/groupings/group_by")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|g| g.get("key").and_then(Value::as_str))
        .filter(|k| *k == "room_id" || *k == "sender")
        .map(str::to_owned)
        .collect();
    Ok(Criteria {
        term,
        filter,
        by_rank,
        context,
        include_state: criteria
            .get("include_state")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        group_by,
    })
}

impl Rooms {
    /// Runs a search; `next_batch` is a token from an earlier page.
    pub async fn search(
        &self,
        user_id: &UserId,
        body: &Value,
        next_batch: Option<&str>,
    ) -> Result<Value> {
        let criteria = parse(body)?;
        let offset = match next_batch {
            None => 0,
            Some(token) => token
                .strip_prefix('o')
                .and_then(|n| n.parse::<i64>().ok())
                .filter(|n| *n >= 0)
                .ok_or_else(|| Error::invalid_param("Unknown next_batch token"))?,
        };
        let limit = criteria
            .filter
            .limit
            .map_or(DEFAULT_LIMIT, |l| (u64::from(l) as i64).clamp(1, MAX_LIMIT));
        let conn = self.db.conn().await?;
        let joined = membership_store::get_rooms_for_user(&conn, user_id.as_str(), "join").await?;
        let filter = &criteria.filter;
        let rooms: Vec<String> = joined
            .into_iter()
            .filter(|r| {
                filter
                    .rooms
                    .as_ref()
                    .is_none_or(|only| only.iter().any(|o| o == r))
            })
            .filter(|r| !filter.not_rooms.iter().any(|n| n == r))
            .collect();
        let to_strings =
            |ids: &[ruma::OwnedUserId]| ids.iter().map(|u| u.to_string()).collect::<Vec<_>>();
        let senders = filter.senders.as_deref().map(to_strings);
        let not_senders = to_strings(&filter.not_senders);
        let query = SearchQuery {
            term: &criteria.term,
            rooms: &rooms,
            senders: senders.as_deref(),
            not_senders: &not_senders,
            types: filter.types.as_deref(),
            not_types: &filter.not_types,
            by_rank: criteria.by_rank,
        };
        let hits = store::search(&conn, &query, offset, limit).await?;
        let ids: Vec<String> = hits.iter().map(|h| h.event_id.clone()).collect();
        let ranks: HashMap<&str, f32> =
            hits.iter().map(|h| (h.event_id.as_str(), h.rank)).collect();
        let mut visibility = Visibility::new(user_id);
        let visible = visibility.filter_ids(&conn, &ids).await?;
        let mut count = 0;
        for place in store::newest_matches(&conn, &query, MAX_COUNTED).await? {
            if visibility.can_see_placed(&conn, place.placement()).await? {
                count += 1;
            }
        }
        let mut rules_by_room = HashMap::new();

        let context_filter = EventFilter::default();
        let mut results = Vec::new();
        let mut groups: HashMap<&str, Map<String, Value>> = HashMap::new();
        let mut result_rooms = Vec::new();
        for row in visible {
            let rank = ranks
                .get(row.event_id.as_str())
                .copied()
                .unwrap_or_default();
            let rules = self
                .cached_rules(&conn, &mut rules_by_room, &row.room_id)
                .await?;
            let event = self
                .render_with_relations(&conn, rules, user_id, std::slice::from_ref(&row))
                .await?
                .remove(0);
            let mut result = json!({ "rank": rank, "result": event });
            if let Some((before_limit, after_limit, include_profile)) = criteria.context {
                let (before, after) = events_around(
                    &conn,
                    &mut visibility,
                    &row,
                    (before_limit, after_limit),
                    &context_filter,
                )
                .await?;
                let mut context = json!({
                    "events_before": self.render(&conn, rules, &before).await?,
                    "events_after": self.render(&conn, rules, &after).await?,
                    "start": token::pagination(HistoryPosition::before(before.last().unwrap_or(&row))),
                    "end": token::pagination(HistoryPosition::at(after.last().unwrap_or(&row))),
                });
                if include_profile {
                    context["profile_info"] = self.profiles(&conn, &row, &before, &after).await?;
                }
                result["context"] = context;
            }
            for key in &criteria.group_by {
                let group_key = if key == "room_id" {
                    &row.room_id
                } else {
                    &row.sender
                };
                let group = groups.entry(key.as_str()).or_default();
                let order = group.len();
                group
                    .entry(group_key.clone())
                    .or_insert_with(|| json!({ "results": [], "order": order }))["results"]
                    .as_array_mut()
                    .expect("results is a list")
                    .push(Value::from(row.event_id.clone()));
            }
            if !result_rooms.contains(&row.room_id) {
                result_rooms.push(row.room_id.clone());
            }
            results.push(result);
        }

        let words: Vec<String> = criteria
            .term
            .split_whitespace()
            .map(|w| {
                w.trim_matches(|c: char| !c.is_alphanumeric())
                    .to_lowercase()
            })
            .filter(|w| !w.is_empty())
            .collect();
        let mut room_events = json!({ "count": count, "highlights": words, "results": results });
        if hits.len() as i64 == limit {
            room_events["next_batch"] = Value::from(format!("o{}", offset + limit));
        }
        if !groups.is_empty() {
            room_events["groups"] = json!(groups);
        }
        if criteria.include_state {
            let mut state = Map::new();
            for room_id in &result_rooms {
                let room = RoomId::parse(room_id.as_str()).map_err(Error::internal)?;
                state.insert(
                    room_id.clone(),
                    serde_json::to_value(self.room_state(user_id, &room).await?)
                        .map_err(Error::internal)?,
                );
            }
            room_events["state"] = Value::Object(state);
        }
        Ok(json!({ "search_categories": { "room_events": room_events } }))
    }

    /// `profile_info` of a search context: each sender's display name and avatar as of the
    /// result.
    async fn profiles(
        &self,
        conn: &AsyncPgConnection,
        row: &EventRow,
        before: &[EventRow],
        after: &[EventRow],
    ) -> Result<Value> {
        let Some(group) = row.state_group else {
            return Ok(Value::Object(Map::new()));
        };
        let state = state_store::get_state_ids(conn, group).await?;
        let mut profiles = Map::new();
        for sender in std::iter::once(row)
            .chain(before)
            .chain(after)
            .map(|r| &r.sender)
        {
            if profiles.contains_key(sender) {
                continue;
            }
            let Some(member) = state.get(&("m.room.member".to_owned(), sender.clone())) else {
                continue;
            };
            let content = rooms_store::get_state_event(conn, member)
                .await?
                .and_then(|e| e.pdu.get("content").cloned())
                .unwrap_or_default();
            profiles.insert(
                sender.clone(),
                json!({
                    "displayname": content.get("displayname"),
                    "avatar_url": content.get("avatar_url"),
                }),
            );
        }
        Ok(Value::Object(profiles))
    }
}
