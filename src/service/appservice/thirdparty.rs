//! Third-party lookups (`/_matrix/client/v3/thirdparty/*`), answered by the appservices, as
//! Synapse answers them:
//! - the protocols are those the registrations list (`protocols`); each one's metadata is the
//!   appservice's `GET /_matrix/app/v1/thirdparty/protocol/{protocol}` (kept for an hour; a
//!   failure for a minute, so an appservice that is down does not hold up every client),
//!   each instance with a `network_id` given the `instance_id` `{appservice id}|{network_id}`;
//!   when several appservices serve a protocol, the first's metadata with everyone's
//!   instances;
//! - user and location lookups go to every appservice that registered the protocol, at once,
//!   and their answers are merged; an answer that is not a list, and entries without their
//!   `userid`/`alias`, `protocol` and `fields`, are left out, and so is an appservice that
//!   fails;
//! - reverse lookups (`?alias=`, `?userid=`) go to the appservices whose alias or users
//!   namespace holds the name.
//!
//! Every request carries the `hs_token`, waits at most [`QUERY_TIMEOUT`] and reads at most
//! [`MAX_ANSWER`] of the answer.

use std::{
    collections::BTreeMap,
    sync::{Mutex, MutexGuard},
    time::{Duration, Instant},
};

use futures_util::future::join_all;
use serde_json::{Map, Value};

use super::{encode, Appservices, Registration, MAX_ANSWER, QUERY_TIMEOUT};
use crate::error::{Error, Result};

/// How long a protocol's metadata is reused (Synapse's cache lasts as long).
const PROTOCOL_TTL: Duration = Duration::from_secs(3600);
/// How long a failed metadata lookup is remembered. Synapse remembers it as long as an
/// answer; shorter here, so a bridge that comes up is seen soon.
const FAILED_PROTOCOL_TTL: Duration = Duration::from_secs(60);

/// What a lookup looks for.
#[derive(Debug, Clone, Copy)]
pub enum ThirdPartyKind {
    /// Third-party users (answers carry `userid`).
    User,
    /// Third-party locations (answers carry `alias`).
    Location,
}

impl ThirdPartyKind {
    /// The path segment of the lookup.
    fn segment(self) -> &'static str {
        match self {
            ThirdPartyKind::User => "user",
            ThirdPartyKind::Location => "location",
        }
    }

    /// The Matrix ID each answer must carry.
    fn matrix_field(self) -> &'static str {
        match self {
            ThirdPartyKind::User => "userid",
            ThirdPartyKind::Location => "alias",
        }
    }
}

/// Protocol metadata fetched lately: `(appservice id, protocol)` -> when, and what (`None`
/// when the lookup failed).
type ProtocolMap = BTreeMap<(String, String), (Instant, Option<Value>)>;
/// [`ProtocolMap`], shared.
pub(super) type ProtocolCache = Mutex<ProtocolMap>;

fn unknown_protocol() -> Error {
    Error::not_found("Unknown protocol")
}

impl Appservices {
    /// Every protocol an appservice serves, with its metadata; protocols no appservice
    /// answered for are left out.
    pub async fn get_protocols(&self) -> Map<String, Value> {
        self.protocols(None).await
    }

    /// One protocol's metadata; 404 `M_NOT_FOUND` when no appservice serves it.
    pub async fn get_protocol(&self, protocol: &str) -> Result<Value> {
        self.protocols(Some(protocol))
            .await
            .remove(protocol)
            .ok_or_else(unknown_protocol)
    }

    /// Third-party users or locations matching `fields`, from every appservice that
    /// registered `protocol`; 404 `M_NOT_FOUND` when none did.
    pub async fn query_third_party(
        &self,
        kind: ThirdPartyKind,
        protocol: &str,
        fields: &BTreeMap<String, String>,
    ) -> Result<Vec<Value>> {
        let serving: Vec<&Registration> = self
            .all
            .iter()
            .filter(|r| r.protocols.iter().any(|p| p == protocol))
            .map(|r| &**r)
            .collect();
        if serving.is_empty() {
            return Err(unknown_protocol());
        }
        let path = format!("thirdparty/{}/{}", kind.segment(), encode(protocol));
        // The client's token is the client's business.
        let query: Vec<(&str, &str)> = fields
            .iter()
            .filter(|(name, _)| name.as_str() != "access_token")
            .map(|(name, value)| (name.as_str(), value.as_str()))
            .collect();
        Ok(self.lookup(&serving, kind, &path, &query).await)
    }

    /// The third-party users behind a Matrix user ID, or the locations behind a room alias,
    /// from the appservices whose namespace holds it.
    pub async fn query_matrix_id(&self, kind: ThirdPartyKind, matrix_id: &str) -> Vec<Value> {
        let serving: Vec<&Registration> = self
            .all
            .iter()
            .filter(|r| match kind {
                ThirdPartyKind::User => r.is_interested_in_user(matrix_id),
                ThirdPartyKind::Location => r.matches_alias(matrix_id, false),
            })
            .map(|r| &**r)
            .collect();
        let path = format!("thirdparty/{}", kind.segment());
        let query = [(kind.matrix_field(), matrix_id)];
        self.lookup(&serving, kind, &path, &query).await
    }

