//! `/sync`: per-room deltas since a token, with long-polling. One function (`compute`) builds
//! the whole response; per-room sections are built concurrently.

pub mod filter;
mod long_poll;
pub mod memberships;
mod newest;
pub mod room_index;
mod section;
pub mod sliding;
pub mod token;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use diesel_async::AsyncPgConnection;
use futures_util::{FutureExt, StreamExt, TryStreamExt};
use ruma::{push::Ruleset, OwnedDeviceId, OwnedUserId};
use serde::Serialize;
use serde_json::{json, value::RawValue, Value};

pub use self::filter::{keep_fields, EventFilter, SyncFilter};
use self::{
    room_index::RoomIndex,
    section::{state_at, Events, JoinedFacts},
    token::SyncToken,
};
use super::{
    e2ee::{
        keys::{device_list_delta, one_time_key_counts},
        to_device,
    },
    notifier::Notifier,
    presence::Presence,
    push_rules::{push_rules_event, PUSH_RULES_TYPE},
    rooms::Rooms,
};
use crate::{
    error::{Error, Result},
    metrics::Resumed,
    storage::{
        account_data as account_store, e2ee as e2ee_store, memberships as membership_store,
        push as push_store, rooms as store, state as state_store, streams,
        to_device as to_device_store, Db,
    },
};

/// One `/sync` call, owned: it lives as long as the sync waits.
pub struct SyncRequest {
    /// The syncing user.
    pub user_id: OwnedUserId,
    /// Their device (for the remote echo's `transaction_id`).
    pub device_id: OwnedDeviceId,
    /// Where the previous sync ended.
    pub since: Option<SyncToken>,
    /// Send the full state of every room.
    pub full_state: bool,
    /// How long to wait for something to happen.
    pub timeout: Duration,
    /// What to include.
    pub filter: SyncFilter,
}

/// The sync service.
pub struct Sync {
    db: Db,
    index: RoomIndex,
    /// Sliding sync connections' room statuses this process has read or written.
    connections: sliding::connection::Cache,
    /// Rooms' facts the sliding sync filters read, kept while the rooms do not change.
    room_meta: sliding::lists::MetaCache,
    /// Users' membership lists, kept while they do not change.
    memberships: memberships::MembershipCache,
    notifier: Arc<Notifier>,
    presence: Arc<Presence>,
}

/// How many members a room summary names.
const HEROES: usize = 5;

/// How many rooms' sections are built at once (their queries pipelined on one connection); a
/// sync's batch of rooms, whose newest events are read in one statement.
const ROOMS_IN_FLIGHT: usize = 32;

/// How many of a `/sync`'s batches of rooms are built at once: while one batch's state
/// statement runs, the others' sections are rendered. Four instead of two took a lazy initial
/// sync of 500 rooms of 20 members from 175 to 156 ms (medians of two rounds).
const BATCHES_IN_FLIGHT: usize = 4;

/// One computed response (`/sync`'s or sliding sync's).
struct Computed<T> {
    response: T,
    /// Whether it carries nothing.
    empty: bool,
    /// Where the streams stood when it was read.
    positions: streams::Positions,
}

/// One room of a sync response, to be built.
struct RoomJob<'r> {
    room_id: &'r str,
    /// The user's membership event in the room, the membership and its stream position.
    membership_event: &'r str,
    membership: &'r str,
    membership_position: i64,
    /// Room account data to include.
    data: Vec<Value>,
    kind: JobKind,
}

/// Which section a room goes into.
enum JobKind {
    Join {
        range: Range,
        ephemeral: Vec<Value>,
        /// Whether to send the room summary (member counts, heroes).
        summary: bool,
    },
    Stripped {
        knock: bool,
    },
    Leave {
        range: Range,
    },
}

/// A room's section in a response: which part it goes in, the room, the section.
type Section<'r> = (&'static str, &'r str, Box<RawValue>);

impl RoomJob<'_> {
    /// The part of the room's history its section covers, if it has a timeline.
    fn range(&self) -> Option<&Range> {
        match &self.kind {
            JobKind::Join { range, .. } | JobKind::Leave { range } => Some(range),
            JobKind::Stripped { .. } => None,
        }
    }
}

