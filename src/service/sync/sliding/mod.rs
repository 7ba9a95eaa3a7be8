//! Simplified sliding sync (MSC4186): lists of the user's rooms in activity order, windows
//! over them, room subscriptions and extensions, over a connection that remembers what it
//! sent of each room (see [`connection`]).
//!
//! The room sections reuse `/sync`'s pieces (visibility, rendering, unread counts, stripped
//! state, transaction IDs, receipts); only the assembly differs. An incremental request
//! reads only the rooms that changed since its `pos`, the rooms entering a window and the
//! rooms whose requested config grew.

pub mod connection;
mod extensions;
pub mod lists;
pub mod model;
mod room;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    sync::Arc,
};

use diesel_async::AsyncPgConnection;
use futures_util::{StreamExt, TryStreamExt};
use serde_json::{json, Map, Value};

use self::{
    connection::{unknown_pos, Connection, Pos, RoomStatus},
    lists::UserRoom,
    model::{RoomConfig, SlidingRequest},
    room::{RoomContext, RoomJob},
};
use super::{
    newest::{read_newest, Newest},
    token::SyncToken,
    Computed, Sync, ROOMS_IN_FLIGHT,
};
use crate::{
    error::Result,
    metrics::Resumed,
    service::rooms::Rooms,
    storage::{
        account_data as account_store, e2ee as e2ee_store, push as push_store, receipts, streams,
        timelines::Window,
    },
};

/// A room's unread counts (all threads).
#[derive(Debug, Default, Clone, Copy)]
pub struct RoomCounts {
    /// Notifying events after the read position.
    pub notifications: i64,
    /// Highlighting ones.
    pub highlights: i64,
}

/// One computed response, before its `pos` is known.
struct Sliding {
    body: Map<String, Value>,
    /// Room statuses to record.
    changes: Vec<(String, RoomStatus)>,
    token: SyncToken,
}

impl Sync {
    /// Serves one sliding sync request, long-polling while there is nothing to say; says when
    /// it resumed from a wake-up for what it answers (see [`Resumed`]).
    pub async fn sliding_sync(
        &self,
        rooms: &Rooms,
        request: &SlidingRequest,
    ) -> Result<(Value, Resumed)> {
        let pos = request.pos.as_deref().map(Pos::parse).transpose()?;
        let stateful = !request.lists.is_empty() || !request.subscriptions.is_empty();
        // Boxed (as is the save below): this future stays allocated while the sync is parked,
        // and would otherwise be as large as theirs.
        let connection = Box::pin(connection::open(
            &self.db,
            &self.connections,
            (
                request.user_id.as_str(),
                &request.device_id,
                &request.conn_id,
            ),
            pos.as_ref(),
            stateful,
        ))
        .await?;
        let (computed, resumed) = self
            .long_poll(
                request.user_id.as_str(),
                "sliding",
                request.timeout,
                pos.is_none(),
                || self.compute_sliding(rooms, request, pos.as_ref(), &connection),
            )
            .await?;
        let version = Box::pin(connection::save(
            &self.db,
            &self.connections,
            &connection,
            computed.changes,
        ))
        .await?;
        let mut body = computed.body;
        let rooms = body
            .get("rooms")
            .and_then(Value::as_object)
            .map_or(0, Map::len);
        crate::metrics::metrics()
            .sync_rooms
            .get_or_create(&crate::metrics::ApiLabel { api: "sliding" })
            .observe(rooms as f64);
        body.insert(
            "pos".into(),
            Value::String(
                Pos {
                    version,
                    token: computed.token,
                }
                .to_string(),
            ),
        );
        if let Some(txn_id) = &request.txn_id {
            body.insert("txn_id".into(), Value::String(txn_id.clone()));
        }
        Ok((Value::Object(body), resumed))
    }

