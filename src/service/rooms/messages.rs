//! `/messages`: paging through a room's history in topological order, visibility-checked in
//! the query loop so a page is never empty while visible events remain.

use std::collections::HashSet;

use diesel_async::AsyncPgConnection;
use ruma::{RoomId, UserId};
use serde_json::{json, Value};

use super::{visibility::Visibility, Rooms};
use crate::{
    error::{Error, Result},
    service::sync::{
        token::{pagination, Pagination},
        EventFilter,
    },
    storage::{
        dag::{self, HistoryPosition},
        memberships as membership_store, rooms as store, state as state_store,
    },
};

/// Most events scanned for one page: bounds the work a page of invisible history costs.
const MAX_SCANNED: usize = 5_000;

/// Events read at a time: a page's first batch is its size (each event read and not served
/// is its JSON sent by PostgreSQL for nothing), within these bounds; each further batch, read
/// because events were left out, is twice the one before.
const MIN_BATCH: usize = 10;
const MAX_BATCH: usize = 200;

/// One page of history.
pub struct Page {
    /// Events in the requested direction.
    pub chunk: Vec<Value>,
    /// Token of the page's start.
    pub start: String,
    /// Token to continue from; `None` at the end of history.
    pub end: Option<String>,
    /// Member events for the chunk's senders (lazy loading).
    pub state: Vec<Value>,
}

/// A `/messages` request.
pub struct PageRequest<'a> {
    /// Reader.
    pub user_id: &'a UserId,
    /// Room.
    pub room_id: &'a RoomId,
    /// Start point (`None`: the end of the room for backwards, its start for forwards).
    pub from: Option<Pagination>,
    /// Stop point.
    pub to: Option<Pagination>,
    /// Backwards in time.
    pub backwards: bool,
    /// Events wanted.
    pub limit: usize,
    /// Send the member events the chunk needs.
    pub lazy_load_members: bool,
    /// Which events the client wants (types, senders, `contains_url`).
    pub filter: EventFilter,
}

/// Where a token points in a room's history (`None`: `default`).
pub(super) async fn history_position(
    conn: &AsyncPgConnection,
    room_id: &str,
    token: Option<Pagination>,
    default: HistoryPosition,
) -> Result<HistoryPosition> {
    Ok(match token {
        None => default,
        Some(Pagination::Topological(position)) => position,
        Some(Pagination::Stream(stream)) => {
            dag::get_position_at_stream(conn, room_id, stream).await?
        }
    })
}

impl Rooms {
    /// One page of a room's history, in topological order.
    pub async fn messages(&self, request: &PageRequest<'_>) -> Result<Page> {
        let pooled = self.db.conn().await?;
        // Shared: independent queries are pipelined.
        let conn: &AsyncPgConnection = &pooled;
        let room_id = request.room_id.as_str();
        let user = request.user_id.as_str();
        let (room, membership, ignored) = tokio::try_join!(
            async { Ok(store::get_room(conn, room_id).await?) },
            async { Ok(membership_store::get_membership_position(conn, room_id, user).await?) },
            crate::service::account_data::ignored_users(conn, user),
        )?;
        let room = room.ok_or_else(|| Error::forbidden("You are not in this room"))?;
        if membership.is_none() {
            let state = state_store::get_state_ids(conn, room.current_state_group).await?;
            let visibility =
                match state.get(&("m.room.history_visibility".to_owned(), String::new())) {
                    Some(id) => store::get_state_event(conn, id)
                        .await?
                        .and_then(|e| e.pdu.pointer("/content/history_visibility").cloned()),
                    None => None,
                };
            if visibility != Some(json!("world_readable")) {
                return Err(Error::forbidden("You are not in this room"));
            }
        }
        let (from, to) = match request.backwards {
            true => (HistoryPosition::END, HistoryPosition::START),
            false => (HistoryPosition::START, HistoryPosition::END),
        };
        let (from, to) = tokio::try_join!(
            history_position(conn, room_id, request.from, from),
            history_position(conn, room_id, request.to, to),
        )?;
        let mut visibility = Visibility::new(request.user_id);
        if let Some((membership, position)) = &membership {
            visibility.know_membership(room_id, membership, *position);
        }
        let mut found = Vec::new();
        let mut cursor = from;
        let mut scanned = 0;
        let mut exhausted = false;
        let mut batch = request.limit.clamp(MIN_BATCH, MAX_BATCH);
        while !exhausted && found.len() < request.limit && scanned < MAX_SCANNED {
            let (after, up_to) = match request.backwards {
                true => (to, cursor),
                false => (cursor, to),
            };
            let rows =
                dag::get_room_history(conn, room_id, after, up_to, request.backwards, batch as i64)
                    .await?;
            let batch_len = rows.len();
            // A short batch is the rest of the range: no query to find it empty.
            exhausted = batch_len < batch;
            // Another batch means events were left out: ask for more at a time.
            batch = (batch * 2).min(MAX_BATCH);
            for (read, row) in rows.into_iter().enumerate() {
                scanned += 1;
                cursor = match request.backwards {
                    true => HistoryPosition::before(&row),
                    false => HistoryPosition::at(&row),
                };
                if !ignored.contains(&row.sender)
                    && request.filter.allows_row(&row)
                    && visibility.can_see(conn, &row).await?
                {
                    found.push(row);
                    if found.len() == request.limit {
                        // Events of this batch left unread: the history goes on.
                        exhausted &= read + 1 == batch_len;
                        break;
                    }
                }
            }
        }
        let rules = super::versions::rules_for(&room.room_version)?;
        let mut state = Vec::new();
        let first_group = found.first().and_then(|first| first.state_group);
        if let (true, Some(first_group)) = (request.lazy_load_members, first_group) {
            // The senders' member events as of the page, not as of now: a departed reader
            // must not learn later names, avatars or bans.
            let senders: HashSet<&str> = found.iter().map(|r| r.sender.as_str()).collect();
            let at_page = state_store::get_state_ids(conn, first_group).await?;
            let ids: Vec<String> = senders
                .into_iter()
                .filter_map(|sender| {
                    at_page
                        .get(&("m.room.member".to_owned(), sender.to_owned()))
                        .cloned()
                })
                .collect();
            let rows = store::get_state_events(conn, &ids).await?;
            state = self.render(conn, &rules, &rows).await?;
        }
        let (chunk, start) = tokio::try_join!(
            self.render_with_relations(conn, &rules, request.user_id, &found),
            async {
                Ok(match from == HistoryPosition::END {
                    true => dag::get_history_end(conn, room_id).await?,
                    false => from,
                })
            },
        )?;
        Ok(Page {
            chunk,
            start: pagination(start),
            end: (!exhausted).then(|| pagination(cursor)),
            state,
        })
    }
}
