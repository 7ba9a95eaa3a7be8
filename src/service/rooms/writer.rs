//! The write path: one room at a time, inside one transaction.
//!
//! Lock order: the in-process room lock ([`super::RoomLocks`]), then the PostgreSQL advisory
//! lock for the room (taken by [`RoomWriter::open`]), then the event stream counter (taken by
//! each append). Never the other way round. The advisory lock keeps writes to one room
//! serialised across server processes; `prev_events` are always the room's forward extremities.

use std::collections::HashMap;

use diesel::sql_types::BigInt;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use ruma::{
    events::{StateEventType, TimelineEventType},
    room_version_rules::RoomVersionRules,
    state_res::{
        auth_types_for_event, check_state_dependent_auth_rules, check_state_independent_auth_rules,
    },
    EventId, OwnedEventId, OwnedRoomId, RoomId, RoomVersionId, UserId,
};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::pdu::{build_pdu, Pdu, PduTemplate};
use crate::{
    error::{Error, Result},
    service::keys::ServerKeys,
    storage::{
        now_ms, push as push_store, relations as relations_store, rooms as store,
        state::{self as state_store, STATE_CHAIN_LIMIT},
        streams,
    },
};

/// An event a local user wants to add to a room.
pub struct NewEvent<'a> {
    /// Sender.
    pub sender: &'a UserId,
    /// Event type.
    pub kind: &'a str,
    /// State key, for state events.
    pub state_key: Option<&'a str>,
    /// Content (a JSON object).
    pub content: Value,
    /// For redactions: the redacted event.
    pub redacts: Option<&'a EventId>,
    /// `(device_id, txn_id)` of the client transaction that sent it.
    pub txn: Option<(&'a str, &'a str)>,
}

/// An appended event.
#[derive(Debug, Clone)]
pub struct Appended {
    /// Its event ID.
    pub event_id: OwnedEventId,
    /// Its stream position.
    pub stream_ordering: i64,
}

/// Writes events into one room within the caller's transaction.
pub struct RoomWriter<'c> {
    conn: &'c mut AsyncPgConnection,
    keys: &'c ServerKeys,
    server_name: &'c str,
    room_id: Option<OwnedRoomId>,
    version: RoomVersionId,
    rules: RoomVersionRules,
    /// Current state looked up so far (`None`: not set); reads go to `room_current_state`,
    /// which this transaction keeps up to date, so nothing proportional to the room's size
    /// is loaded per event.
    state: HashMap<(String, String), Option<String>>,
    state_group: Option<(i64, i32)>,
    extremities: Vec<OwnedEventId>,
    depth: i64,
    pdus: HashMap<OwnedEventId, Pdu>,
}

/// The advisory-lock key of a room.
fn lock_key(room_id: &str) -> i64 {
    let digest = Sha256::digest(room_id.as_bytes());
    i64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
}

/// The rules of a room version we support.
pub fn version_rules(version: &RoomVersionId) -> Result<RoomVersionRules> {
    if !super::SUPPORTED_VERSIONS.contains(version) {
        return Err(Error::matrix(
            actix_web::http::StatusCode::BAD_REQUEST,
            "M_UNSUPPORTED_ROOM_VERSION",
            format!("Room version {version} is not supported"),
        ));
    }
    version
        .rules()
        .ok_or_else(|| Error::internal("room version without rules"))
}

/// The rules of a stored room's version (as `rooms.room_version` holds it).
pub fn rules_for(room_version: &str) -> Result<RoomVersionRules> {
    version_rules(&RoomVersionId::try_from(room_version).map_err(Error::internal)?)
}

impl<'c> RoomWriter<'c> {
    /// Starts writing to an existing room: takes its advisory lock and loads its tip.
    /// `M_NOT_FOUND` when the room is unknown.
    pub async fn open(
        conn: &'c mut AsyncPgConnection,
        keys: &'c ServerKeys,
        server_name: &'c str,
        room_id: &RoomId,
    ) -> Result<Self> {
        diesel::sql_query("SELECT pg_advisory_xact_lock($1)")
            .bind::<BigInt, _>(lock_key(room_id.as_str()))
            .execute(conn)
            .await?;
        let room = store::get_room(conn, room_id.as_str())
            .await?
            .ok_or_else(|| Error::not_found("Unknown room"))?;
        let version =
            RoomVersionId::try_from(room.room_version.as_str()).map_err(Error::internal)?;
        let rules = version_rules(&version)?;
        let chain = state_store::get_chain_length(conn, room.current_state_group).await?;
        let tips = store::get_forward_extremities(conn, room_id.as_str()).await?;
        let depth = tips.iter().map(|(_, d)| *d).max().unwrap_or(0);
        let extremities = tips
            .into_iter()
            .filter_map(|(id, _)| EventId::parse(id).ok())
            .collect();
        Ok(RoomWriter {
            conn,
            keys,
            server_name,
            room_id: Some(room_id.to_owned()),
            version,
            rules,
            state: HashMap::new(),
            state_group: Some((room.current_state_group, chain)),
            extremities,
            depth,
            pdus: HashMap::new(),
        })
    }