/// Which part of a room's history a section covers.
struct Range {
    /// Exclusive start (`None`: from the beginning, i.e. a full section).
    since: Option<i64>,
    /// Inclusive end.
    up_to: i64,
}

impl Sync {
    /// Creates the service.
    pub fn new(db: Db, notifier: Arc<Notifier>, presence: Arc<Presence>) -> Self {
        Sync {
            index: RoomIndex::default(),
            connections: Default::default(),
            room_meta: Default::default(),
            memberships: Default::default(),
            db,
            notifier,
            presence,
        }
    }

    /// Checks a random sample of the room-change index against the events table (the
    /// consistency sampler): how many rooms agreed, and a line for each that did not.
    pub async fn check_room_index(&self, sample: usize) -> Result<(usize, Vec<String>)> {
        let conn = self.db.conn().await?;
        let positions = streams::positions(&conn).await?;
        // Bring it up to date first, as a sync would.
        self.index
            .refresh(&conn, positions.persisted(streams::EVENTS))
            .await?;
        self.index.check_sample(&conn, sample).await
    }

    /// Runs a sync, waiting up to the timeout for something to report; says when it resumed
    /// from a wake-up for what it answers (see [`Resumed`]).
    pub async fn sync(
        &self,
        rooms: &Rooms,
        request: &SyncRequest,
    ) -> Result<(SyncResponse, Resumed)> {
        let at_once = request.since.is_none() || request.full_state;
        let (response, resumed) = self
            .long_poll(
                request.user_id.as_str(),
                "v3",
                request.timeout,
                at_once,
                || self.compute(rooms, request),
            )
            .await?;
        crate::metrics::metrics()
            .sync_rooms
            .get_or_create(&crate::metrics::ApiLabel { api: "v3" })
            .observe(response.room_count() as f64);
        Ok((response, resumed))
    }