    async fn compute_sliding(
        &self,
        rooms: &Rooms,
        request: &SlidingRequest,
        pos: Option<&Pos>,
        connection: &Connection,
    ) -> Result<Computed<Sliding>> {
        let pooled = self.db.conn().await?;
        let conn: &AsyncPgConnection = &pooled;
        let user = request.user_id.as_str();
        // Positions and the user's room list read together: neither depends on the other.
        let (positions, memberships, ignored, direct) = tokio::try_join!(
            async { Ok::<_, crate::error::Error>(streams::positions(conn).await?) },
            self.memberships.get(conn, user),
            crate::service::account_data::ignored_users(conn, user),
            async {
                Ok(
                    account_store::get_account_data(conn, user, account_store::GLOBAL, "m.direct")
                        .await?,
                )
            },
        )?;
        let events_position = self
            .index
            .refresh(conn, positions.persisted(streams::EVENTS))
            .await?;
        let since = pos.map(|p| p.token);
        let next = SyncToken {
            events: events_position,
            account_data: positions.persisted(streams::ACCOUNT_DATA),
            receipts: positions.persisted(streams::RECEIPTS),
            typing: self
                .notifier
                .typing
                .position()
                .max(since.map_or(0, |s| s.typing)),
            presence: since.map_or(0, |s| s.presence),
            device_lists: positions.persisted(e2ee_store::DEVICE_LISTS),
            // The to-device extension keeps its own token.
            to_device: since.map_or(0, |s| s.to_device),
        };
        if let Some(since) = since {
            if since.events > next.events
                || since.account_data > next.account_data
                || since.receipts > next.receipts
                || since.device_lists > next.device_lists
            {
                return Err(unknown_pos("Position from the future"));
            }
        }

        let senders = lists::membership_senders(conn, &memberships).await?;
        let last_changes = self
            .index
            .last_changes(conn, memberships.iter().map(|m| m.0.as_str()))
            .await?;
        // For the device lists: whether the user's memberships or anyone's in their rooms
        // moved.
        let memberships_moved = since.is_some_and(|since| {
            memberships.iter().any(|m| m.3 > since.events)
                || last_changes.iter().any(|c| c.membership > since.events)
        });
        let mut user_rooms = lists::user_rooms(
            &memberships,
            &senders,
            &last_changes,
            user,
            &ignored,
            since.as_ref(),
        );
        let facts = lists::load_facts(
            conn,
            user,
            &mut user_rooms,
            request.lists.values(),
            (lists::direct_rooms(direct.as_ref()), next.account_data),
            &self.room_meta,
        )
        .await?;
        let by_id: HashMap<&str, &UserRoom<'_>> =
            user_rooms.iter().map(|r| (r.room_id, r)).collect();

        // Lists, their windows, and every room they and the subscriptions want, with the
        // combined config.
        let mut lists_json = Map::new();
        // Configs are shared, copied only where a room's lists and subscriptions combine.
        // Indexed like `user_rooms`.
        let mut relevant: Vec<Option<Arc<RoomConfig>>> = vec![None; user_rooms.len()];
        let mut want = |room: &UserRoom<'_>, config: &RoomConfig, shared: &Arc<RoomConfig>| {
            match &mut relevant[room.index] {
                Some(combined) => Arc::make_mut(combined).combine(config),
                none => *none = Some(shared.clone()),
            }
        };
        let mut windows: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (name, list) in &request.lists {
            let built = lists::build_list(&user_rooms, list, &facts);
            // The connection's own copy when it has one, so unchanged rooms compare by pointer.
            let list_config = connection
                .rooms
                .values()
                .map(|status| &status.config)
                .find(|config| ***config == list.config)
                .cloned()
                .unwrap_or_else(|| Arc::new(list.config.clone()));
            let window = windows.entry(name.as_str()).or_default();
            for (_, _, rooms_in) in &built.windows {
                for room in rooms_in {
                    window.push(room.room_id);
                    want(room, &list.config, &list_config);
                }
            }
            let mut list_json = Map::new();
            list_json.insert("count".into(), json!(built.rooms.len()));
            // MSC4186 has no `ops` and no client reads them (they order rooms by
            // `bump_stamp`): a connection's first response shows its windows, for people
            // reading responses; later ones would repeat every window's room IDs each time.
            if pos.is_none() {
                let ops: Vec<Value> = built
                    .windows
                    .iter()
                    .map(|(start, end, rooms_in)| {
                        let ids: Vec<&str> = rooms_in.iter().map(|r| r.room_id).collect();
                        json!({ "op": "SYNC", "range": [start, end], "room_ids": ids })
                    })
                    .collect();
                list_json.insert("ops".into(), Value::Array(ops));
            }
            lists_json.insert(name.clone(), Value::Object(list_json));
        }
        let mut subscribed: Vec<&str> = Vec::new();
        for (room_id, config) in &request.subscriptions {
            // A room the user never had a membership in is ignored.
            let Some(room) = by_id.get(room_id.as_str()) else {
                continue;
            };
            subscribed.push(room.room_id);
            want(room, config, &Arc::new(config.clone()));
        }

