//! What each new event means for each local member: push-rule evaluation at write time, and
//! the check that recomputes it from events, receipts and push rules.
//!
//! Counts are not maintained by writes: `/sync` counts the push actions after the user's read
//! position (starting from the counts it kept for the member at an earlier sync, when they
//! still hold: see `storage::push::get_unread_counts`). So the only maintained data is one row
//! per (event, member) that notifies or counts as unread, written in the event's own
//! transaction, deleted when the event is redacted or the member leaves.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use diesel_async::AsyncPgConnection;
use ruma::{
    events::{
        room::power_levels::{RoomPowerLevels, RoomPowerLevelsEventContent, RoomPowerLevelsSource},
        AnySyncTimelineEvent,
    },
    push::{Action, FlattenedJson, PushConditionPowerLevelsCtx, PushConditionRoomCtx, Ruleset},
    room_version_rules::RoomVersionRules,
    serde::Raw,
    OwnedUserId, RoomId, ServerName, UInt, UserId,
};
use serde_json::Value;

use super::versions::rules_for;
use crate::{
    error::{Error, Result},
    service::push_rules::{load_rulesets, PUSH_RULES_TYPE},
    storage::{
        memberships as membership_store,
        push::{self as store, NewPushActions, PushActionRow, SharedPushAction},
        rooms as rooms_store, state as state_store, summaries as summaries_store,
    },
};

/// What push rules need to know about the room when an event arrives.
struct RoomContext {
    member_count: UInt,
    power_levels: Option<PushConditionPowerLevelsCtx>,
}

impl RoomContext {
    /// From the joined member count and the `m.room.power_levels` and `m.room.create` PDUs.
    fn new(
        member_count: usize,
        power_levels: Option<&Value>,
        create: Option<&Value>,
        rules: &RoomVersionRules,
    ) -> Self {
        let content: Option<RoomPowerLevelsEventContent> = power_levels
            .and_then(|pdu| pdu.get("content"))
            .and_then(|c| serde_json::from_value(c.clone()).ok());
        let creators: Vec<OwnedUserId> = create
            .map(|pdu| {
                let sender = pdu.get("sender").cloned();
                let additional = pdu
                    .pointer("/content/additional_creators")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                sender
                    .into_iter()
                    .chain(additional)
                    .filter_map(|c| serde_json::from_value(c).ok())
                    .collect()
            })
            .unwrap_or_default();
        let levels = RoomPowerLevels::new(
            content.map_or(RoomPowerLevelsSource::None, RoomPowerLevelsSource::Original),
            &rules.authorization,
            creators,
        );
        RoomContext {
            member_count: UInt::try_from(member_count as u64).unwrap_or(UInt::MAX),
            power_levels: Some(levels.into()),
        }
    }
}

