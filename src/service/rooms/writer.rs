//! The write path: one room at a time, inside one transaction.
//!
//! Lock order: the in-process room lock ([`super::RoomLocks`]), then the PostgreSQL advisory
//! lock for the room (taken by [`RoomWriter::open`]), then the lock on the event stream position
//! each append takes (unique to the transaction, so never waited for). Never the other way
//! round. The advisory lock keeps writes to one room serialised across server processes.
//!
//! The room's forward extremities are a set: an event's `prev_events` are the extremities
//! (at most [`MAX_PREV_EVENTS`], the deepest), its depth is one more than theirs, and it
//! replaces them in the set. A room only this server writes to keeps a set of one, so its
//! history stays one chain.

mod persist;

use std::{collections::HashMap, future::Future};

use diesel::sql_types::BigInt;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use ruma::{
    events::{StateEventType, TimelineEventType},
    room_version_rules::RoomVersionRules,
    state_res::{
        auth_types_for_event, check_state_dependent_auth_rules, check_state_independent_auth_rules,
    },
    EventId, OwnedEventId, OwnedRoomId, RoomId, RoomVersionId, ServerName, UserId,
};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::{
    deferred::DeferredPositions,
    pdu::{build_pdu, Pdu, PduTemplate},
    power::{is_room_creator, listed_power_level},
    push_actions::{silent_by_default, Audience, AudienceReads, PowerState},
    versions::version_rules,
};
use crate::{
    error::{Error, Result},
    service::keys::ServerKeys,
    storage::{
        dag, now_ms, rooms as store,
        state::{self as state_store, Place},
    },
};

/// Most `prev_events` an event may list (FEDERATION.md invariant 7: every peer's limit).
pub const MAX_PREV_EVENTS: usize = 20;

/// The `prev_events` of a new event: the deepest [`MAX_PREV_EVENTS`] extremities (ties by
/// event ID, so the choice is stable), and its depth, one more than the deepest of them (1
/// with none: a create event).
pub fn choose_prev_events(extremities: &[(OwnedEventId, i64)]) -> (Vec<OwnedEventId>, i64) {
    let mut deepest: Vec<&(OwnedEventId, i64)> = extremities.iter().collect();
    deepest.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    deepest.truncate(MAX_PREV_EVENTS);
    let deepest_depth = deepest.iter().map(|(_, depth)| *depth).max();
    let depth = deepest_depth.unwrap_or(0).saturating_add(1);
    (
        deepest.into_iter().map(|(id, _)| id.clone()).collect(),
        depth,
    )
}

/// An event a local user wants to add to a room.
pub struct NewEvent<'a> {
    /// Sender.
    pub sender: &'a UserId,
    /// Event type.
    pub kind: &'a str,
    /// State key, for state events.
    pub state_key: Option<&'a str>,
    /// Content (a JSON object); a redaction names its target in `redacts`, whatever the
    /// room version (the writer moves it to the top level where the version wants it there).
    pub content: Value,
    /// `(device_id, txn_id)` of the client transaction that sent it.
    pub txn: Option<(&'a str, &'a str)>,
    /// Its `origin_server_ts`, when an appservice chose it; now otherwise.
    pub ts: Option<i64>,
}

/// An appended event.
#[derive(Debug, Clone)]
pub struct Appended {
    /// Its event ID.
    pub event_id: OwnedEventId,
    /// Its stream position.
    pub stream_ordering: i64,
}

/// The timestamp of a v12 create event. The room ID is the create event's hash, so one user's
/// identical creates in the same millisecond would collide: within a process each gets a later
/// millisecond than the last; across processes a collision fails with [`room_id_taken`] and
/// the caller tries again.
fn unique_create_ts() -> i64 {
    use std::sync::atomic::{AtomicI64, Ordering};
    static LAST: AtomicI64 = AtomicI64::new(0);
    let now = now_ms();
    let previous = LAST
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |last| {
            Some(now.max(last + 1))
        })
        .unwrap_or(now);
    now.max(previous + 1)
}

const ROOM_ID_TAKEN: &str = "A room with this ID was created at the same moment; try again";

/// The error of a new room whose ID another transaction took first.
fn room_id_taken() -> Error {
    Error::matrix(
        actix_web::http::StatusCode::CONFLICT,
        "M_UNKNOWN",
        ROOM_ID_TAKEN,
    )
}

