//! The server's ed25519 signing key: generated on first start, stored in PostgreSQL, never
//! regenerated (other servers pin it to verify our events).

use base64::{engine::general_purpose::STANDARD_NO_PAD, Engine};
use rand::{distr::Alphanumeric, Rng};
use ruma::signatures::Ed25519KeyPair;

use crate::{
    error::{Error, Result},
    storage::{now_ms, rooms as store, Db},
};

/// The signing key and its ID (`ed25519:<version>`).
pub struct ServerKeys {
    /// The key pair used to sign events and requests.
    pub key_pair: Ed25519KeyPair,
}

impl ServerKeys {
    /// Loads the key, creating it if the database has none (every process ends up on the oldest).
    pub async fn load_or_create(db: &Db) -> Result<Self> {
        let conn = db.conn().await?;
        if store::get_signing_key(&conn).await?.is_none() {
            let version: String = rand::rng()
                .sample_iter(&Alphanumeric)
                .take(6)
                .map(char::from)
                .collect();
            let der = Ed25519KeyPair::generate();
            store::insert_signing_key(&conn, &format!("ed25519:a_{version}"), &der, now_ms())
                .await?;
        }
        let (key_id, der) = store::get_signing_key(&conn)
            .await?
            .ok_or_else(|| Error::internal("no signing key"))?;
        let version = key_id
            .strip_prefix("ed25519:")
            .unwrap_or(&key_id)
            .to_owned();
        let key_pair = Ed25519KeyPair::from_der(&der, version).map_err(Error::internal)?;
        Ok(ServerKeys { key_pair })
    }

    /// The key ID, e.g. `ed25519:a_AbCdEf`.
    pub fn key_id(&self) -> String {
        format!("ed25519:{}", self.key_pair.version())
    }

    /// The unpadded base64 public key.
    pub fn public_key_base64(&self) -> String {
        STANDARD_NO_PAD.encode(self.key_pair.public_key())
    }
}
