//! History visibility: who may see which event. The event read paths (`/sync`, `/messages`,
//! `/event`, `/context`, `/search`, `/relations`, `/threads`, posting a receipt) go through
//! [`Visibility`]; the state reads (`/state`, `/members`) apply their own world-readable and
//! state-at-leave rule in `read.rs` (`view`).

use std::collections::HashMap;

use diesel_async::AsyncPgConnection;
use ruma::UserId;
use serde_json::Value;

use crate::{
    error::Result,
    storage::{
        dag::HistoryPosition,
        memberships as membership_store,
        rooms::{self as store, EventRow, Placement},
        state::{self as state_store, StateIds},
    },
};

/// Answers "may this user see this event?", caching state lookups for one request.
pub struct Visibility<'u> {
    user_id: &'u UserId,
    states: HashMap<i64, StateIds>,
    contents: HashMap<String, Value>,
    /// Per room: the position of the user's current join, if they are joined now.
    joined_since: HashMap<String, Option<i64>>,
    /// Per room: where in history (topological order) the user's latest join event is, if they
    /// ever joined (looked up once, so paging a departed user's history costs one query, not
    /// one per event).
    last_join: HashMap<String, Option<HistoryPosition>>,
}

impl<'u> Visibility<'u> {
    /// A checker for one reader.
    pub fn new(user_id: &'u UserId) -> Self {
        Visibility {
            user_id,
            states: HashMap::new(),
            contents: HashMap::new(),
            joined_since: HashMap::new(),
            last_join: HashMap::new(),
        }
    }

    /// Records the user's current membership of a room when the caller has it already (the
    /// position it took effect at), saving the lookup.
    pub fn know_membership(&mut self, room_id: &str, membership: &str, position: i64) {
        self.joined_since.insert(
            room_id.to_owned(),
            (membership == "join").then_some(position),
        );
    }

    async fn state_content(
        &mut self,
        conn: &AsyncPgConnection,
        group: i64,
        kind: &str,
        key: &str,
    ) -> Result<Option<Value>> {
        if let std::collections::hash_map::Entry::Vacant(entry) = self.states.entry(group) {
            entry.insert(state_store::get_state_ids(conn, group).await?);
        }
        let Some(event_id) = self.states[&group]
            .get(&(kind.to_owned(), key.to_owned()))
            .cloned()
        else {
            return Ok(None);
        };
        if !self.contents.contains_key(&event_id) {
            let content = store::get_state_event(conn, &event_id)
                .await?
                .and_then(|e| e.pdu.get("content").cloned())
                .unwrap_or_default();
            self.contents.insert(event_id.clone(), content);
        }
        Ok(self.contents.get(&event_id).cloned())
    }

    /// The stored events with these IDs that the reader may see, in the order given.
    pub async fn filter_ids(
        &mut self,
        conn: &AsyncPgConnection,
        ids: &[String],
    ) -> Result<Vec<EventRow>> {
        let mut rows: HashMap<String, EventRow> = store::get_events(conn, ids)
            .await?
            .into_iter()
            .map(|r| (r.event_id.clone(), r))
            .collect();
        let mut visible = Vec::new();
        for id in ids {
            if let Some(row) = rows.remove(id) {
                if self.can_see(conn, &row).await? {
                    visible.push(row);
                }
            }
        }
        Ok(visible)
    }

    /// The spec's algorithm, judged on the state at the event:
    /// world_readable; joined at the event; `shared` and joined at any point since (in
    /// topological order); or invited at the event with `invited` visibility. A user always
    /// sees their own membership events. An event without state of its own (an outlier) is
    /// never seen: the read queries leave those out already.
    pub async fn can_see(&mut self, conn: &AsyncPgConnection, event: &EventRow) -> Result<bool> {
        self.can_see_placed(conn, event.placement()).await
    }

    /// [`Self::can_see`] judged on the event's place alone (what a count of matches reads).
    pub async fn can_see_placed(
        &mut self,
        conn: &AsyncPgConnection,
        event: Placement<'_>,
    ) -> Result<bool> {
        let user = self.user_id.as_str();
        let Some(state_group) = event.state_group else {
            return Ok(false);
        };
        if event.event_type == "m.room.member" && event.state_key == Some(user) {
            return Ok(true);
        }
        if !self.joined_since.contains_key(event.room_id) {
            let membership =
                membership_store::get_membership_position(conn, event.room_id, user).await?;
            let joined = membership.and_then(|(m, position)| (m == "join").then_some(position));
            self.joined_since.insert(event.room_id.to_owned(), joined);
        }
        // Fast path: joined without a break since before the event, so joined at the event.
        // Only for an event that arrived after the join: a backfilled one (negative position)
        // came later but belongs earlier, so it is judged on its own state below.
        let joined_since = self.joined_since[event.room_id];
        if joined_since
            .is_some_and(|position| event.stream_ordering > 0 && event.stream_ordering >= position)
        {
            return Ok(true);
        }
        let visibility = self
            .state_content(conn, state_group, "m.room.history_visibility", "")
            .await?
            .and_then(|c| {
                c.get("history_visibility")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .unwrap_or_else(|| "shared".to_owned());
        if visibility == "world_readable" {
            return Ok(true);
        }
        let membership = self
            .state_content(conn, state_group, "m.room.member", user)
            .await?
            .and_then(|c| {
                c.get("membership")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .unwrap_or_default();
        if membership == "join" {
            return Ok(true);
        }
        if visibility == "shared" {
            if joined_since.is_some() {
                return Ok(true);
            }
            if !self.last_join.contains_key(event.room_id) {
                let last =
                    membership_store::get_last_join_position(conn, event.room_id, user).await?;
                self.last_join.insert(event.room_id.to_owned(), last);
            }
            if self.last_join[event.room_id]
                .is_some_and(|join| join > HistoryPosition::after(event))
            {
                return Ok(true);
            }
        }
        Ok(membership == "invite" && visibility == "invited")
    }
}