/// Whether an error is [`room_id_taken`]'s (worth retrying with a fresh create event).
pub fn is_room_id_taken(err: &Error) -> bool {
    matches!(err, Error::Matrix { message, .. } if message == ROOM_ID_TAKEN)
}

/// The event a redaction redacts, with its stored PDU as the redaction leaves it: pruned, so
/// no reader (federation format, stripped state, push, the directory) can serve what the
/// redaction took away.
struct RedactionTarget {
    event_id: OwnedEventId,
    pruned_pdu: Value,
}

/// A new event built, signed and authorised, not yet written.
struct Built {
    event_id: OwnedEventId,
    /// The signed PDU, as stored.
    json: Value,
    pdu: Pdu,
    prev_events: Vec<OwnedEventId>,
    depth: i64,
    origin_server_ts: i64,
    redaction: Option<RedactionTarget>,
}

/// Writes events into one room within the caller's transaction.
pub struct RoomWriter<'c> {
    /// Shared, not exclusive: independent statements of one step go out together (pipelined)
    /// and cost one round trip between them.
    conn: &'c AsyncPgConnection,
    keys: &'c ServerKeys,
    server_name: &'c ServerName,
    room_id: Option<OwnedRoomId>,
    version: RoomVersionId,
    rules: RoomVersionRules,
    /// Current state looked up so far (`None`: not set); reads go to `room_current_state`,
    /// which this transaction keeps up to date, so nothing proportional to the room's size
    /// is loaded per event.
    state: HashMap<(String, String), Option<String>>,
    /// The current state group and where it stands in its delta chain (looked up when a
    /// state event needs it).
    state_group: Option<(i64, Option<Place>)>,
    /// The room's forward extremities with their depths.
    extremities: Vec<(OwnedEventId, i64)>,
    pdus: HashMap<OwnedEventId, Pdu>,
    /// Set for multi-event transactions: positions are provisional until they finish.
    deferred: Option<&'c DeferredPositions>,
    /// What the next append's audience is made from, when read ahead with the room's lock
    /// (taken by the first append that suits them).
    audience_reads: Option<AudienceReads>,
}

/// Takes a room's PostgreSQL advisory lock until the transaction ends (what
/// [`RoomWriter::open`] does first), for writers that start a room's history from another
/// server's state.
pub async fn lock_room(conn: &AsyncPgConnection, room_id: &RoomId) -> Result<()> {
    crate::storage::cached_sql("SELECT pg_advisory_xact_lock($1)")
        .bind::<BigInt, _>(lock_key(room_id.as_str()))
        .execute(&mut &*conn)
        .await?;
    Ok(())
}

/// The advisory-lock key of a room.
fn lock_key(room_id: &str) -> i64 {
    let digest = Sha256::digest(room_id.as_bytes());
    i64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
}

/// The state most events' authorisation reads: the room's create event, power levels and
/// join rules, and the membership of the sender (and of the target, for a membership event).
pub fn common_auth_keys<'a>(
    sender: &'a str,
    member_target: Option<&'a str>,
) -> Vec<(&'a str, &'a str)> {
    let mut keys = vec![
        ("m.room.create", ""),
        ("m.room.power_levels", ""),
        ("m.room.join_rules", ""),
        ("m.room.member", sender),
    ];
    if let Some(target) = member_target.filter(|t| *t != sender) {
        keys.push(("m.room.member", target));
    }
    keys
}

impl<'c> RoomWriter<'c> {
    /// Starts writing to an existing room: takes its advisory lock, then loads its tip and the
    /// current state of `prefetch`. `M_NOT_FOUND` when the room is unknown.
    pub async fn open(
        conn: &'c AsyncPgConnection,
        keys: &'c ServerKeys,
        server_name: &'c ServerName,
        room_id: &RoomId,
        prefetch: &[(&str, &str)],
    ) -> Result<Self> {
        let (writer, ()) =
            Self::open_with(conn, keys, server_name, room_id, prefetch, async { Ok(()) }).await?;
        Ok(writer)
    }