/// The thread an event belongs to: its root for a thread reply, `""` for the main timeline.
pub fn thread_of(pdu: &Value) -> String {
    let relation = pdu.pointer("/content/m.relates_to");
    match relation
        .and_then(|r| r.get("rel_type"))
        .and_then(Value::as_str)
    {
        Some("m.thread") => relation
            .and_then(|r| r.get("event_id"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        _ => String::new(),
    }
}

/// Whether an event can neither notify anyone under the server-default push rules nor count
/// as unread: membership changes without a body (`.m.rule.member_event` silences them, and
/// `.m.rule.invite_for_me` is for the invitee, who is not joined yet).
pub fn silent_by_default(kind: &str, content: &Value) -> bool {
    kind == "m.room.member"
        && content
            .get("body")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
}

/// Whether an event counts as an unread message (MSC2654), decided as Synapse does: messages
/// with a body, polls and encrypted messages; not notices and not edits.
pub fn counts_as_unread(pdu: &Value) -> bool {
    let kind = pdu.get("type").and_then(Value::as_str).unwrap_or_default();
    let is_state = pdu.get("state_key").is_some();
    let content = pdu.get("content");
    if !is_state
        && kind == "m.room.message"
        && content
            .and_then(|c| c.get("msgtype"))
            .and_then(Value::as_str)
            == Some("m.notice")
    {
        return false;
    }
    if pdu
        .pointer("/content/m.relates_to/rel_type")
        .and_then(Value::as_str)
        == Some("m.replace")
    {
        return false;
    }
    if content
        .and_then(|c| c.get("body"))
        .and_then(Value::as_str)
        .is_some_and(|body| !body.is_empty())
    {
        return true;
    }
    matches!(kind, "m.poll.start" | "org.matrix.msc3381.poll.start")
        || (!is_state && kind == "m.room.encrypted")
}

/// The push action row of one event for one member, if the event notifies or counts as
/// unread for them.
async fn evaluate(
    rules: &Ruleset,
    room: &RoomContext,
    event: &EventToEvaluate<'_>,
    user_id: &UserId,
    display_name: Option<&str>,
) -> Option<PushActionRow> {
    if event.sender == user_id.as_str() {
        return None;
    }
    let mut context = PushConditionRoomCtx::new(
        event.room_id.to_owned(),
        room.member_count,
        user_id.to_owned(),
        // With no display name, contains_display_name must match nothing (as in Synapse);
        // ruma matches an empty name against an empty body, so use a name no body contains.
        display_name
            .filter(|n| !n.is_empty())
            .unwrap_or("\u{fffe}")
            .to_owned(),
    );
    context.power_levels = room.power_levels.clone();
    // As `Ruleset::get_actions`, but with the event flattened once for all members.
    let mut actions: &[Action] = &[];
    for rule in rules {
        if rule.applies(&event.flattened, &context).await {
            actions = rule.actions();
            break;
        }
    }
    let actions = actions.to_vec();
    let notify = actions.iter().any(Action::should_notify);
    let highlight = actions.iter().any(Action::is_highlight);
    let unread = event.unread;
    if !notify && !unread {
        return None;
    }
    Some(PushActionRow {
        user_id: user_id.to_string(),
        room_id: event.room_id.to_string(),
        event_id: event.event_id.to_owned(),
        stream_ordering: event.stream_ordering,
        thread_id: event.thread_id.clone(),
        notify,
        highlight: notify && highlight,
        unread,
        actions: serde_json::to_value(&actions).unwrap_or_default(),
        ts: event.ts,
    })
}

/// An event about to be evaluated for the room's members.
struct EventToEvaluate<'a> {
    room_id: &'a RoomId,
    event_id: &'a str,
    stream_ordering: i64,
    sender: &'a str,
    ts: i64,
    thread_id: String,
    unread: bool,
    flattened: FlattenedJson,
}

impl<'a> EventToEvaluate<'a> {
    fn new(room_id: &'a RoomId, event_id: &'a str, stream_ordering: i64, pdu: &'a Value) -> Self {
        EventToEvaluate {
            room_id,
            event_id,
            stream_ordering,
            sender: pdu
                .get("sender")
                .and_then(Value::as_str)
                .unwrap_or_default(),
            ts: pdu
                .get("origin_server_ts")
                .and_then(Value::as_i64)
                .unwrap_or_default(),
            thread_id: thread_of(pdu),
            unread: counts_as_unread(pdu),
            flattened: FlattenedJson::from_raw(&Raw::<AnySyncTimelineEvent>::from_json(
                serde_json::value::to_raw_value(pdu).expect("a JSON value serialises"),
            )),
        }
    }
}

/// The local members a new event is evaluated for, with their push rules and what the
/// rules need to know about the room, read as the room is before the event (before the
/// event's own state changes are applied). Nothing here depends on the event's stream
/// position, so the writer reads it in the same round trip as it takes the position.
pub struct Audience {
    /// Members on the server-default rules: `(user, display name)`.
    on_defaults: Vec<(OwnedUserId, Option<String>)>,
    /// Members with rules of their own.
    with_own_rules: Vec<(OwnedUserId, Option<String>, Arc<Ruleset>)>,
    room: RoomContext,
    /// Whether a user of another server is joined, when every joined member was read (not
    /// for membership changes, which read only the members with rules of their own).
    other_servers_joined: Option<bool>,
}

/// What an [`Audience`] is made from, read as one step of a pipeline: a send reads it in the
/// same round trip as it takes the room's lock. The room's power levels and create event are
/// not among them: the writer has them already, from the auth state it read.
pub struct AudienceReads {
    /// Which members were read: under the default rules a membership change notifies nobody.
    silent_by_default: bool,
    /// `(member, display name, whether they have push rules of their own)`.
    members: Vec<(String, Option<String>, bool)>,
    joined: usize,
}

/// The room's `m.room.power_levels` and `m.room.create` events as push rules read them (whole
/// PDUs, or just their `sender` and `content`), as the room is before the event.
#[derive(Default)]
pub struct PowerState {
    /// The power levels event.
    pub power_levels: Option<Value>,
    /// The create event.
    pub create: Option<Value>,
}

impl AudienceReads {
    /// Reads what the audience of an event into `room_id` is made from, as the room is now.
    pub async fn read(
        conn: &AsyncPgConnection,
        room_id: &RoomId,
        silent_by_default: bool,
    ) -> Result<Self> {
        // `(joined members who may be notified, with whether they have rules of their own;
        // how many are joined)`. Under the default rules a membership change notifies nobody:
        // only members with rules of their own can be notified, so only they are read
        // (joining a big room would otherwise read every member, for every join).
        let (members, joined) = if silent_by_default {
            let (members, joined) = tokio::try_join!(
                store::get_joined_members_with_account_data(
                    conn,
                    room_id.as_str(),
                    PUSH_RULES_TYPE
                ),
                summaries_store::count_members(conn, room_id.as_str(), "join"),
            )?;
            let members: Vec<_> = members
                .into_iter()
                .map(|(user, name)| (user, name, true))
                .collect();
            (members, joined as usize)
        } else {
            let members =
                store::get_joined_members_with_names(conn, room_id.as_str(), PUSH_RULES_TYPE)
                    .await?;
            let joined = members.len();
            (members, joined)
        };
        Ok(AudienceReads {
            silent_by_default,
            members,
            joined,
        })
    }

    /// Whether these reads are the ones an event with this flag needs.
    pub fn suit(&self, silent_by_default: bool) -> bool {
        self.silent_by_default == silent_by_default
    }
}

impl Audience {
    /// Reads the audience of an event `sender` is about to send into `room_id`.
    pub async fn load(
        conn: &AsyncPgConnection,
        server_name: &ServerName,
        rules: &RoomVersionRules,
        room_id: &RoomId,
        sender: &str,
        silent_by_default: bool,
    ) -> Result<Self> {
        let state_types = ["m.room.power_levels", "m.room.create"];
        let (reads, state) = tokio::try_join!(
            AudienceReads::read(conn, room_id, silent_by_default),
            async {
                Ok(store::get_current_state_pdus(conn, room_id.as_str(), &state_types).await?)
            },
        )?;
        let mut state: HashMap<String, Value> = state.into_iter().collect();
        let power = PowerState {
            power_levels: state.remove("m.room.power_levels"),
            create: state.remove("m.room.create"),
        };
        Self::from_reads(conn, server_name, rules, sender, reads, &power).await
    }

    /// The audience of an event `sender` is about to send, from what was read of its room
    /// (the push rules of members who have their own are read here).
    pub async fn from_reads(
        conn: &AsyncPgConnection,
        server_name: &ServerName,
        rules: &RoomVersionRules,
        sender: &str,
        reads: AudienceReads,
        power: &PowerState,
    ) -> Result<Self> {
        let AudienceReads {
            silent_by_default,
            members,
            joined,
        } = reads;
        let mut on_defaults = Vec::new();
        let mut own = Vec::new();
        let mut other_servers_joined = false;
        for (user, name, has_own_rules) in members {
            if user == sender {
                continue;
            }
            let Ok(user) = UserId::parse(user.as_str()) else {
                continue;
            };
            if user.server_name() != server_name {
                other_servers_joined = true;
                continue;
            }
            if has_own_rules {
                own.push((user, name));
            } else {
                on_defaults.push((user, name));
            }
        }
        let room = RoomContext::new(
            joined,
            power.power_levels.as_ref(),
            power.create.as_ref(),
            rules,
        );
        let with_own_rules = if own.is_empty() {
            Vec::new()
        } else {
            let user_refs: Vec<&UserId> = own.iter().map(|(u, _)| u.as_ref()).collect();
            let mut rulesets = load_rulesets(conn, &user_refs).await?;
            own.into_iter()
                .map(|(user, name)| {
                    let rules = rulesets
                        .remove(user.as_str())
                        .unwrap_or_else(|| Arc::new(Ruleset::server_default(&user)));
                    (user, name, rules)
                })
                .collect()
        };
        Ok(Audience {
            on_defaults,
            with_own_rules,
            room,
            other_servers_joined: (!silent_by_default).then_some(other_servers_joined),
        })
    }

    /// Whether a user of another server is joined to the room; `None` when not known (the
    /// audience of a membership change reads only some members).
    pub fn other_servers_joined(&self) -> Option<bool> {
        self.other_servers_joined
    }

    /// The push actions of a new event: one row per member it notifies or counts as unread
    /// for. The caller stores them in the event's transaction, at the position it takes then
    /// (the rows' `stream_ordering` is 0 until stored).
    ///
    /// Under the server-default rules, only the mention rules depend on who the member is.
    /// So the rules are evaluated one by one for members with rules of their own and for
    /// members the event may name, and once for all the other members (in a room of 20,000,
    /// evaluating every member took most of a send's 0.75 s), whose rows are then stored as
    /// that one outcome and a list of members.
    pub async fn rows_for(
        &self,
        room_id: &RoomId,
        event_id: &str,
        pdu: &Value,
    ) -> NewPushActions<'_> {
        let mut actions = NewPushActions::default();
        if self.on_defaults.is_empty() && self.with_own_rules.is_empty() {
            return actions;
        }
        let event = EventToEvaluate::new(room_id, event_id, 0, pdu);
        for (user, name, rules) in &self.with_own_rules {
            if let Some(row) = evaluate(rules, &self.room, &event, user, name.as_deref()).await {
                actions.rows.push(row);
            }
        }
        let names = MayName::new(pdu);
        // The outcome for a member the event does not name, once one has been evaluated.
        let mut unnamed: Option<Option<SharedPushAction<'_>>> = None;
        for (user, name) in &self.on_defaults {
            let named = names.may_name(user);
            match &mut unnamed {
                Some(outcome) if !named => {
                    if let Some(shared) = outcome {
                        shared.members.push(user.as_str());
                    }
                }
                _ => {
                    let rules = Ruleset::server_default(user);
                    let row = evaluate(&rules, &self.room, &event, user, name.as_deref()).await;
                    if !named {
                        unnamed = Some(row.clone().map(|like| SharedPushAction {
                            like,
                            members: Vec::new(),
                        }));
                    }
                    actions.rows.extend(row);
                }
            }
        }
        actions.shared = unnamed.flatten();
        actions
    }
}