    /// Builds one response.
    async fn compute(
        &self,
        rooms: &Rooms,
        request: &SyncRequest,
    ) -> Result<Computed<SyncResponse>> {
        let pooled = self.db.conn().await?;
        // Shared: independent queries are pipelined (one round trip for many).
        let conn: &AsyncPgConnection = &pooled;
        // Every stream up to its persisted-up-to position: nothing below it is still to come.
        let positions = streams::positions(conn).await?;
        let events_position = self
            .index
            .refresh(conn, positions.persisted(streams::EVENTS))
            .await?;
        let account_position = positions.persisted(streams::ACCOUNT_DATA);
        let receipts_position = positions.persisted(streams::RECEIPTS);
        let presence_position = positions.persisted(streams::PRESENCE);
        let device_lists_position = positions.persisted(e2ee_store::DEVICE_LISTS);
        let to_device_position = positions.persisted(to_device_store::TO_DEVICE);
        let typing = &self.notifier.typing;
        let mut next = SyncToken {
            events: events_position,
            account_data: account_position,
            receipts: receipts_position,
            // Another process's clock may be a little ahead; never go back from the token.
            typing: typing.position().max(request.since.map_or(0, |s| s.typing)),
            presence: presence_position,
            device_lists: device_lists_position,
            to_device: to_device_position,
        };
        if let Some(since) = request.since {
            if since.events > next.events
                || since.account_data > next.account_data
                || since.receipts > next.receipts
                || since.presence > next.presence
                || since.device_lists > next.device_lists
                || since.to_device > next.to_device
            {
                return Err(Error::invalid_param(
                    "Unknown sync token (it is not from this server)",
                ));
            }
        }
        let since = request.since.filter(|_| !request.full_state);
        let user = request.user_id.as_str();

        // Account data (global and per room), ignored users and memberships.
        let (changed_data, ignored, memberships) = tokio::try_join!(
            async {
                Ok(account_store::get_account_data_changed(
                    conn,
                    user,
                    request.since.map_or(0, |s| s.account_data),
                    account_position,
                )
                .await?)
            },
            crate::service::account_data::ignored_users(conn, user),
            self.memberships.get(conn, user),
        )?;
        let mut global_data = Vec::new();
        let mut room_data: HashMap<String, Vec<Value>> = HashMap::new();
        for (room_id, kind, content) in changed_data {
            let filter = if room_id.is_empty() {
                &request.filter.account_data
            } else {
                &request.filter.room_account_data
            };
            if !filter.allows(&kind, user, None) {
                continue;
            }
            let event = json!({ "type": kind, "content": content });
            if room_id.is_empty() {
                global_data.push(event);
            } else {
                room_data.entry(room_id).or_default().push(event);
            }
        }

        // Clients read their push rules from the first sync; a user who never changed them
        // has no stored entry, so the defaults are sent.
        if request.since.is_none()
            && request
                .filter
                .account_data
                .allows(PUSH_RULES_TYPE, user, None)
            && !global_data.iter().any(|e| e["type"] == PUSH_RULES_TYPE)
        {
            global_data.push(push_rules_event(&Ruleset::server_default(&request.user_id)));
        }

        let joined_rooms: Vec<String> = memberships
            .iter()
            .filter(|m| m.1 == "join")
            .map(|m| m.0.clone())
            .collect();
        let mut receipts = self
            .receipts(
                conn,
                &joined_rooms,
                request.since.map_or(0, |s| s.receipts),
                receipts_position,
                user,
            )
            .await?;
        let mut typing_events =
            typing.changed_since(&joined_rooms, since.map(|s| s.typing), next.typing);
        let changes = match request.since {
            Some(token) => Some(
                self.index
                    .changed_since(conn, memberships.iter().map(|m| m.0.as_str()), token.events)
                    .await?,
            ),
            None => None,
        };
        let memberships_changed = changes
            .as_ref()
            .is_some_and(|c| !c.membership_rooms.is_empty());
        let (changed, members_moved): (HashSet<&str>, HashSet<&str>) = match (since, changes) {
            (Some(_), Some(changes)) => (
                changes.rooms.into_iter().collect(),
                changes.membership_rooms,
            ),
            _ => Default::default(),
        };
        // What each room needs, decided in order; then the sections are built concurrently
        // on the one connection, so their queries share round trips.
        let mut jobs = Vec::new();
        for (room_id, membership, event_id, membership_position) in memberships.iter() {
            if !request.filter.wants_room(room_id) {
                continue;
            }
            let membership_changed = since.is_none_or(|s| *membership_position > s.events);
            let data = room_data.remove(room_id).unwrap_or_default();
            let kind = match membership.as_str() {
                "join" => {
                    let mut ephemeral: Vec<Value> = receipts.remove(room_id).into_iter().collect();
                    if let Some(users) = typing_events.remove(room_id) {
                        let users: Vec<String> =
                            users.into_iter().filter(|u| !ignored.contains(u)).collect();
                        ephemeral
                            .push(json!({ "type": "m.typing", "content": { "user_ids": users } }));
                    }
                    if !membership_changed
                        && !changed.contains(room_id.as_str())
                        && data.is_empty()
                        && ephemeral.is_empty()
                    {
                        continue;
                    }
                    // A room joined since the token is sent in full.
                    let range = Range {
                        since: if membership_changed {
                            None
                        } else {
                            since.map(|s| s.events)
                        },
                        up_to: events_position,
                    };
                    // The summary when first sent and when memberships moved: it may be left
                    // out while unchanged (spec), and counting a big room's members for every
                    // message would cost each of its members' syncs.
                    let summary = range.since.is_none() || members_moved.contains(room_id.as_str());
                    JobKind::Join {
                        range,
                        ephemeral,
                        summary,
                    }
                }
                "invite" if membership_changed => JobKind::Stripped { knock: false },
                "knock" if membership_changed => JobKind::Stripped { knock: true },
                "leave" | "ban"
                    if (since.is_some() && membership_changed)
                        || (since.is_none() && request.filter.include_leave) =>
                {
                    JobKind::Leave {
                        range: Range {
                            since: since.map(|s| s.events),
                            up_to: *membership_position,
                        },
                    }
                }
                _ => continue,
            };
            jobs.push(RoomJob {
                room_id,
                membership_event: event_id,
                membership,
                membership_position: *membership_position,
                data,
                kind,
            });
        }
        // Unread counts as of the response's token (so a count never runs ahead of the timeline
        // it comes with) and the summaries to send, each one statement for every room, read
        // alongside the sections; each joined room's section waits for them, then is
        // serialised.
        let join_rooms: Vec<String> = jobs
            .iter()
            .filter(|job| matches!(job.kind, JobKind::Join { .. }))
            .map(|job| job.room_id.to_owned())
            .collect();
        let summary_rooms: Vec<String> = jobs
            .iter()
            .filter(|job| matches!(job.kind, JobKind::Join { summary: true, .. }))
            .map(|job| job.room_id.to_owned())
            .collect();
        let joined_facts = async move {
            let (counts, summaries) = tokio::try_join!(
                async {
                    match join_rooms.is_empty() {
                        true => Ok(Vec::new()),
                        false => {
                            push_store::get_unread_counts(conn, user, &join_rooms, events_position)
                                .await
                        }
                    }
                },
                async {
                    match summary_rooms.is_empty() {
                        true => Ok(Vec::new()),
                        false => {
                            membership_store::get_membership_summaries(
                                conn,
                                &summary_rooms,
                                user,
                                HEROES as i32,
                            )
                            .await
                        }
                    }
                },
            )
            .map_err(|err| err.to_string())?;
            Ok(Arc::new(JoinedFacts::new(counts, summaries)))
        }
        .shared();
        let sections = futures_util::stream::iter(jobs)
            .chunks(ROOMS_IN_FLIGHT)
            .map(|batch| {
                self.batch_sections(rooms, conn, &ignored, request, batch, joined_facts.clone())
            })
            .buffered(BATCHES_IN_FLIGHT)
            .try_collect::<Vec<_>>();
        let (_, sections) = tokio::try_join!(
            async { joined_facts.clone().await.map_err(Error::internal) },
            sections
        )?;
        let mut sync_rooms = SyncRooms::default();
        for (part, room_id, section) in sections.into_iter().flatten().flatten() {
            let target = match part {
                "join" => &mut sync_rooms.join,
                "invite" => &mut sync_rooms.invite,
                "knock" => &mut sync_rooms.knock,
                _ => &mut sync_rooms.leave,
            };
            target.insert(room_id.to_owned(), section);
        }
        let (
            presence,
            (to_device, to_device_reached),
            (changed_devices, left_devices),
            one_time_keys_count,
            unused_fallback,
        ) = tokio::try_join!(
            async {
                self.presence
                    .events_for(
                        conn,
                        user,
                        request.since.map_or(0, |s| s.presence),
                        presence_position,
                    )
                    .await
            },
            to_device::take_for_sync(
                conn,
                user,
                request.device_id.as_str(),
                request.since.map_or(0, |s| s.to_device),
                to_device_position,
            ),
            async {
                match request.since {
                    Some(since) => {
                        // Memberships are looked at only where the room index saw one change.
                        let events_up_to = if memberships_changed {
                            events_position
                        } else {
                            since.events
                        };
                        device_list_delta(
                            conn,
                            user,
                            (since.device_lists, device_lists_position),
                            (since.events, events_up_to),
                        )
                        .await
                    }
                    None => Ok((Vec::new(), Vec::new())),
                }
            },
            one_time_key_counts(conn, user, request.device_id.as_str()),
            async {
                Ok(e2ee_store::get_unused_fallback_algorithms(
                    conn,
                    user,
                    request.device_id.as_str(),
                )
                .await?)
            },
        )?;
        let presence: Vec<Value> = presence
            .into_iter()
            .filter(|event| {
                let sender = event["sender"].as_str().unwrap_or_default();
                !ignored.contains(sender)
                    && request.filter.presence.allows("m.presence", sender, None)
            })
            .collect();
        next.to_device = to_device_reached;
        let empty = sync_rooms.join.is_empty()
            && sync_rooms.invite.is_empty()
            && sync_rooms.leave.is_empty()
            && sync_rooms.knock.is_empty()
            && global_data.is_empty()
            && presence.is_empty()
            && to_device.is_empty()
            && changed_devices.is_empty()
            && left_devices.is_empty();
        Ok(Computed {
            response: SyncResponse {
                next_batch: next.to_string(),
                rooms: sync_rooms,
                account_data: to_raw_value(&Events {
                    events: global_data,
                })?,
                presence: to_raw_value(&Events { events: presence })?,
                to_device: to_raw_value(&Events { events: to_device })?,
                device_lists: to_raw_value(
                    &json!({ "changed": changed_devices, "left": left_devices }),
                )?,
                device_one_time_keys_count: to_raw_value(&one_time_keys_count)?,
                device_unused_fallback_key_types: to_raw_value(&unused_fallback)?,
            },
            empty,
            positions,
        })
    }

