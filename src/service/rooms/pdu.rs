//! PDUs (persistent data units): building, signing and reading the events of the room DAG.

use ruma::{
    canonical_json::{redact, CanonicalJsonObject, CanonicalJsonValue},
    events::TimelineEventType,
    room_version_rules::RoomVersionRules,
    signatures::{hash_and_sign_event, reference_hash, Ed25519KeyPair},
    EventId, MilliSecondsSinceUnixEpoch, OwnedEventId, OwnedRoomId, OwnedUserId, RoomId,
    ServerName, UInt, UserId,
};
use serde::Deserialize;
use serde_json::{value::RawValue as RawJsonValue, Map, Value};

use crate::{
    error::{Error, Result},
    storage::client_events::ClientEventParts,
};

/// Largest PDU we create, in bytes of canonical JSON. The spec allows 65,536, but ruma's
/// format check (and so every ruma-based server) drops anything over 65,535: one byte less
/// keeps our events acceptable everywhere.
pub const MAX_PDU_BYTES: usize = 65_535;

/// A parsed PDU, as the auth rules and readers need it.
#[derive(Debug, Clone)]
pub struct Pdu {
    /// Event ID (reference hash).
    pub event_id: OwnedEventId,
    /// Room ID (absent in a v12 create event, where the room ID derives from the event ID).
    pub room_id: Option<OwnedRoomId>,
    /// Sender.
    pub sender: OwnedUserId,
    /// Origin timestamp.
    pub origin_server_ts: MilliSecondsSinceUnixEpoch,
    /// Event type.
    pub kind: TimelineEventType,
    /// Content, as raw JSON.
    pub content: Box<RawJsonValue>,
    /// State key, for state events.
    pub state_key: Option<String>,
    /// Previous events.
    pub prev_events: Vec<OwnedEventId>,
    /// Auth events.
    pub auth_events: Vec<OwnedEventId>,
    /// For redactions: the redacted event.
    pub redacts: Option<OwnedEventId>,
    /// Depth.
    pub depth: i64,
}

#[derive(Deserialize)]
struct PduFields {
    room_id: Option<OwnedRoomId>,
    sender: OwnedUserId,
    origin_server_ts: MilliSecondsSinceUnixEpoch,
    #[serde(rename = "type")]
    kind: TimelineEventType,
    content: Box<RawJsonValue>,
    state_key: Option<String>,
    #[serde(default)]
    prev_events: Vec<OwnedEventId>,
    #[serde(default)]
    auth_events: Vec<OwnedEventId>,
    redacts: Option<OwnedEventId>,
    depth: i64,
}

impl Pdu {
    /// Whether the event belongs to `room_id`: it names the room, or it is the room's v12
    /// create event (which has no room ID: the room's ID is derived from the event's).
    pub fn is_in_room(&self, room_id: &RoomId, rules: &RoomVersionRules) -> bool {
        self.room_id.as_deref() == Some(room_id)
            || (self.room_id.is_none()
                && rules.authorization.room_create_event_id_as_room_id
                && room_id.as_str()[1..] == self.event_id.as_str()[1..])
    }

    /// Parses a stored PDU.
    pub fn from_json(event_id: &str, json: &Value) -> Result<Self> {
        let fields: PduFields = serde_json::from_value(json.clone())
            .map_err(|e| Error::internal(format!("PDU {event_id}: {e}")))?;
        // Since room v11 `redacts` lives in the content.
        let redacts = fields.redacts.or_else(|| {
            #[derive(Deserialize)]
            struct Redacts {
                redacts: Option<OwnedEventId>,
            }
            (fields.kind == TimelineEventType::RoomRedaction)
                .then(|| {
                    serde_json::from_str::<Redacts>(fields.content.get())
                        .ok()?
                        .redacts
                })
                .flatten()
        });
        Ok(Pdu {
            event_id: EventId::parse(event_id).map_err(Error::internal)?,
            room_id: fields.room_id,
            sender: fields.sender,
            origin_server_ts: fields.origin_server_ts,
            kind: fields.kind,
            content: fields.content,
            state_key: fields.state_key,
            prev_events: fields.prev_events,
            auth_events: fields.auth_events,
            redacts,
            depth: fields.depth,
        })
    }

    /// The content as a JSON value.
    pub fn content_value(&self) -> Value {
        serde_json::from_str(self.content.get()).unwrap_or(Value::Null)
    }
}

impl ruma::state_res::Event for Pdu {
    type Id = OwnedEventId;