    /// [`RoomWriter::open`], with the caller's own reads (`alongside`) in the same round trip.
    pub async fn open_with<T>(
        conn: &'c AsyncPgConnection,
        keys: &'c ServerKeys,
        server_name: &'c ServerName,
        room_id: &RoomId,
        prefetch: &[(&str, &str)],
        alongside: impl Future<Output = Result<T>>,
    ) -> Result<(Self, T)> {
        // The lock goes first on the connection, so every read after it in the pipeline runs
        // (and takes its snapshot) once the lock is held.
        let lock = crate::storage::cached_sql("SELECT pg_advisory_xact_lock($1)")
            .bind::<BigInt, _>(lock_key(room_id.as_str()))
            .execute(&mut &*conn);
        let (_, room, extremities, state, theirs) = tokio::try_join!(
            async { Ok::<_, Error>(lock.await?) },
            async { Ok(store::get_room(conn, room_id.as_str()).await?) },
            async { Ok(dag::get_forward_extremities(conn, room_id.as_str()).await?) },
            async { Ok(store::get_current_state_events(conn, room_id.as_str(), prefetch).await?) },
            alongside,
        )?;
        let room = room.ok_or_else(|| Error::not_found("Unknown room"))?;
        let version =
            RoomVersionId::try_from(room.room_version.as_str()).map_err(Error::internal)?;
        let rules = version_rules(&version)?;
        let extremities = extremities
            .into_iter()
            .filter_map(|(id, depth)| Some((EventId::parse(id).ok()?, depth)))
            .collect();
        let mut writer = RoomWriter {
            conn,
            keys,
            server_name,
            room_id: Some(room_id.to_owned()),
            version,
            rules,
            state: HashMap::new(),
            state_group: Some((room.current_state_group, None)),
            extremities,
            pdus: HashMap::new(),
            deferred: None,
            audience_reads: None,
        };
        writer.remember_states(prefetch, state)?;
        Ok((writer, theirs))
    }

    /// Caches the current state of `keys` (and its events) from rows looked up for them; a key
    /// already known (or listed twice) keeps what was first remembered.
    fn remember_states(&mut self, keys: &[(&str, &str)], rows: Vec<store::EventRow>) -> Result<()> {
        let mut rows: HashMap<(String, String), store::EventRow> = rows
            .into_iter()
            .map(|row| {
                (
                    (
                        row.event_type.clone(),
                        row.state_key.clone().unwrap_or_default(),
                    ),
                    row,
                )
            })
            .collect();
        for (kind, key) in keys {
            let key_pair = ((*kind).to_owned(), (*key).to_owned());
            if self.state.contains_key(&key_pair) {
                continue;
            }
            let row = rows.remove(&key_pair);
            self.remember_state(kind, key, row)?;
        }
        Ok(())
    }

    /// Caches one current-state entry (and its event) looked up from the database.
    fn remember_state(
        &mut self,
        kind: &str,
        state_key: &str,
        row: Option<store::EventRow>,
    ) -> Result<()> {
        let id = match row {
            Some(row) => {
                let pdu = Pdu::from_json(&row.event_id, &row.pdu)?;
                self.pdus.insert(pdu.event_id.clone(), pdu);
                Some(row.event_id)
            }
            None => None,
        };
        self.state
            .insert((kind.to_owned(), state_key.to_owned()), id);
        Ok(())
    }

    /// Starts a new room of the given version; the first append must be its `m.room.create`.
    pub fn create(
        conn: &'c AsyncPgConnection,
        keys: &'c ServerKeys,
        server_name: &'c ServerName,
        room_id: Option<OwnedRoomId>,
        version: RoomVersionId,
    ) -> Result<Self> {
        let rules = version_rules(&version)?;
        Ok(RoomWriter {
            conn,
            keys,
            server_name,
            room_id,
            version,
            rules,
            state: HashMap::new(),
            state_group: None,
            extremities: Vec::new(),
            pdus: HashMap::new(),
            deferred: None,
            audience_reads: None,
        })
    }

    /// Gives the next append the reads its audience is made from, read ahead with the room's
    /// lock (a send reads them in that round trip instead of one of their own).
    pub fn with_audience_reads(mut self, reads: AudienceReads) -> Self {
        self.audience_reads = Some(reads);
        self
    }

    /// Appends at provisional positions that `deferred` finishes before commit.
    pub fn with_deferred_positions(mut self, deferred: &'c DeferredPositions) -> Self {
        self.deferred = Some(deferred);
        self
    }

    /// The room ID (known once the create event exists).
    pub fn room_id(&self) -> Result<&RoomId> {
        self.room_id
            .as_deref()
            .ok_or_else(|| Error::internal("room has no create event yet"))
    }