/// Whether an event may name a member, for the server-default rules that depend on who the
/// member is: `.m.rule.is_user_mention` and `.m.rule.invite_for_me`, which look for the user
/// ID as a value in the event (ruma's defaults have no display-name or user-name rules: the
/// spec dropped them for `m.mentions`; a unit test below keeps that true across upgrades).
/// A superset: when it says no, no rule that depends on the member can match. So values are
/// compared ignoring case and an ID with glob characters always may be named, as
/// `event_match` patterns match.
struct MayName {
    /// Every string value in the event, lowercased.
    values: HashSet<String>,
}

impl MayName {
    fn new(pdu: &Value) -> Self {
        fn strings(value: &Value, into: &mut HashSet<String>) {
            match value {
                Value::String(s) => {
                    into.insert(s.to_lowercase());
                }
                Value::Array(items) => items.iter().for_each(|v| strings(v, into)),
                Value::Object(fields) => fields.values().for_each(|v| strings(v, into)),
                _ => {}
            }
        }
        let mut values = HashSet::new();
        strings(pdu, &mut values);
        MayName { values }
    }

    fn may_name(&self, user: &UserId) -> bool {
        let id = user.as_str();
        if id.contains(['*', '?']) {
            return true;
        }
        if id.chars().any(char::is_uppercase) {
            self.values.contains(&id.to_lowercase())
        } else {
            self.values.contains(id)
        }
    }
}