    fn event_id(&self) -> &Self::Id {
        &self.event_id
    }
    fn room_id(&self) -> Option<&RoomId> {
        self.room_id.as_deref()
    }
    fn sender(&self) -> &UserId {
        &self.sender
    }
    fn origin_server_ts(&self) -> MilliSecondsSinceUnixEpoch {
        self.origin_server_ts
    }
    fn event_type(&self) -> &TimelineEventType {
        &self.kind
    }
    fn content(&self) -> &RawJsonValue {
        &self.content
    }
    fn state_key(&self) -> Option<&str> {
        self.state_key.as_deref()
    }
    fn prev_events(&self) -> Box<dyn DoubleEndedIterator<Item = &Self::Id> + '_> {
        Box::new(self.prev_events.iter())
    }
    fn auth_events(&self) -> Box<dyn DoubleEndedIterator<Item = &Self::Id> + '_> {
        Box::new(self.auth_events.iter())
    }
    fn redacts(&self) -> Option<&Self::Id> {
        self.redacts.as_ref()
    }
    fn rejected(&self) -> bool {
        false
    }
}

/// The unsigned fields of a new event, before hashing and signing.
pub struct PduTemplate<'a> {
    /// Room ID; `None` only for a v12 create event.
    pub room_id: Option<&'a RoomId>,
    /// Sender.
    pub sender: &'a UserId,
    /// Event type.
    pub kind: &'a str,
    /// State key, for state events.
    pub state_key: Option<&'a str>,
    /// Content (must be a JSON object).
    pub content: &'a Value,
    /// For v10 redactions, the top-level `redacts`.
    pub redacts: Option<&'a EventId>,
    /// Previous events.
    pub prev_events: &'a [OwnedEventId],
    /// Auth events.
    pub auth_events: &'a [OwnedEventId],
    /// Depth.
    pub depth: i64,
    /// Origin timestamp.
    pub origin_server_ts: i64,
}

/// Converts JSON to canonical JSON; floats and out-of-range integers are `M_BAD_JSON`.
pub fn to_canonical(value: &Value) -> Result<CanonicalJsonValue> {
    CanonicalJsonValue::try_from(value.clone())
        .map_err(|e| Error::bad_json(format!("Event content is not canonical JSON: {e}")))
}

/// Builds, hashes and signs a PDU; returns its event ID and full JSON.
pub fn build_pdu(
    template: &PduTemplate<'_>,
    rules: &RoomVersionRules,
    server_name: &ServerName,
    key_pair: &Ed25519KeyPair,
) -> Result<(OwnedEventId, Value)> {
    let ids = |list: &[OwnedEventId]| {
        CanonicalJsonValue::Array(
            list.iter()
                .map(|id| CanonicalJsonValue::String(id.to_string()))
                .collect(),
        )
    };
    let mut object = CanonicalJsonObject::new();
    object.insert("auth_events".into(), ids(template.auth_events));
    object.insert("prev_events".into(), ids(template.prev_events));
    object.insert("content".into(), to_canonical(template.content)?);
    object.insert(
        "depth".into(),
        CanonicalJsonValue::Integer(template.depth.try_into().map_err(Error::internal)?),
    );
    object.insert(
        "origin_server_ts".into(),
        CanonicalJsonValue::Integer(
            template
                .origin_server_ts
                .try_into()
                .map_err(Error::internal)?,
        ),
    );
    if let Some(room_id) = template.room_id {
        object.insert(
            "room_id".into(),
            CanonicalJsonValue::String(room_id.to_string()),
        );
    }
    object.insert(
        "sender".into(),
        CanonicalJsonValue::String(template.sender.to_string()),
    );
    object.insert(
        "type".into(),
        CanonicalJsonValue::String(template.kind.to_owned()),
    );
    if let Some(state_key) = template.state_key {
        object.insert(
            "state_key".into(),
            CanonicalJsonValue::String(state_key.to_owned()),
        );
    }
    if let Some(redacts) = template.redacts {
        object.insert(
            "redacts".into(),
            CanonicalJsonValue::String(redacts.to_string()),
        );
    }
    hash_and_sign_event(
        server_name.as_str(),
        key_pair,
        &mut object,
        &rules.redaction,
    )
    .map_err(pdu_error)?;
    let hash = reference_hash(&object, rules).map_err(pdu_error)?;
    let event_id = EventId::parse(format!("${hash}")).map_err(Error::internal)?;
    let json = serde_json::to_value(&object).map_err(Error::internal)?;
    if json.to_string().len() > MAX_PDU_BYTES {
        return Err(too_large());
    }
    Ok((event_id, json))
}