    /// The connection, for statements that belong to the same transaction.
    pub fn conn(&self) -> &'c AsyncPgConnection {
        self.conn
    }

    /// Looks up the current state of the keys not seen yet, in one round trip. A room being
    /// created has no stored state: everything it has was appended through this writer.
    async fn fetch_state(&mut self, keys: &[(String, String)]) -> Result<()> {
        let Some(room_id) = self
            .room_id
            .clone()
            .filter(|_| !self.extremities.is_empty())
        else {
            return Ok(());
        };
        let missing: Vec<(&str, &str)> = keys
            .iter()
            .filter(|k| !self.state.contains_key(*k))
            .map(|(kind, key)| (kind.as_str(), key.as_str()))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let rows = store::get_current_state_events(self.conn, room_id.as_str(), &missing).await?;
        self.remember_states(&missing, rows)
    }

    /// The current state event ID of `(type, state_key)`, once fetched.
    fn state_id(&self, kind: &str, state_key: &str) -> Option<String> {
        self.state
            .get(&(kind.to_owned(), state_key.to_owned()))
            .cloned()
            .flatten()
    }

    /// The current state group and where it stands in its delta chain.
    async fn state_group_with_place(&mut self) -> Result<Option<(i64, Place)>> {
        match self.state_group {
            None => Ok(None),
            Some((group, Some(place))) => Ok(Some((group, place))),
            Some((group, None)) => {
                let place = state_store::get_place(self.conn, group).await?;
                self.state_group = Some((group, Some(place)));
                Ok(Some((group, place)))
            }
        }
    }

    /// Builds, authorises, signs and stores one event; refused actions are `M_FORBIDDEN`.
    pub async fn append(&mut self, mut event: NewEvent<'_>) -> Result<Appended> {
        let relation = match self.room_id.clone() {
            Some(room_id) => {
                super::relations::check(
                    self.conn,
                    &room_id,
                    event.sender,
                    event.kind,
                    event.state_key,
                    &event.content,
                )
                .await?
            }
            None => None,
        };
        let built = self.build(&mut event).await?;
        let room_id = self.room_id()?.to_owned();
        // Push rules see the room as it was before the event: taken before its state is.
        let power = self.power_state();
        let group = self
            .state_group_after(&event, &room_id, &built.event_id)
            .await?;
        // Evaluated before the stream position is taken, so the position's lock (held to
        // commit, and every room's writers queue on it) is not held through this.
        let audience = self.audience(&event, &room_id, &power).await?;
        if self.extremities.is_empty() {
            store::insert_room(
                self.conn,
                room_id.as_str(),
                self.version.as_str(),
                event.sender.as_str(),
                group,
                now_ms(),
            )
            .await
            .map_err(|e| match crate::storage::is_unique_violation(&e) {
                true => room_id_taken(),
                false => e.into(),
            })?;
        }
        let relation = relation.map(|mut relation| {
            relation.event_id = built.event_id.to_string();
            relation
        });
        let stream_ordering = self
            .write(&event, &room_id, &built, group, relation, audience.as_ref())
            .await?;

        let Built {
            event_id,
            pdu,
            prev_events,
            depth,
            redaction,
            ..
        } = built;
        if let Some(target) = redaction {
            if let Some(cached) = self.pdus.get_mut(&target.event_id) {
                *cached = Pdu::from_json(target.event_id.as_str(), &target.pruned_pdu)?;
            }
        }
        self.extremities.retain(|(id, _)| !prev_events.contains(id));
        self.extremities.push((event_id.clone(), depth));
        self.pdus.insert(event_id.clone(), pdu);
        Ok(Appended {
            event_id,
            stream_ordering,
        })
    }

    /// Builds and signs the event's PDU on the room's extremities, and authorises it: the
    /// state the auth rules ask for is read, a redaction's target is checked (whichever
    /// endpoint the redaction came through) and the PDU must pass both sets of auth rules. A
    /// v12 create event names the room here.
    async fn build(&mut self, event: &mut NewEvent<'_>) -> Result<Built> {
        let kind = TimelineEventType::from(event.kind);
        let content_raw =
            serde_json::value::to_raw_value(&event.content).map_err(Error::internal)?;
        let auth_types = auth_types_for_event(
            &kind,
            event.sender,
            event.state_key,
            &content_raw,
            &self.rules.authorization,
        )
        .map_err(|e| Error::bad_json(format!("Invalid event content: {e}")))?;
        // The auth events, and everything else the state-dependent rules may ask for.
        let mut keys: Vec<(String, String)> = auth_types
            .iter()
            .map(|(kind, state_key)| (kind.to_string(), state_key.clone()))
            .collect();
        for (kind, state_key) in common_auth_keys(event.sender.as_str(), None) {
            keys.push((kind.to_owned(), state_key.to_owned()));
        }
        self.fetch_state(&keys).await?;
        // The auth rules of v3+ rooms leave redactions to the server applying them.
        let redaction = match event.kind {
            "m.room.redaction" => Some(self.authorize_redaction(event).await?),
            _ => None,
        };
        let auth_events: Vec<OwnedEventId> = auth_types
            .iter()
            .filter_map(|(kind, state_key)| self.state_id(&kind.to_string(), state_key))
            .filter_map(|id| EventId::parse(id).ok())
            .collect();
        let is_v12_create = kind == TimelineEventType::RoomCreate
            && self.rules.authorization.room_create_event_id_as_room_id;
        let redacts_top_level = redaction
            .as_ref()
            .map(|target| &*target.event_id)
            .filter(|_| !self.rules.redaction.content_field_redacts);
        let (prev_events, depth) = choose_prev_events(&self.extremities);
        let origin_server_ts = match is_v12_create {
            true => unique_create_ts(),
            false => event.ts.unwrap_or_else(now_ms),
        };
        let template = PduTemplate {
            room_id: match is_v12_create {
                true => None,
                false => self.room_id.as_deref(),
            },
            sender: event.sender,
            kind: event.kind,
            state_key: event.state_key,
            content: &event.content,
            redacts: redacts_top_level,
            prev_events: &prev_events,
            auth_events: &auth_events,
            depth,
            origin_server_ts,
        };
        let (event_id, json) = build_pdu(
            &template,
            &self.rules,
            self.server_name,
            &self.keys.key_pair,
        )?;
        let pdu = Pdu::from_json(event_id.as_str(), &json)?;
        if is_v12_create {
            let room_id = format!("!{}", &event_id.as_str()[1..]);
            self.room_id = Some(RoomId::parse(room_id).map_err(Error::internal)?);
        }

        let pdus = &self.pdus;
        check_state_independent_auth_rules(&self.rules.authorization, &pdu, |id: &EventId| {
            pdus.get(id).cloned()
        })
        .map_err(|reason| Error::forbidden(format!("Not allowed: {reason}")))?;
        let state = &self.state;
        check_state_dependent_auth_rules(
            &self.rules.authorization,
            &pdu,
            |kind: &StateEventType, key: &str| {
                let id = state.get(&(kind.to_string(), key.to_owned()))?.as_ref()?;
                pdus.get(EventId::parse(id).ok()?.as_ref() as &EventId)
                    .cloned()
            },
        )
        .map_err(|reason| Error::forbidden(format!("Not allowed: {reason}")))?;
        Ok(Built {
            event_id,
            json,
            pdu,
            prev_events,
            depth,
            origin_server_ts,
            redaction,
        })
    }

    /// The state group after the event: for a state event a new one on the current group (the
    /// room's first snapshot for its create event), which becomes current; the current one
    /// otherwise.
    async fn state_group_after(
        &mut self,
        event: &NewEvent<'_>,
        room_id: &RoomId,
        event_id: &EventId,
    ) -> Result<i64> {
        let Some(state_key) = event.state_key else {
            return self
                .state_group
                .map(|(group, _)| group)
                .ok_or_else(|| Error::internal("message before create"));
        };
        let change = [(event.kind, state_key, event_id.as_str())];
        let (group, place) = match self.state_group_with_place().await? {
            Some(prev) => {
                state_store::insert_state_after(self.conn, room_id.as_str(), prev, &change).await?
            }
            None => {
                state_store::insert_state_snapshot(self.conn, room_id.as_str(), None, &change)
                    .await?
            }
        };
        self.state_group = Some((group, Some(place)));
        self.state.insert(
            (event.kind.to_owned(), state_key.to_owned()),
            Some(event_id.to_string()),
        );
        Ok(group)
    }

    /// Whom the event may notify, with their push rules; `None` in a new room (nobody else is
    /// in it yet). Uses the reads taken ahead with the room's lock when they suit the event.
    async fn audience(
        &mut self,
        event: &NewEvent<'_>,
        room_id: &RoomId,
        power: &PowerState,
    ) -> Result<Option<Audience>> {
        if self.extremities.is_empty() {
            return Ok(None);
        }
        let silent = silent_by_default(event.kind, &event.content);
        let reads = match self
            .audience_reads
            .take()
            .filter(|reads| reads.suit(silent))
        {
            Some(reads) => reads,
            None => AudienceReads::read(self.conn, room_id, silent).await?,
        };
        let sender = event.sender.as_str();
        let audience = Audience::from_reads(
            self.conn,
            self.server_name,
            &self.rules,
            sender,
            reads,
            power,
        )
        .await?;
        Ok(Some(audience))
    }

    /// Checks a redaction: it is not state, names an event of this room, and its sender either
    /// sent that event or has the room's `redact` power. Puts `redacts` where the room version
    /// wants it (in the content since v11; top level before, so it leaves the content).
    async fn authorize_redaction(&self, event: &mut NewEvent<'_>) -> Result<RedactionTarget> {
        if event.state_key.is_some() {
            return Err(Error::invalid_param("A redaction cannot be a state event"));
        }
        let content = event
            .content
            .as_object_mut()
            .ok_or_else(|| Error::bad_json("Event content must be a JSON object"))?;
        let target = match content.get("redacts") {
            Some(Value::String(id)) => EventId::parse(id.as_str())
                .map_err(|_| Error::bad_json("redacts must be an event ID"))?,
            _ => return Err(Error::bad_json("A redaction needs the event ID it redacts")),
        };
        if !self.rules.redaction.content_field_redacts {
            content.remove("redacts");
        }
        let room_id = self.room_id()?;
        let row = store::get_event(self.conn, target.as_str())
            .await?
            .filter(|row| row.room_id == room_id.as_str())
            .ok_or_else(|| Error::not_found("Event not found"))?;
        if row.sender != event.sender.as_str() {
            let levels = self.power_levels();
            let needed = levels.get("redact").and_then(Value::as_i64).unwrap_or(50);
            if self.power_level(event.sender, &levels) < needed {
                return Err(Error::forbidden("You may only redact your own events"));
            }
        }
        Ok(RedactionTarget {
            event_id: target,
            pruned_pdu: super::pdu::prune(&row.pdu, &self.rules),
        })
    }

    /// The current power-levels content (empty when the room has none).
    fn power_levels(&self) -> Value {
        self.state_pdu("m.room.power_levels", "")
            .map(Pdu::content_value)
            .unwrap_or_else(|| Value::Object(Default::default()))
    }

    /// A user's power level under `levels`; room creators are above everyone in room
    /// versions that privilege them.
    fn power_level(&self, user_id: &UserId, levels: &Value) -> i64 {
        let creator = self.rules.authorization.explicitly_privilege_room_creators
            && self.state_pdu("m.room.create", "").is_some_and(|create| {
                is_room_creator(create.sender.as_str(), &create.content_value(), user_id)
            });
        match creator {
            true => i64::MAX,
            false => listed_power_level(levels, user_id),
        }
    }

    /// A user's current membership, when their member event was fetched (the sender's is).
    pub fn current_membership(&self, user_id: &str) -> Option<String> {
        let content = self.state_pdu("m.room.member", user_id)?.content_value();
        content
            .get("membership")
            .and_then(Value::as_str)
            .map(str::to_owned)
    }

    /// The room's power levels and create event as push rules read them, from the auth state
    /// (every event's authorisation fetches both).
    fn power_state(&self) -> PowerState {
        let push_view = |kind| {
            self.state_pdu(kind, "")
                .map(|pdu| json!({ "sender": pdu.sender, "content": pdu.content_value() }))
        };
        PowerState {
            power_levels: push_view("m.room.power_levels"),
            create: push_view("m.room.create"),
        }
    }

    /// The current state event of `(kind, state_key)`, when fetched and present.
    fn state_pdu(&self, kind: &str, state_key: &str) -> Option<&Pdu> {
        let id = self.state_id(kind, state_key)?;
        self.pdus.get(EventId::parse(id).ok()?.as_ref() as &EventId)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prev_events_are_the_deepest_twenty_extremities_and_depth_follows_them() {
        let id = |n: usize| EventId::parse(format!("$e{n:02}")).unwrap();
        assert_eq!(choose_prev_events(&[]), (Vec::new(), 1));
        let two = [(id(1), 7), (id(2), 9)];
        assert_eq!(choose_prev_events(&two), (vec![id(2), id(1)], 10));
        let many: Vec<(OwnedEventId, i64)> = (0..25).map(|n| (id(n), n as i64)).collect();
        let (prev, depth) = choose_prev_events(&many);
        assert_eq!(prev.len(), MAX_PREV_EVENTS);
        assert_eq!(prev, (5..25).rev().map(id).collect::<Vec<_>>());
        assert_eq!(depth, 25);
    }
}