    /// `m.receipt` events per room for receipts changed in `(after, up_to]`; other users'
    /// private receipts are never included.
    async fn receipts(
        &self,
        conn: &AsyncPgConnection,
        room_ids: &[String],
        after: i64,
        up_to: i64,
        user: &str,
    ) -> Result<HashMap<String, Value>> {
        let receipts =
            crate::storage::receipts::get_receipts_changed(conn, room_ids, after, up_to).await?;
        Ok(super::rooms::receipts::receipt_events(receipts, Some(user)))
    }

    /// Stripped state for an invite or knock: what a client shows before joining.
    async fn stripped_state(
        &self,
        conn: &AsyncPgConnection,
        membership_event: &str,
    ) -> Result<Vec<Value>> {
        let Some(event) = store::get_state_event(conn, membership_event).await? else {
            return Ok(Vec::new());
        };
        // An out-of-band invite (an outlier) has no state here: it is shown on its own.
        let state = match event.state_group {
            Some(group) => state_store::get_state_ids(conn, group).await?,
            None => state_store::StateIds::new(),
        };
        let wanted = [
            "m.room.create",
            "m.room.join_rules",
            "m.room.name",
            "m.room.avatar",
            "m.room.canonical_alias",
            "m.room.encryption",
            "m.room.topic",
        ];
        let mut ids: Vec<String> = state
            .iter()
            .filter(|((t, _), _)| wanted.contains(&t.as_str()))
            .map(|(_, id)| id.clone())
            .collect();
        ids.push(event.event_id.clone());
        if let Some(sender_member) = state.get(&("m.room.member".to_owned(), event.sender.clone()))
        {
            ids.push(sender_member.clone());
        }
        let rows = store::get_state_events(conn, &ids).await?;
        Ok(rows
            .iter()
            .map(|r| {
                json!({
                    "type": r.event_type,
                    "state_key": r.state_key,
                    "sender": r.sender,
                    "content": r.pdu.get("content").cloned().unwrap_or_default(),
                })
            })
            .collect())
    }
}

