//! The first three of the spec's checks on a PDU received from another server, the ones that
//! need no room state: its format for the room version, the signatures of the servers that
//! must sign it, and its content hash. A PDU failing the first two is dropped; one whose hash
//! does not match is kept in its redacted form (its content may have been tampered with, its
//! signed skeleton has not).
//!
//! Every way a remote event comes in (`/send`, `send_join`, invites, backfill, fetched auth
//! events) goes through [`Federation::check_pdu`].

use std::collections::BTreeMap;

use ruma::{
    canonical_json::{redact, CanonicalJsonObject, CanonicalJsonValue},
    room_version_rules::RoomVersionRules,
    serde::Base64,
    signatures::{required_server_signatures_to_verify_event, verify_event, Verified},
    OwnedEventId, ServerName,
};

use super::Federation;
use crate::{error::Result, service::keys::ServerKeys, storage::now_ms};

/// A PDU that passed checks 1 to 3.
#[derive(Debug, Clone)]
pub struct CheckedPdu {
    /// Its event ID (the reference hash).
    pub event_id: OwnedEventId,
    /// The PDU, redacted when its content hash did not match.
    pub pdu: CanonicalJsonObject,
    /// Whether it was redacted for a bad content hash.
    pub redacted: bool,
}

/// A PDU's `depth` as it claims it (0 when missing or malformed): what orders a batch of
/// PDUs of one room before they are checked.
pub fn claimed_depth(object: &CanonicalJsonObject) -> i64 {
    match object.get("depth") {
        Some(CanonicalJsonValue::Integer(depth)) => i64::from(*depth),
        _ => 0,
    }
}

impl CheckedPdu {
    /// Its `prev_events` (those that are valid event IDs).
    pub fn prev_events(&self) -> Vec<OwnedEventId> {
        match self.pdu.get("prev_events") {
            Some(CanonicalJsonValue::Array(ids)) => ids
                .iter()
                .filter_map(|id| match id {
                    CanonicalJsonValue::String(id) => OwnedEventId::try_from(id.as_str()).ok(),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// Why a PDU was dropped.
#[derive(Debug, thiserror::Error)]
pub enum Dropped {
    /// Check 1: not a valid event of the room version.
    #[error("invalid event format: {0}")]
    Format(String),
    /// Check 2: a required signature is missing or wrong, or the keys cannot be had.
    #[error("bad signatures: {0}")]
    Signatures(String),
}

impl Federation {
    /// Runs checks 1 to 3 on `pdu`, a PDU of a room of version `rules`.
    pub async fn check_pdu(
        &self,
        rules: &RoomVersionRules,
        pdu: CanonicalJsonObject,
    ) -> Result<std::result::Result<CheckedPdu, Dropped>> {
        if let Err(problem) = ruma::state_res::check_pdu_format(&pdu, &rules.event_format) {
            return Ok(Err(Dropped::Format(problem.to_string())));
        }
        let event_id = match ruma::signatures::reference_hash(&pdu, rules)
            .map_err(|e| e.to_string())
            .and_then(|hash| OwnedEventId::try_from(format!("${hash}")).map_err(|e| e.to_string()))
        {
            Ok(event_id) => event_id,
            Err(problem) => return Ok(Err(Dropped::Format(problem))),
        };
        let servers = match required_server_signatures_to_verify_event(&pdu, &rules.signatures) {
            Ok(servers) => servers,
            Err(problem) => return Ok(Err(Dropped::Signatures(problem.to_string()))),
        };
        let at = match pdu.get("origin_server_ts") {
            Some(CanonicalJsonValue::Integer(ts)) => i64::from(*ts),
            _ => now_ms(),
        };
        let mut key_map = BTreeMap::new();
        for server in servers {
            let keys = match server == self.config.server_name {
                true => own_verify_keys(&self.own_keys),
                false => {
                    let Some(key_id) = signing_key_id(&pdu, &server) else {
                        return Ok(Err(Dropped::Signatures(format!(
                            "no signature from {server}"
                        ))));
                    };
                    self.remote_keys.keys_for(&server, &key_id, at).await?
                }
            };
            key_map.insert(server.to_string(), keys);
        }
        match verify_event(&key_map, &pdu, rules) {
            Ok(Verified::All) => Ok(Ok(CheckedPdu {
                event_id,
                pdu,
                redacted: false,
            })),
            Ok(Verified::Signatures) => match redact(pdu, &rules.redaction, None) {
                Ok(pdu) => Ok(Ok(CheckedPdu {
                    event_id,
                    pdu,
                    redacted: true,
                })),
                Err(problem) => Ok(Err(Dropped::Format(problem.to_string()))),
            },
            Err(problem) => Ok(Err(Dropped::Signatures(problem.to_string()))),
        }
    }
}

/// The ID of a key `server` signed `pdu` with (the first, when it signed with several).
fn signing_key_id(pdu: &CanonicalJsonObject, server: &ServerName) -> Option<String> {
    match pdu.get("signatures")? {
        CanonicalJsonValue::Object(signatures) => match signatures.get(server.as_str())? {
            CanonicalJsonValue::Object(keys) => keys.keys().next().cloned(),
            _ => None,
        },
        _ => None,
    }
}

/// Our own verify key, as a key set (events we signed come back in `send_join` answers,
/// backfill and invites).
fn own_verify_keys(own_keys: &ServerKeys) -> BTreeMap<String, Base64> {
    let key_pair = &own_keys.key_pair;
    BTreeMap::from([(
        format!("ed25519:{}", key_pair.version()),
        Base64::new(key_pair.public_key().to_vec()),
    )])
}