/// The result of recomputing one member's push actions in one room.
#[derive(Debug, Default)]
pub struct CheckReport {
    /// Rows the recomputation expects.
    pub expected: usize,
    /// Rows it expects that are not stored.
    pub missing: Vec<PushActionRow>,
    /// Stored rows it does not expect (or that differ).
    pub unexpected: Vec<PushActionRow>,
}

impl CheckReport {
    /// Whether the stored rows match.
    pub fn is_consistent(&self) -> bool {
        self.missing.is_empty() && self.unexpected.is_empty()
    }
}

/// Recomputes a member's push actions in a room from its events, memberships and the user's
/// current push rules, and compares them with the stored ones; with `fix`, replaces the stored
/// rows with the recomputed ones. (A rule changed since an event arrived shows up as a
/// difference: the stored row reflects the rules of its time.)
pub async fn check_user_room(
    conn: &AsyncPgConnection,
    server_name: &ServerName,
    user_id: &UserId,
    room_id: &RoomId,
    fix: bool,
) -> Result<CheckReport> {
    let expected = recompute(conn, server_name, user_id, room_id).await?;
    let stored = store::get_for_user_room(conn, user_id.as_str(), room_id.as_str()).await?;
    let report = CheckReport {
        expected: expected.len(),
        missing: expected
            .iter()
            .filter(|row| !stored.contains(row))
            .cloned()
            .collect(),
        unexpected: stored
            .iter()
            .filter(|row| !expected.contains(row))
            .cloned()
            .collect(),
    };
    if fix && !report.is_consistent() {
        store::delete_for_user_room(conn, user_id.as_str(), room_id.as_str()).await?;
        let actions = NewPushActions {
            rows: expected,
            shared: None,
        };
        store::insert_new_push_actions(conn, &actions, true).await?;
    }
    Ok(report)
}