fn to_raw_value(section: &impl Serialize) -> Result<Box<RawValue>> {
    serde_json::value::to_raw_value(section).map_err(Error::internal)
}

/// A `/sync` response. Each section is serialised as soon as it is built: a big initial sync
/// never holds every room's JSON tree at once (measured: 500 rooms with full member state
/// peaked at 116 MiB when they were all held), and an empty response kept while its sync is
/// parked is a few hundred bytes rather than a tree of maps.
#[derive(Serialize)]
pub struct SyncResponse {
    next_batch: String,
    rooms: SyncRooms,
    account_data: Box<RawValue>,
    presence: Box<RawValue>,
    to_device: Box<RawValue>,
    device_lists: Box<RawValue>,
    device_one_time_keys_count: Box<RawValue>,
    device_unused_fallback_key_types: Box<RawValue>,
}

impl SyncResponse {
    /// How many rooms the response carries.
    pub fn room_count(&self) -> usize {
        let rooms = &self.rooms;
        rooms.join.len() + rooms.invite.len() + rooms.leave.len() + rooms.knock.len()
    }
}

#[derive(Serialize, Default)]
struct SyncRooms {
    join: BTreeMap<String, Box<RawValue>>,
    invite: BTreeMap<String, Box<RawValue>>,
    leave: BTreeMap<String, Box<RawValue>>,
    knock: BTreeMap<String, Box<RawValue>>,
}