        // Rooms whose unread counts moved because the user's own receipts did, and rooms whose
        // room account data changed (one out of every window gets it, all of it, when it
        // comes back); read together.
        let (own_receipts, changed_room_data) = tokio::try_join!(
            async {
                Ok::<HashSet<String>, crate::error::Error>(match since {
                    Some(since) if since.receipts < next.receipts => {
                        receipts::get_user_receipt_rooms_changed(
                            conn,
                            user,
                            since.receipts,
                            next.receipts,
                        )
                        .await?
                        .into_iter()
                        .collect()
                    }
                    _ => HashSet::new(),
                })
            },
            async {
                Ok(match since {
                    Some(since) if since.account_data < next.account_data => {
                        account_store::get_account_data_changed(
                            conn,
                            user,
                            since.account_data,
                            next.account_data,
                        )
                        .await?
                        .into_iter()
                        .map(|(room_id, _, _)| room_id)
                        .filter(|room_id| !room_id.is_empty())
                        .collect()
                    }
                    _ => HashSet::new(),
                })
            },
        )?;

        // What to send of each wanted room, and what the connection will know afterwards.
        let mut jobs = Vec::new();
        let mut changes = Vec::new();
        let wanted = user_rooms
            .iter()
            .zip(&relevant)
            .filter_map(|(room, config)| Some((room, config.as_ref()?)));
        for (room, config) in wanted {
            let room_id = room.room_id;
            let status = connection.rooms.get(room_id);
            let live_from = since.map(|s| s.events);
            let (initial, from) = match status {
                None => (true, None),
                Some(status) => {
                    let from = status.events_from.or(live_from);
                    let membership_moved = status.membership.as_str() != room.membership
                        && (room.membership == "join"
                            || matches!(room.membership, "invite" | "knock"));
                    if membership_moved || from.is_none() {
                        (true, None)
                    } else {
                        (false, from)
                    }
                }
            };
            // The common case, a room asked for as it was sent, skips the comparisons.
            let previous = status
                .filter(|s| !initial && !Arc::ptr_eq(&s.config, config) && s.config != *config);
            let expanded_timeline =
                previous.is_some_and(|s| config.timeline_limit > s.config.timeline_limit);
            let state_grew =
                previous.is_some_and(|s| !config.required_state.within(&s.config.required_state));
            let changed = match (from, status.filter(|_| !initial)) {
                (Some(from), Some(previous)) => {
                    room.activity > from
                        || previous.events_from.is_some()
                        || own_receipts.contains(room_id)
                }
                _ => true,
            };
            if !(initial || changed || expanded_timeline || state_grew) {
                continue;
            }
            let new_status = RoomStatus {
                membership: room.membership.to_owned(),
                events_from: None,
                config: config.clone(),
            };
            if status != Some(&new_status) {
                changes.push((room_id.to_string(), new_status));
            }
            jobs.push(RoomJob {
                room,
                initial,
                from,
                config: config.clone(),
                previous_config: previous
                    .filter(|_| state_grew)
                    .map(|s| RoomConfig::clone(&s.config)),
                expanded_timeline,
                is_dm: facts.direct.contains(room_id),
                replay_extensions: initial
                    || expanded_timeline
                    || status.is_some_and(|s| s.events_from.is_some()),
            });
        }
        // Rooms sent before that changed while out of every window: their updates wait.
        if let Some(since) = since {
            for (room_id, status) in connection.rooms.iter() {
                if status.events_from.is_some() {
                    continue;
                }
                let Some(room) = by_id.get(room_id.as_str()) else {
                    continue;
                };
                if relevant[room.index].is_some() {
                    continue;
                }
                if room.activity > since.events
                    || own_receipts.contains(room_id)
                    || changed_room_data.contains(room_id)
                    || room.membership != status.membership.as_str()
                {
                    changes.push((
                        room_id.clone(),
                        RoomStatus {
                            events_from: Some(since.events),
                            ..status.clone()
                        },
                    ));
                }
            }
        }

