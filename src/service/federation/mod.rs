//! Federation (the Server-Server API): the signed-request client, server-name resolution,
//! server keys, and authentication of requests from other servers.

pub mod backfill;
pub mod client;
pub mod edus;
pub mod fetch;
pub mod hierarchy;
pub mod inbound_pdus;
pub mod invite;
pub mod join;
pub mod knock;
pub mod membership;
pub mod pacing;
pub mod pdu_queue;
pub mod pdus;
pub mod query;
pub mod reads;
pub mod resolver;
pub mod room_access;
pub mod sender;
pub mod server_keys;
pub mod transactions;

use std::sync::Arc;

use tokio::sync::Notify;

use ruma::{
    api::federation::authentication::{XMatrix, XMatrixVerificationError},
    OwnedServerName, ServerName,
};

use crate::{
    config::Config,
    error::{Error, Result},
    service::keys::ServerKeys,
    storage::{now_ms, Db},
};

pub use client::{FederationClient, FederationError};

/// Federation: the client to other servers and the checks on their requests to us.
pub struct Federation {
    /// Signed requests to other servers.
    pub client: Arc<FederationClient>,
    /// Other servers' keys.
    pub remote_keys: server_keys::RemoteKeys,
    /// Sends queued EDUs to other servers (started by `serve`).
    pub sender: Arc<sender::Sender>,
    /// Our own signing key (events we signed come back from other servers).
    own_keys: Arc<ServerKeys>,
    db: Db,
    config: Arc<Config>,
}

impl Federation {
    /// Builds the service; fails on an unreadable `MYELIN_FEDERATION_CA_FILE`. `sender_wake`
    /// is notified whenever something is queued for another server.
    pub fn new(
        db: Db,
        config: Arc<Config>,
        keys: Arc<ServerKeys>,
        sender_wake: Arc<Notify>,
    ) -> Result<Self> {
        let client = Arc::new(
            FederationClient::new(
                config.server_name.clone(),
                keys.clone(),
                config.federation.clone(),
                config.outbound.clone(),
            )
            .map_err(Error::internal)?,
        );
        let sender = sender::Sender::new(
            db.clone(),
            client.clone(),
            config.federation.clone(),
            config.server_name.clone(),
            sender_wake,
        );
        Ok(Federation {
            remote_keys: server_keys::RemoteKeys::new(db.clone(), client.clone()),
            client,
            sender,
            own_keys: keys,
            db,
            config,
        })
    }

    /// Whether federation is on.
    pub fn enabled(&self) -> bool {
        self.config.federation.enabled
    }

    /// Authenticates a request from another server by its X-Matrix header, over the request
    /// exactly as received (raw path and query, body bytes). Answers the origin server.
    ///
    /// 401 `M_UNAUTHORIZED` for a missing or malformed header, a `destination` that is not us,
    /// keys that cannot be had, or a bad signature; 403 `M_FORBIDDEN` for a server that may
    /// not federate with us.
    pub async fn authenticate(&self, request: &http::Request<&[u8]>) -> Result<OwnedServerName> {
        let header = XMatrix::extract_from_http_headers(request.headers())
            .map_err(|e| unauthorized(format!("Missing or malformed X-Matrix header: {e}")))?;
        let ours = &self.config.server_name;
        if header.destination.as_ref().is_some_and(|d| d != ours) {
            return Err(unauthorized("The X-Matrix destination is not this server"));
        }
        let origin = header.origin.clone();
        if origin == *ours {
            return Err(unauthorized("The X-Matrix origin is this server"));
        }
        if !self.config.federation.allows(&origin) {
            return Err(Error::forbidden(format!(
                "{origin} may not federate with this server"
            )));
        }
        let keys = self
            .remote_keys
            .key_map(&origin, header.key.as_str(), now_ms())
            .await?;
        if keys
            .get(origin.as_str())
            .is_none_or(|k| !k.contains_key(header.key.as_str()))
        {
            return Err(unauthorized(format!(
                "Could not get key {} of {origin}",
                header.key
            )));
        }
        header
            .verify_http_request(request, ours, &keys)
            .map_err(|e| match e {
                XMatrixVerificationError::DestinationMismatch => {
                    unauthorized("The X-Matrix destination is not this server")
                }
                other => unauthorized(format!("Bad X-Matrix signature: {other}")),
            })?;
        self.sender.destination_is_up(&origin);
        Ok(origin)
    }

    /// Whether `server` may federate with us (the allow list).
    pub fn allows(&self, server: &ServerName) -> bool {
        self.config.federation.allows(server)
    }
}

/// 401 `M_UNAUTHORIZED`.
fn unauthorized(message: impl Into<String>) -> Error {
    Error::matrix(
        actix_web::http::StatusCode::UNAUTHORIZED,
        "M_UNAUTHORIZED",
        message,
    )
}