    /// Starts a new room of the given version; the first append must be its `m.room.create`.
    pub fn create(
        conn: &'c mut AsyncPgConnection,
        keys: &'c ServerKeys,
        server_name: &'c str,
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
            depth: 0,
            pdus: HashMap::new(),
        })
    }

    /// The room ID (known once the create event exists).
    pub fn room_id(&self) -> Result<&RoomId> {
        self.room_id
            .as_deref()
            .ok_or_else(|| Error::internal("room has no create event yet"))
    }

    /// The connection, for statements that belong to the same transaction.
    pub fn conn(&mut self) -> &mut AsyncPgConnection {
        self.conn
    }

    /// The current state event ID of `(type, state_key)`.
    async fn state_id(&mut self, kind: &str, state_key: &str) -> Result<Option<String>> {
        let key = (kind.to_owned(), state_key.to_owned());
        if let Some(id) = self.state.get(&key) {
            return Ok(id.clone());
        }
        let room_id = self
            .room_id
            .as_ref()
            .map(|r| r.to_string())
            .unwrap_or_default();
        let id = store::get_current_state_id(self.conn, &room_id, kind, state_key).await?;
        self.state.insert(key, id.clone());
        Ok(id)
    }

    async fn load(&mut self, ids: &[String]) -> Result<()> {
        let missing: Vec<String> = ids
            .iter()
            .filter(|id| EventId::parse(id.as_str()).map_or(true, |e| !self.pdus.contains_key(&e)))
            .cloned()
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        for row in store::get_events(self.conn, &missing).await? {
            let pdu = Pdu::from_json(&row.event_id, &row.pdu)?;
            self.pdus.insert(pdu.event_id.clone(), pdu);
        }
        Ok(())
    }

    /// Builds, authorises, signs and stores one event; refused actions are `M_FORBIDDEN`.
    pub async fn append(&mut self, event: NewEvent<'_>) -> Result<Appended> {
        let mut event = event;
        if let (Some(redacts), true) = (event.redacts, self.rules.redaction.content_field_redacts) {
            if let Some(content) = event.content.as_object_mut() {
                content.insert("redacts".into(), Value::from(redacts.as_str()));
            }
        }
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
        let mut auth_ids = Vec::new();
        for (kind, state_key) in &auth_types {
            if let Some(id) = self.state_id(&kind.to_string(), state_key).await? {
                auth_ids.push(id);
            }
        }
        // Everything the state-dependent rules may ask for.
        let mut needed = auth_ids.clone();
        for (kind, state_key) in [
            ("m.room.create", ""),
            ("m.room.power_levels", ""),
            ("m.room.join_rules", ""),
        ] {
            if let Some(id) = self.state_id(kind, state_key).await? {
                needed.push(id);
            }
        }
        self.load(&needed).await?;

        let auth_events: Vec<OwnedEventId> = auth_ids
            .iter()
            .filter_map(|id| EventId::parse(id).ok())
            .collect();
        let room_id = self.room_id.clone();
        let is_v12_create = kind == TimelineEventType::RoomCreate
            && self.rules.authorization.room_create_event_id_as_room_id;
        let redacts_top_level = event
            .redacts
            .filter(|_| !self.rules.redaction.content_field_redacts);
        let prev_events = self.extremities.clone();
        let template = PduTemplate {
            room_id: if is_v12_create {
                None
            } else {
                room_id.as_deref()
            },
            sender: event.sender,
            kind: event.kind,
            state_key: event.state_key,
            content: &event.content,
            redacts: redacts_top_level,
            prev_events: &prev_events,
            auth_events: &auth_events,
            depth: self.depth + 1,
            origin_server_ts: now_ms(),
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
        let room_id = self.room_id()?.to_owned();

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

        // State after this event.
        let group = match event.state_key {
            Some(state_key) => {
                let parent = self.state_group.filter(|(_, len)| *len < STATE_CHAIN_LIMIT);
                let group = match parent {
                    Some(parent) => {
                        state_store::insert_state_group(
                            self.conn,
                            room_id.as_str(),
                            Some(parent),
                            &[(event.kind, state_key, event_id.as_str())],
                        )
                        .await?
                    }
                    None => {
                        let current =
                            store::get_current_state_ids(self.conn, room_id.as_str()).await?;
                        let mut full: Vec<(&str, &str, &str)> = current
                            .iter()
                            .map(|(t, k, id)| (t.as_str(), k.as_str(), id.as_str()))
                            .collect();
                        full.retain(|(t, k, _)| !(*t == event.kind && *k == state_key));
                        full.push((event.kind, state_key, event_id.as_str()));
                        state_store::insert_state_group(self.conn, room_id.as_str(), None, &full)
                            .await?
                    }
                };
                let length = parent.map_or(0, |(_, len)| len + 1);
                self.state_group = Some((group, length));
                self.state.insert(
                    (event.kind.to_owned(), state_key.to_owned()),
                    Some(event_id.to_string()),
                );
                group
            }
            None => {
                self.state_group
                    .ok_or_else(|| Error::internal("message before create"))?
                    .0
            }
        };

        let stream_ordering = streams::next_position(self.conn, streams::EVENTS).await?;
        if self.extremities.is_empty() {
            store::insert_room(
                self.conn,
                room_id.as_str(),
                self.version.as_str(),
                event.sender.as_str(),
                group,
                now_ms(),
            )
            .await?;
        }
        store::insert_event(
            self.conn,
            &store::NewEvent {
                event_id: event_id.as_str(),
                room_id: room_id.as_str(),
                stream_ordering,
                depth: template.depth,
                sender: event.sender.as_str(),
                event_type: event.kind,
                state_key: event.state_key,
                origin_server_ts: template.origin_server_ts,
                pdu: &json,
                state_group: group,
            },
        )
        .await?;
        if let Some(mut relation) = relation {
            relation.event_id = event_id.to_string();
            relation.stream_ordering = stream_ordering;
            relations_store::insert_relation(self.conn, &relation).await?;
        }
        // Before the event's own state changes: push rules see the room as it was.
        super::push_actions::record_for_new_event(
            self.conn,
            self.server_name,
            &self.rules,
            &room_id,
            event_id.as_str(),
            stream_ordering,
            &json,
        )
        .await?;
        let prev: Vec<String> = self.extremities.iter().map(|e| e.to_string()).collect();
        store::set_forward_extremity(self.conn, room_id.as_str(), &prev, event_id.as_str()).await?;
        if let Some(state_key) = event.state_key {
            store::set_current_state(
                self.conn,
                room_id.as_str(),
                event.kind,
                state_key,
                event_id.as_str(),
            )
            .await?;
            store::set_current_state_group(self.conn, room_id.as_str(), group).await?;
            if event.kind == "m.room.member" {
                let membership = event
                    .content
                    .get("membership")
                    .and_then(Value::as_str)
                    .unwrap_or("leave");
                store::set_membership(
                    self.conn,
                    room_id.as_str(),
                    state_key,
                    membership,
                    event.content.get("displayname").and_then(Value::as_str),
                    event_id.as_str(),
                    stream_ordering,
                )
                .await?;
                if membership != "join" {
                    push_store::delete_for_user_room(self.conn, state_key, room_id.as_str())
                        .await?;
                }
            }
        }
        if let Some(redacts) = event.redacts {
            store::set_redacted(self.conn, redacts.as_str(), event_id.as_str()).await?;
            push_store::delete_for_event(self.conn, redacts.as_str()).await?;
            relations_store::delete_relation(self.conn, redacts.as_str()).await?;
        }
        store::notify(
            self.conn,
            crate::service::notifier::ROOM_CHANNEL,
            room_id.as_str(),
        )
        .await?;
        if let (Some(target), "m.room.member") = (event.state_key, event.kind) {
            // The target may not be in the room any more (kick, ban, rejected invite).
            store::notify(self.conn, crate::service::notifier::USER_CHANNEL, target).await?;
        }
        if let Some((device_id, txn_id)) = event.txn {
            store::insert_txn(
                self.conn,
                event.sender.as_str(),
                device_id,
                txn_id,
                event_id.as_str(),
                now_ms(),
            )
            .await?;
        }
        self.extremities = vec![event_id.clone()];
        self.depth = template.depth;
        self.pdus.insert(event_id.clone(), pdu);
        Ok(Appended {
            event_id,
            stream_ordering,
        })
    }
}
