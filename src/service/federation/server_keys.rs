//! Server keys: the document that publishes ours (`/_matrix/key/v2/server`), and other
//! servers' keys, fetched from them directly (no notary), checked and cached in PostgreSQL.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use ruma::{
    api::federation::discovery::get_server_keys,
    serde::Base64,
    signatures::{PublicKeyMap, PublicKeySet},
    CanonicalJsonObject, CanonicalJsonValue, ServerName,
};

use super::client::FederationClient;
use crate::{
    error::{Error, Result},
    service::keys::ServerKeys,
    storage::{federation as store, now_ms, Db},
};

/// How long the keys we publish may be cached by others.
const PUBLISHED_VALIDITY: Duration = Duration::from_secs(7 * 24 * 3600);
/// After a fetch that did not yield a needed key, how long before asking that server again
/// (a peer sending requests with unknown key IDs must not make us fetch on every request).
const REFETCH_AFTER: Duration = Duration::from_secs(10);

impl ServerKeys {
    /// Our key document, self-signed: current key, no retired keys (the key is never rotated),
    /// valid for a week.
    pub fn key_document(&self, server_name: &ServerName) -> Result<CanonicalJsonObject> {
        let valid_until = now_ms() + PUBLISHED_VALIDITY.as_millis() as i64;
        let mut verify_key = CanonicalJsonObject::new();
        verify_key.insert("key".into(), self.public_key_base64().into());
        let mut verify_keys = CanonicalJsonObject::new();
        verify_keys.insert(self.key_id(), CanonicalJsonValue::Object(verify_key));
        let mut doc = CanonicalJsonObject::new();
        doc.insert("server_name".into(), server_name.as_str().into());
        doc.insert(
            "verify_keys".into(),
            CanonicalJsonValue::Object(verify_keys),
        );
        doc.insert(
            "old_verify_keys".into(),
            CanonicalJsonValue::Object(CanonicalJsonObject::new()),
        );
        doc.insert(
            "valid_until_ts".into(),
            CanonicalJsonValue::Integer(valid_until.try_into().map_err(Error::internal)?),
        );
        ruma::signatures::sign_json(server_name.as_str(), &self.key_pair, &mut doc)
            .map_err(Error::internal)?;
        Ok(doc)
    }
}

/// How long keys read from the database are reused in memory (every signed request needs them).
const MEMORY_TTL: Duration = Duration::from_secs(300);

/// Other servers' keys.
pub struct RemoteKeys {
    db: Db,
    client: Arc<FederationClient>,
    /// When each server was last asked, to bound fetches for keys it does not have.
    last_fetch: Mutex<HashMap<String, Instant>>,
    /// Each server's stored keys, as last read, and when they were read.
    memory: Mutex<lru::LruCache<String, (Vec<store::RemoteKey>, Instant)>>,
}

impl RemoteKeys {
    /// Builds the store over the database and the federation client.
    pub fn new(db: Db, client: Arc<FederationClient>) -> Self {
        RemoteKeys {
            db,
            client,
            last_fetch: Mutex::new(HashMap::new()),
            memory: Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(1024).expect("non-zero"),
            )),
        }
    }

    /// The keys of `server` that may verify a signature made at `at` (ms): current keys valid
    /// until then, and retired keys that expired after it. Fetches from the server when the
    /// cache lacks `key_id`, or has it only with a validity that ends before `at`.
    pub async fn keys_for(
        &self,
        server: &ServerName,
        key_id: &str,
        at: i64,
    ) -> Result<PublicKeySet> {
        let cached = self.cached(server, at).await?;
        if cached.contains_key(key_id) {
            return Ok(cached);
        }
        if !self.may_fetch(server) {
            return Ok(cached);
        }
        match self.fetch(server).await {
            Ok(()) => self.cached(server, at).await,
            Err(problem) => {
                tracing::info!(%server, %problem, "could not fetch server keys");
                Ok(cached)
            }
        }
    }

    /// A public key map with the keys of `server` usable at `at`, fetching as `keys_for` does.
    pub async fn key_map(
        &self,
        server: &ServerName,
        key_id: &str,
        at: i64,
    ) -> Result<PublicKeyMap> {
        let keys = self.keys_for(server, key_id, at).await?;
        Ok(PublicKeyMap::from([(server.as_str().to_owned(), keys)]))
    }

    async fn cached(&self, server: &ServerName, at: i64) -> Result<PublicKeySet> {
        let remembered = self
            .memory
            .lock()
            .expect("not poisoned")
            .get(server.as_str())
            .filter(|(_, read)| read.elapsed() < MEMORY_TTL)
            .map(|(rows, _)| rows.clone());
        let rows = match remembered {
            Some(rows) => rows,
            None => {
                let conn = self.db.conn().await?;
                let rows = store::get_server_keys(&conn, server.as_str()).await?;
                self.memory
                    .lock()
                    .expect("not poisoned")
                    .put(server.as_str().to_owned(), (rows.clone(), Instant::now()));
                rows
            }
        };
        Ok(rows
            .into_iter()
            .filter(|k| match k.expired_ts {
                Some(expired) => expired > at,
                None => k.valid_until_ts >= at,
            })
            .filter_map(|k| Some((k.key_id, Base64::parse(&k.public_key).ok()?)))
            .collect())
    }

    fn may_fetch(&self, server: &ServerName) -> bool {
        let now = Instant::now();
        let mut last = self.last_fetch.lock().expect("not poisoned");
        if last.len() > 10_000 {
            last.retain(|_, at| now.duration_since(*at) < REFETCH_AFTER);
        }
        match last.get(server.as_str()) {
            Some(at) if now.duration_since(*at) < REFETCH_AFTER => false,
            _ => {
                last.insert(server.as_str().to_owned(), now);
                true
            }
        }
    }

    /// Fetches `/_matrix/key/v2/server` from `server`, checks that it is that server's and
    /// signed by its own current key, and stores its keys.
    async fn fetch(&self, server: &ServerName) -> std::result::Result<(), String> {
        let response = self
            .client
            .send(server, get_server_keys::v2::Request::new())
            .await
            .map_err(|e| e.to_string())?;
        let doc: CanonicalJsonObject = serde_json::from_str(response.server_key.json().get())
            .map_err(|e| format!("key document is not canonical JSON: {e}"))?;
        let keys = parse_key_document(server, &doc)?;
        let conn = self.db.conn().await.map_err(|e| e.to_string())?;
        store::store_server_keys(&conn, server.as_str(), &keys, now_ms())
            .await
            .map_err(|e| e.to_string())?;
        self.memory
            .lock()
            .expect("not poisoned")
            .pop(server.as_str());
        Ok(())
    }
}