fn too_large() -> Error {
    Error::too_large(format!("Event is larger than {MAX_PDU_BYTES} bytes"))
}

fn pdu_error(err: ruma::signatures::JsonError) -> Error {
    match err {
        ruma::signatures::JsonError::PduTooLarge => too_large(),
        other => Error::bad_json(format!("Invalid event: {other}")),
    }
}

/// The client-format event (what `/event`, `/state` and `/sync` serve) of a stored PDU.
/// `redaction` is the redaction event's client form when the event was redacted.
pub fn client_event(
    event_id: &str,
    room_id: &str,
    pdu: &Value,
    rules: &RoomVersionRules,
    redaction: Option<Value>,
    now: i64,
) -> Value {
    let redacted;
    let pdu = match &redaction {
        Some(_) => {
            redacted = prune(pdu, rules);
            &redacted
        }
        None => pdu,
    };
    let mut event = Map::new();
    for key in [
        "content",
        "origin_server_ts",
        "sender",
        "state_key",
        "type",
        "redacts",
    ] {
        if let Some(value) = pdu.get(key) {
            event.insert(key.to_owned(), value.clone());
        }
    }
    // Room v11+ moved `redacts` into the content; clients still read the top-level key.
    if pdu.get("type").and_then(Value::as_str) == Some("m.room.redaction")
        && !event.contains_key("redacts")
    {
        if let Some(redacts) = pdu.pointer("/content/redacts") {
            event.insert("redacts".into(), redacts.clone());
        }
    }
    event.insert("event_id".into(), Value::from(event_id));
    event.insert("room_id".into(), Value::from(room_id));
    let ts = pdu
        .get("origin_server_ts")
        .and_then(Value::as_i64)
        .unwrap_or(now);
    let mut unsigned = Map::new();
    unsigned.insert("age".into(), Value::from((now - ts).max(0)));
    if let Some(redaction) = redaction {
        unsigned.insert("redacted_because".into(), redaction);
    }
    event.insert("unsigned".into(), Value::Object(unsigned));
    Value::Object(event)
}

/// Whether client events carry their `room_id`. The events of a sync's room sections (`/sync`
/// and sliding sync) leave it out, as the spec's `ClientEventWithoutRoomID` does and Synapse
/// does: the room is their key, and with every member's event the field is a sixth of a big
/// account's initial sync. Everywhere else events carry it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoomIdField {
    Carried,
    Omitted,
}

/// Takes `room_id` out of a client event and out of the events bundled into it (the
/// redaction that redacted it, its thread's latest event, its edit), for a sync's room
/// sections ([`RoomIdField::Omitted`]).
pub fn omit_room_ids(event: &mut Value) {
    let Some(object) = event.as_object_mut() else {
        return;
    };
    object.remove("room_id");
    let Some(unsigned) = object.get_mut("unsigned") else {
        return;
    };
    if let Some(redaction) = unsigned.get_mut("redacted_because") {
        omit_room_ids(redaction);
    }
    if let Some(relations) = unsigned.get_mut("m.relations") {
        if let Some(latest) = relations.pointer_mut("/m.thread/latest_event") {
            omit_room_ids(latest);
        }
        if let Some(edit) = relations.get_mut("m.replace") {
            omit_room_ids(edit);
        }
    }
}

/// The client-format event of an unredacted event read as its parts, written as JSON text
/// without building a tree: what [`client_event`] makes of the same event (without `room_id`
/// when [`RoomIdField::Omitted`]). Not for redacted events or redactions (their client form
/// needs the whole PDU); `None` for those.
pub fn client_event_from_parts(
    parts: ClientEventParts,
    now: i64,
    room_id_field: RoomIdField,
) -> Result<Option<Box<RawJsonValue>>> {
    if parts.redacted_by.is_some() || parts.event_type == "m.room.redaction" {
        return Ok(None);
    }
    #[derive(serde::Serialize)]
    struct Unsigned {
        age: i64,
    }
    #[derive(serde::Serialize)]
    struct Event<'a> {
        content: &'a RawJsonValue,
        event_id: &'a str,
        origin_server_ts: i64,
        #[serde(skip_serializing_if = "Option::is_none")]
        room_id: Option<&'a str>,
        sender: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        state_key: Option<&'a str>,
        #[serde(rename = "type")]
        kind: &'a str,
        unsigned: Unsigned,
    }
    let content =
        RawJsonValue::from_string(without_spaces(parts.content)).map_err(Error::internal)?;
    let event = Event {
        content: &content,
        event_id: &parts.event_id,
        origin_server_ts: parts.origin_server_ts,
        room_id: (room_id_field == RoomIdField::Carried).then_some(parts.room_id.as_str()),
        sender: &parts.sender,
        state_key: parts.state_key.as_deref(),
        kind: &parts.event_type,
        unsigned: Unsigned {
            age: (now - parts.origin_server_ts).max(0),
        },
    };
    serde_json::value::to_raw_value(&event)
        .map(Some)
        .map_err(Error::internal)
}