/// The push actions a member should have in a room: for each event since their current
/// stretch of membership began, evaluated against the state before it.
async fn recompute(
    conn: &AsyncPgConnection,
    server_name: &ServerName,
    user_id: &UserId,
    room_id: &RoomId,
) -> Result<Vec<PushActionRow>> {
    let Some(room) = rooms_store::get_room(conn, room_id.as_str()).await? else {
        return Err(Error::not_found("Unknown room"));
    };
    let joined = membership_store::get_membership(conn, room_id.as_str(), user_id.as_str())
        .await?
        .is_some_and(|(membership, _)| membership == "join");
    if !joined || user_id.server_name() != server_name {
        return Ok(Vec::new());
    }
    let rules = rules_for(&room.room_version)?;
    let Some(joined_at) =
        membership_store::get_membership_stretch_start(conn, room_id.as_str(), user_id.as_str())
            .await?
    else {
        return Ok(Vec::new());
    };
    let ruleset = load_rulesets(conn, &[user_id])
        .await?
        .remove(user_id.as_str())
        .unwrap_or_else(|| Arc::new(Ruleset::server_default(user_id)));
    let events = crate::storage::timelines::get_room_events_between(
        conn,
        room_id.as_str(),
        joined_at.0 - 1,
        i64::MAX,
        i64::MAX,
    )
    .await?;
    let mut contexts: HashMap<i64, (RoomContext, Option<String>)> = HashMap::new();
    let mut rows = Vec::new();
    let mut state_before = joined_at.1;
    for row in &events {
        // Served events all have a state group (only outliers have none).
        let after = row.state_group.unwrap_or(state_before);
        let group = std::mem::replace(&mut state_before, after);
        if row.stream_ordering <= joined_at.0 || row.redacted_by.is_some() {
            continue;
        }
        let (room, name) = match contexts.entry(group) {
            std::collections::hash_map::Entry::Occupied(known) => known.into_mut(),
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(context_at(conn, group, user_id, &rules).await?)
            }
        };
        let event = EventToEvaluate::new(room_id, &row.event_id, row.stream_ordering, &row.pdu);
        if let Some(action) = evaluate(&ruleset, room, &event, user_id, name.as_deref()).await {
            rows.push(action);
        }
    }
    Ok(rows)
}