/// The keys in another server's key document, after checking it names `server` and carries a
/// valid signature by one of its own current keys.
fn parse_key_document(
    server: &ServerName,
    doc: &CanonicalJsonObject,
) -> std::result::Result<Vec<store::RemoteKey>, String> {
    if doc.get("server_name").and_then(|v| v.as_str()) != Some(server.as_str()) {
        return Err("key document is for another server".into());
    }
    let valid_until_ts = match doc.get("valid_until_ts") {
        Some(CanonicalJsonValue::Integer(ts)) => i64::from(*ts),
        _ => return Err("key document has no valid_until_ts".into()),
    };
    let mut keys = Vec::new();
    let mut current = PublicKeySet::new();
    if let Some(CanonicalJsonValue::Object(verify_keys)) = doc.get("verify_keys") {
        for (key_id, value) in verify_keys {
            let Some(key) = value.as_object().and_then(|v| v.get("key")?.as_str()) else {
                continue;
            };
            let Ok(parsed) = Base64::parse(key) else {
                continue;
            };
            current.insert(key_id.clone(), parsed);
            keys.push(store::RemoteKey {
                key_id: key_id.clone(),
                public_key: key.to_owned(),
                valid_until_ts,
                expired_ts: None,
            });
        }
    }
    if current.is_empty() {
        return Err("key document has no usable verify_keys".into());
    }
    if let Some(CanonicalJsonValue::Object(old)) = doc.get("old_verify_keys") {
        for (key_id, value) in old {
            let Some(object) = value.as_object() else {
                continue;
            };
            let (Some(key), Some(CanonicalJsonValue::Integer(expired))) = (
                object.get("key").and_then(|k| k.as_str()),
                object.get("expired_ts"),
            ) else {
                continue;
            };
            if Base64::<ruma::serde::base64::Standard>::parse(key).is_err() {
                continue;
            }
            keys.push(store::RemoteKey {
                key_id: key_id.clone(),
                public_key: key.to_owned(),
                valid_until_ts: i64::from(*expired),
                expired_ts: Some(i64::from(*expired)),
            });
        }
    }
    let map = PublicKeyMap::from([(server.as_str().to_owned(), current)]);
    ruma::signatures::verify_json(&map, doc).map_err(|e| format!("key document signature: {e}"))?;
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ruma::signatures::Ed25519KeyPair;

    fn keys() -> ServerKeys {
        let der = Ed25519KeyPair::generate();
        ServerKeys {
            key_pair: Ed25519KeyPair::from_der(&der, "a_test".into()).unwrap(),
        }
    }

    #[test]
    fn our_document_verifies_and_a_tampered_one_does_not() {
        let name: &ServerName = "example.org:8448".try_into().unwrap();
        let keys = keys();
        let doc = keys.key_document(name).unwrap();
        let parsed = parse_key_document(name, &doc).unwrap();
        assert_eq!(parsed.len(), 1);
        assert_eq!(parsed[0].key_id, "ed25519:a_test");
        assert_eq!(parsed[0].public_key, keys.public_key_base64());

        let other: &ServerName = "other.org".try_into().unwrap();
        assert!(parse_key_document(other, &doc).is_err());

        let mut tampered = doc.clone();
        tampered.insert(
            "valid_until_ts".into(),
            CanonicalJsonValue::Integer(1u32.into()),
        );
        assert!(parse_key_document(name, &tampered).is_err());
    }
}