    /// `GET /_matrix/app/v1/{path}?{query}` of each of `serving` at once; their valid
    /// entries, in the order of the registrations.
    async fn lookup(
        &self,
        serving: &[&Registration],
        kind: ThirdPartyKind,
        path: &str,
        query: &[(&str, &str)],
    ) -> Vec<Value> {
        let answers = join_all(
            serving
                .iter()
                .map(|registration| self.get_json(registration, path, query)),
        )
        .await;
        let mut found = Vec::new();
        for (registration, answer) in serving.iter().zip(answers) {
            let entries = match answer {
                Some(Value::Array(entries)) => entries,
                Some(_) => {
                    tracing::warn!(appservice = %registration.id, %path, "not a list");
                    continue;
                }
                None => continue,
            };
            found.extend(
                entries
                    .into_iter()
                    .filter(|entry| is_valid_entry(entry, kind.matrix_field())),
            );
        }
        found
    }

    /// The protocols of the registrations (only `only` when given) with their metadata.
    async fn protocols(&self, only: Option<&str>) -> Map<String, Value> {
        let wanted: Vec<(&Registration, &str)> = self
            .all
            .iter()
            .flat_map(|r| r.protocols.iter().map(move |p| (&**r, p.as_str())))
            .filter(|(_, p)| only.is_none_or(|only| only == *p))
            .collect();
        let answers = join_all(
            wanted
                .iter()
                .map(|(registration, protocol)| self.protocol_metadata(registration, protocol)),
        )
        .await;
        let mut merged = Map::new();
        for ((_, protocol), answer) in wanted.into_iter().zip(answers) {
            let Some(metadata) = answer else {
                continue;
            };
            match merged.get_mut(protocol) {
                None => {
                    merged.insert(protocol.to_owned(), metadata);
                }
                Some(first) => {
                    let more = metadata["instances"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    if let Some(instances) = first["instances"].as_array_mut() {
                        instances.extend(more);
                    }
                }
            }
        }
        merged
    }

    /// An appservice's metadata of `protocol`, with instance IDs; `None` when it has no URL,
    /// fails, or answers without an `instances` list.
    async fn protocol_metadata(
        &self,
        registration: &Registration,
        protocol: &str,
    ) -> Option<Value> {
        let key = (registration.id.clone(), protocol.to_owned());
        if let Some((at, metadata)) = self.protocol_cache().get(&key) {
            let ttl = match metadata {
                Some(_) => PROTOCOL_TTL,
                None => FAILED_PROTOCOL_TTL,
            };
            if at.elapsed() < ttl {
                return metadata.clone();
            }
        }
        let metadata = self.fetch_protocol_metadata(registration, protocol).await;
        self.protocol_cache()
            .insert(key, (Instant::now(), metadata.clone()));
        metadata
    }

    /// [`Self::protocol_metadata`], asked of the appservice.
    async fn fetch_protocol_metadata(
        &self,
        registration: &Registration,
        protocol: &str,
    ) -> Option<Value> {
        let path = format!("thirdparty/protocol/{}", encode(protocol));
        let mut metadata = self.get_json(registration, &path, &[]).await?;
        let Some(instances) = metadata.get_mut("instances").and_then(Value::as_array_mut) else {
            tracing::warn!(appservice = %registration.id, %protocol, "protocol without instances");
            return None;
        };
        for instance in instances.iter_mut().filter_map(Value::as_object_mut) {
            if let Some(network_id) = instance.get("network_id").and_then(Value::as_str) {
                let instance_id = format!("{}|{network_id}", registration.id);
                instance.insert("instance_id".into(), Value::from(instance_id));
            }
        }
        Some(metadata)
    }

    fn protocol_cache(&self) -> MutexGuard<'_, ProtocolMap> {
        self.protocols_seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// `GET {url}/_matrix/app/v1/{path}?{query}` of one appservice: its JSON answer when it
    /// answers 2xx, else `None` (logged).
    async fn get_json(
        &self,
        registration: &Registration,
        path: &str,
        query: &[(&str, &str)],
    ) -> Option<Value> {
        let url = registration.url.as_ref()?;
        let mut target = reqwest::Url::parse(&format!("{url}/_matrix/app/v1/{path}")).ok()?;
        if !query.is_empty() {
            target.query_pairs_mut().extend_pairs(query);
        }
        let answer = self
            .outbound
            .send_to_configured(
                reqwest::Method::GET,
                target.as_str(),
                &registration.hs_token,
                None,
                QUERY_TIMEOUT,
                MAX_ANSWER,
            )
            .await;
        match answer {
            Ok(response) if response.status.is_success() => {
                match serde_json::from_slice(&response.body) {
                    Ok(value) => Some(value),
                    Err(err) => {
                        tracing::warn!(appservice = %registration.id, %path, "bad JSON: {err}");
                        None
                    }
                }
            }
            Ok(response) => {
                tracing::debug!(appservice = %registration.id, %path, status = %response.status, "lookup refused");
                None
            }
            Err(err) => {
                tracing::warn!(appservice = %registration.id, %path, "lookup failed: {err}");
                None
            }
        }
    }
}

/// Whether a lookup answer's entry has its Matrix ID (`matrix_field`) and `protocol` as
/// strings and `fields` as an object (Synapse drops the others).
fn is_valid_entry(entry: &Value, matrix_field: &str) -> bool {
    entry.get(matrix_field).is_some_and(Value::is_string)
        && entry.get("protocol").is_some_and(Value::is_string)
        && entry.get("fields").is_some_and(Value::is_object)
}