/// The room context and the member's display name in a state group.
async fn context_at(
    conn: &AsyncPgConnection,
    group: i64,
    user_id: &UserId,
    rules: &RoomVersionRules,
) -> Result<(RoomContext, Option<String>)> {
    let state = state_store::get_state_ids(conn, group).await?;
    let wanted: Vec<String> = state
        .iter()
        .filter(|((kind, key), _)| {
            kind == "m.room.member"
                || (key.is_empty() && (kind == "m.room.power_levels" || kind == "m.room.create"))
        })
        .map(|(_, id)| id.clone())
        .collect();
    let pdus = rooms_store::get_state_events(conn, &wanted).await?;
    let mut joined = 0;
    let mut name = None;
    let (mut power_levels, mut create) = (None, None);
    for event in &pdus {
        match event.event_type.as_str() {
            "m.room.member" => {
                let content = event.pdu.get("content");
                if content
                    .and_then(|c| c.get("membership"))
                    .and_then(Value::as_str)
                    == Some("join")
                {
                    joined += 1;
                    if event.state_key.as_deref() == Some(user_id.as_str()) {
                        name = content
                            .and_then(|c| c.get("displayname"))
                            .and_then(Value::as_str)
                            .map(str::to_owned);
                    }
                }
            }
            "m.room.power_levels" => power_levels = Some(&event.pdu),
            _ => create = Some(&event.pdu),
        }
    }
    Ok((RoomContext::new(joined, power_levels, create, rules), name))
}

impl super::Rooms {
    /// Checks (and with `fix`, repairs) a user's push actions in one room or in every room
    /// they are joined to, each room in its own transaction.
    pub async fn check_unread(
        &self,
        user_id: &UserId,
        room_id: Option<&RoomId>,
        fix: bool,
    ) -> Result<Vec<(String, CheckReport)>> {
        let mut conn = self.db.conn().await?;
        let rooms = match room_id {
            Some(room) => vec![room.to_owned()],
            None => membership_store::get_rooms_for_user(&conn, user_id.as_str(), "join")
                .await?
                .into_iter()
                .filter_map(|r| ruma::OwnedRoomId::try_from(r).ok())
                .collect(),
        };
        let server_name = &*self.config.server_name;
        let mut reports = Vec::new();
        for room in rooms {
            let report = crate::storage::transaction::transaction(&mut conn, async |conn| {
                check_user_room(conn, server_name, user_id, &room, fix).await
            })
            .await?;
            reports.push((room.to_string(), report));
        }
        Ok(reports)
    }
}