/// JSON text without the spaces outside its strings (PostgreSQL writes `jsonb` with one after
/// each `:` and `,`), as serde writes it.
fn without_spaces(json: String) -> String {
    if !json.contains(' ') {
        return json;
    }
    let mut out = String::with_capacity(json.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in json.chars() {
        if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
        } else if c == ' ' {
            continue;
        }
        out.push(c);
    }
    out
}

/// A PDU pruned by the room version's redaction algorithm: what is left of a redacted event,
/// and what its signatures and event ID cover. A PDU that cannot be pruned (not an object, or
/// not canonical JSON) loses everything but its ID-bearing shell: serving the original would
/// leak what the redaction took away.
pub fn prune(pdu: &Value, rules: &RoomVersionRules) -> Value {
    CanonicalJsonValue::try_from(pdu.clone())
        .ok()
        .and_then(|v| match v {
            CanonicalJsonValue::Object(object) => redact(object, &rules.redaction, None).ok(),
            _ => None,
        })
        .and_then(|object| serde_json::to_value(object).ok())
        .unwrap_or_else(|| {
            let mut shell = Map::new();
            for key in ["type", "room_id", "sender", "state_key", "origin_server_ts"] {
                if let Some(value) = pdu.get(key) {
                    shell.insert(key.to_owned(), value.clone());
                }
            }
            shell.insert("content".into(), Value::Object(Map::new()));
            Value::Object(shell)
        })
}

/// Milliseconds as `MilliSecondsSinceUnixEpoch`.
pub fn millis(ms: i64) -> MilliSecondsSinceUnixEpoch {
    MilliSecondsSinceUnixEpoch(UInt::new(ms.max(0) as u64).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spaces_go_from_postgresql_json_text_but_not_from_its_strings() {
        let stored = r#"{"a": "b c", "d": [1, {"e": null}], "f": "q\" x\\", "g": " "}"#;
        let compact = without_spaces(stored.to_owned());
        assert_eq!(
            compact,
            r#"{"a":"b c","d":[1,{"e":null}],"f":"q\" x\\","g":" "}"#
        );
        let value: Value = serde_json::from_str(stored).unwrap();
        assert_eq!(compact, serde_json::to_string(&value).unwrap());
    }

    /// Builds a v11 message whose body is `len` bytes; answers its size or the error.
    fn message_of(len: usize) -> Result<usize> {
        let der = Ed25519KeyPair::generate();
        let key_pair = Ed25519KeyPair::from_der(&der, "a".into()).unwrap();
        let room: &RoomId = "!room:example.org".try_into().unwrap();
        let sender: &UserId = "@alice:example.org".try_into().unwrap();
        let content = serde_json::json!({ "msgtype": "m.text", "body": "x".repeat(len) });
        let template = PduTemplate {
            room_id: Some(room),
            sender,
            kind: "m.room.message",
            state_key: None,
            content: &content,
            redacts: None,
            prev_events: &[],
            auth_events: &[],
            depth: 1,
            origin_server_ts: 1_700_000_000_000,
        };
        let server: &ServerName = "example.org".try_into().unwrap();
        build_pdu(&template, &RoomVersionRules::V11, server, &key_pair)
            .map(|(_, json)| json.to_string().len())
    }

    #[test]
    fn events_stop_one_byte_under_the_spec_limit_where_ruma_peers_do() {
        let sample = message_of(1_000).unwrap();
        let largest = 1_000 + (MAX_PDU_BYTES - sample);
        assert_eq!(message_of(largest).unwrap(), 65_535);
        let err = message_of(largest + 1).unwrap_err();
        assert_eq!(err.errcode(), "M_TOO_LARGE");
    }
}