        // Unread counts of the joined rooms sent, as of the response's position, read while
        // the rooms are built.
        let counted: Vec<String> = jobs
            .iter()
            .filter(|j| j.room.membership == "join")
            .map(|j| j.room.room_id.to_owned())
            .collect();
        let ctx = RoomContext {
            rooms,
            user: &request.user_id,
            device_id: &request.device_id,
            ignored: &ignored,
            since_events: since.map(|s| s.events),
            up_to: events_position,
        };
        let (counts, built) = tokio::try_join!(
            async {
                let mut counts: HashMap<String, RoomCounts> = HashMap::new();
                if !counted.is_empty() {
                    for row in
                        push_store::get_unread_counts(conn, user, &counted, events_position).await?
                    {
                        let entry = counts.entry(row.room_id).or_default();
                        entry.notifications += row.notifications;
                        entry.highlights += row.highlights;
                    }
                }
                Ok::<_, crate::error::Error>(counts)
            },
            futures_util::stream::iter(jobs)
                .chunks(ROOMS_IN_FLIGHT)
                .map(|batch| self.sliding_batch(conn, &ctx, batch))
                .buffered(2)
                .try_collect::<Vec<_>>(),
        )?;
        let mut built: Vec<(String, bool, room::BuiltRoom)> = built.into_iter().flatten().collect();
        let joined: HashSet<&str> = counted.iter().map(String::as_str).collect();
        for (room_id, _, room) in &mut built {
            if let (true, Value::Object(fields)) =
                (joined.contains(room_id.as_str()), &mut room.value)
            {
                let counts = counts.get(room_id.as_str()).copied().unwrap_or_default();
                fields.insert("notification_count".into(), json!(counts.notifications));
                fields.insert("highlight_count".into(), json!(counts.highlights));
            }
        }

        let (extensions_json, extensions_empty) = self
            .sliding_extensions(
                conn,
                request,
                extensions::Scopes {
                    windows: &windows,
                    subscribed: &subscribed,
                    sent: &built
                        .iter()
                        .map(|(id, fresh, b)| (id.as_str(), (*fresh, b.timeline_ids.as_slice())))
                        .collect(),
                    memberships_moved,
                },
                (since, next),
                &ignored,
                &positions,
            )
            .await?;
        let mut rooms_json = Map::new();
        for (room_id, _, room) in built {
            rooms_json.insert(room_id, room.value);
        }
        let empty = rooms_json.is_empty() && extensions_empty;
        let mut body = Map::new();
        body.insert("lists".into(), Value::Object(lists_json));
        body.insert("rooms".into(), Value::Object(rooms_json));
        body.insert("extensions".into(), extensions_json);
        Ok(Computed {
            response: Sliding {
                body,
                changes,
                token: next,
            },
            empty,
            positions,
        })
    }

    /// Builds a batch of rooms: their newest events, those events' relations and the device's
    /// transaction IDs are one statement each for the batch; then each room, all at once on
    /// the connection. Each comes back with its ID and whether its extensions start afresh.
    async fn sliding_batch(
        &self,
        conn: &AsyncPgConnection,
        ctx: &RoomContext<'_>,
        batch: Vec<RoomJob<'_>>,
    ) -> Result<Vec<(String, bool, room::BuiltRoom)>> {
        let windows: Vec<Window> = batch.iter().filter_map(|job| job.window(ctx)).collect();
        let (mut newest, extras) =
            read_newest(conn, ctx.user.as_str(), ctx.device_id, &windows, true).await?;
        let rooms = batch.into_iter().map(|job| {
            let room_id = job.room.room_id.to_owned();
            let fresh = job.replay_extensions;
            let timeline = Newest {
                rows: newest.remove(&room_id).unwrap_or_default(),
                extras: &extras,
            };
            async move {
                let built = self.sliding_room(conn, ctx, job, timeline).await?;
                Ok::<_, crate::error::Error>((room_id, fresh, built))
            }
        });
        futures_util::future::try_join_all(rooms).await
    }
}

/// The rooms of lists' windows and of subscriptions an extension covers.
fn scoped<'a>(
    scope: &model::Scope,
    windows: &BTreeMap<&'a str, Vec<&'a str>>,
    subscribed: &[&'a str],
) -> BTreeSet<&'a str> {
    let mut rooms = BTreeSet::new();
    for (name, window) in windows {
        if scope
            .lists
            .as_ref()
            .is_none_or(|lists| lists.iter().any(|l| l == "*" || l == name))
        {
            rooms.extend(window.iter().copied());
        }
    }
    for room in subscribed {
        if scope
            .rooms
            .as_ref()
            .is_none_or(|wanted| wanted.iter().any(|r| r == "*" || r == room))
        {
            rooms.insert(*room);
        }
    }
    rooms
}