/// Longest page of `/notifications`.
const MAX_NOTIFICATIONS_PAGE: u64 = 100;
/// Page length when the client does not say.
const DEFAULT_NOTIFICATIONS_PAGE: u64 = 20;

impl super::Rooms {
    /// The user's notification history, newest first, from the push-action index. `from` is a
    /// `next_token` of an earlier page; `only_highlight` keeps highlights only.
    pub async fn notifications(
        &self,
        user_id: &UserId,
        from: Option<&str>,
        limit: Option<u64>,
        only_highlight: bool,
    ) -> Result<(Vec<Value>, Option<String>)> {
        let before = match from {
            None => i64::MAX,
            Some(token) => token
                .parse::<i64>()
                .map_err(|_| Error::invalid_param("Unknown pagination token"))?,
        };
        let limit = limit
            .unwrap_or(DEFAULT_NOTIFICATIONS_PAGE)
            .clamp(1, MAX_NOTIFICATIONS_PAGE);
        let conn = self.db.conn().await?;
        let rows = store::get_notifications(
            &conn,
            user_id.as_str(),
            before,
            limit as i64,
            only_highlight,
        )
        .await?;
        let ids: Vec<String> = rows.iter().map(|r| r.event_id.clone()).collect();
        let events: HashMap<String, rooms_store::EventRow> = rooms_store::get_events(&conn, &ids)
            .await?
            .into_iter()
            .map(|e| (e.event_id.clone(), e))
            .collect();
        let mut rules_by_room: HashMap<String, RoomVersionRules> = HashMap::new();
        let mut notifications = Vec::new();
        for row in &rows {
            let Some(event) = events.get(&row.event_id) else {
                continue;
            };
            let rules = self
                .cached_rules(&conn, &mut rules_by_room, &row.room_id)
                .await?;
            let rendered = self
                .render(&conn, rules, std::slice::from_ref(event))
                .await?;
            notifications.push(serde_json::json!({
                "actions": row.actions,
                "event": rendered.into_iter().next(),
                "read": row.read,
                "room_id": row.room_id,
                "ts": row.ts,
            }));
        }
        let next = (rows.len() as u64 == limit)
            .then(|| rows.last().map(|r| r.stream_ordering.to_string()))
            .flatten();
        Ok((notifications, next))
    }
}

#[cfg(test)]
mod tests {
    use ruma::{push::Ruleset, user_id, UserId};
    use serde_json::json;

    use super::MayName;

    /// `Audience::rows_for` evaluates the server-default rules once for all the members an
    /// event does not name; that is right only while the defaults depend on the member
    /// through their full user ID alone (no localpart pattern, no display-name condition).
    #[test]
    fn the_default_rules_depend_on_the_member_only_through_their_user_id() {
        let rules_of = |user: &UserId| {
            serde_json::to_string(&Ruleset::server_default(user))
                .expect("a ruleset serialises")
                .replace(user.as_str(), "USER")
        };
        let alice = rules_of(user_id!("@alice:example.org"));
        assert_eq!(alice, rules_of(user_id!("@bob:other.example:8448")));
        assert!(!alice.contains("contains_display_name"));
    }

    #[test]
    fn an_event_names_the_users_whose_ids_it_carries() {
        let pdu = json!({
            "type": "m.room.message",
            "sender": "@alice:example.org",
            "content": {
                "body": "hi bob and carol",
                "m.mentions": { "user_ids": ["@bob:example.org"] },
            },
        });
        let names = MayName::new(&pdu);
        assert!(names.may_name(user_id!("@bob:example.org")));
        assert!(!names.may_name(user_id!("@carol:example.org")));
        assert!(!names.may_name(user_id!("@bob:example.org.evil")));
        // `event_match` ignores case: a historical upper-case ID may be named too.
        assert!(names.may_name(<&UserId>::try_from("@Bob:example.org").unwrap()));
    }
}
