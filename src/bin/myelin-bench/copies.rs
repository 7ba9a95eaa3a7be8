//! Copies of a message made as the server makes its own events, for histories loaded through
//! SQL (scenarios 11 and 14): each copy is a real PDU, its content hash, signature (the
//! server's key, read from its database) and event ID (the reference hash) computed by the
//! server's own code, so another server can be loaded with the same events
//! (`tests/bench/synapse_load.py`).

use std::sync::Arc;

use myelin::service::rooms::pdu::{build_pdu, PduTemplate};
use ruma::{
    room_version_rules::RoomVersionRules, signatures::Ed25519KeyPair, OwnedEventId, OwnedRoomId,
    OwnedUserId,
};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::client::Failure;

/// A message whose copies are made: its ID, the fields its copies share, and its room's rules.
pub struct Template {
    pub event_id: OwnedEventId,
    pdu: TemplatePdu,
    rules: RoomVersionRules,
}

/// The fields of the template message that its copies share.
#[derive(Deserialize)]
struct TemplatePdu {
    room_id: OwnedRoomId,
    sender: OwnedUserId,
    #[serde(rename = "type")]
    kind: String,
    auth_events: Vec<OwnedEventId>,
    depth: i64,
    origin_server_ts: i64,
    content: Value,
}

/// One copy: its ID and its PDU as text.
pub struct Copy {
    pub event_id: OwnedEventId,
    pub pdu: String,
}

impl Template {
    /// The template's timestamp.
    pub fn origin_server_ts(&self) -> i64 {
        self.pdu.origin_server_ts
    }

    /// Copy number `g` (its depth is the template's plus `g`) with `body` and timestamp `ts`,
    /// a child of `prev`.
    pub fn copy(
        &self,
        key: &Ed25519KeyPair,
        g: i64,
        body: &str,
        ts: i64,
        prev: &OwnedEventId,
    ) -> Result<Copy, Failure> {
        let TemplatePdu {
            room_id,
            sender,
            kind,
            auth_events,
            depth,
            content,
            ..
        } = &self.pdu;
        let mut content = content.clone();
        content["body"] = json!(body);
        let (event_id, pdu) = build_pdu(
            &PduTemplate {
                room_id: Some(room_id),
                sender,
                kind,
                state_key: None,
                content: &content,
                redacts: None,
                prev_events: std::slice::from_ref(prev),
                auth_events,
                depth: depth + g,
                origin_server_ts: ts,
            },
            &self.rules,
            sender.server_name(),
            key,
        )
        .map_err(|e| e.to_string())?;
        Ok(Copy {
            event_id,
            pdu: pdu.to_string(),
        })
    }
}

/// The messages `event_ids` as templates, in the order given.
pub async fn read_templates(
    db: &tokio_postgres::Client,
    event_ids: &[String],
) -> Result<Vec<Template>, Failure> {
    let rows = db
        .query(
            "SELECT t.event_id, e.pdu::text, r.room_version
             FROM unnest($1::text[]) WITH ORDINALITY AS t (event_id, n)
             JOIN events e USING (event_id) JOIN rooms r ON r.room_id = e.room_id
             ORDER BY t.n",
            &[&event_ids],
        )
        .await
        .map_err(|e| format!("reading the templates: {e}"))?;
    if rows.len() != event_ids.len() {
        return Err(format!(
            "{} of {} templates found",
            rows.len(),
            event_ids.len()
        ));
    }
    rows.iter()
        .map(|row| {
            let event_id: &str = row.get(0);
            Ok(Template {
                event_id: event_id
                    .try_into()
                    .map_err(|e| format!("the template's ID {event_id}: {e}"))?,
                pdu: serde_json::from_str(row.get(1))
                    .map_err(|e| format!("the template is not a message PDU: {e}"))?,
                rules: myelin::service::rooms::versions::rules_for(row.get(2))
                    .map_err(|e| e.to_string())?,
            })
        })
        .collect()
}

/// The server's signing key, from its database.
pub async fn server_key(db: &tokio_postgres::Client) -> Result<Arc<Ed25519KeyPair>, Failure> {
    let key = db
        .query_one(
            "SELECT key_id, secret_der FROM server_signing_keys ORDER BY created_ts, key_id LIMIT 1",
            &[],
        )
        .await
        .map_err(|e| format!("reading the server's signing key: {e}"))?;
    let key_id: String = key.get(0);
    let version = key_id.strip_prefix("ed25519:").unwrap_or(&key_id);
    Ed25519KeyPair::from_der(key.get(1), version.to_owned())
        .map(Arc::new)
        .map_err(|e| format!("the server's signing key: {e}"))
}

/// Whether `id`, a server-made ID going into SQL text, has only the characters IDs have.
pub fn plain_id(id: &str) -> bool {
    id.chars()
        .all(|c| c.is_ascii_alphanumeric() || "!$:._-".contains(c))
}
