//! Queries to other servers on behalf of our clients: profiles, room aliases and public room
//! directories. Errors become what a client should see, as Synapse answers them: the remote's
//! 4xx passed on (a 404 is always `M_NOT_FOUND`), an unreachable or broken server 502, a server
//! we may not contact 403.

use actix_web::http::StatusCode;
use ruma::{
    api::federation::{
        directory::{get_public_rooms, get_public_rooms_filtered},
        query::{get_profile_information, get_room_information},
    },
    directory::{Filter, RoomNetwork},
    profile::ProfileFieldName,
    OwnedRoomId, OwnedServerName, RoomAliasId, ServerName, UInt, UserId,
};
use serde_json::Value;

use super::{Federation, FederationError};
use crate::error::Error;

/// The Matrix error a client gets for a failed federation request; `what` names what was asked
/// for (`"profile"`, `"room alias"`), for the messages.
pub fn client_error(err: FederationError, what: &str) -> Error {
    match err {
        FederationError::NotAllowed(reason) => Error::forbidden(format!(
            "Cannot ask another server for this {what}: {reason}"
        )),
        FederationError::Remote { status: 404, .. } => Error::not_found(format!("No such {what}")),
        FederationError::Remote {
            status,
            errcode,
            error,
            server,
        } if (400..500).contains(&status) => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
            Error::matrix(
                status,
                known_errcode(&errcode),
                format!("{server} refused: {error}"),
            )
        }
        other => {
            tracing::info!("federation query for a {what} failed: {other}");
            Error::matrix(
                StatusCode::BAD_GATEWAY,
                "M_UNKNOWN",
                format!("Failed to fetch the {what} from the remote server"),
            )
        }
    }
}

/// The errcodes passed on to clients as they are; any other becomes `M_UNKNOWN`.
fn known_errcode(errcode: &str) -> &'static str {
    const KNOWN: &[&str] = &[
        "M_FORBIDDEN",
        "M_NOT_FOUND",
        "M_UNAUTHORIZED",
        "M_LIMIT_EXCEEDED",
        "M_INVALID_PARAM",
        "M_MISSING_PARAM",
        "M_BAD_JSON",
        "M_NOT_JSON",
        "M_UNRECOGNIZED",
        "M_TOO_LARGE",
        "M_INCOMPATIBLE_ROOM_VERSION",
    ];
    KNOWN
        .iter()
        .find(|k| **k == errcode)
        .copied()
        .unwrap_or("M_UNKNOWN")
}

/// One page of another server's public room directory.
pub type RemotePublicRooms = get_public_rooms_filtered::v1::Response;

impl Federation {
    /// A remote user's profile (all of it, or only `field`), asked of the user's server.
    pub async fn remote_profile(
        &self,
        user_id: &UserId,
        field: Option<&str>,
    ) -> Result<Vec<(String, Value)>, Error> {
        let mut request = get_profile_information::v1::Request::new(user_id.to_owned());
        request.field = field.map(ProfileFieldName::from);
        let response = self
            .client
            .send(user_id.server_name(), request)
            .await
            .map_err(|e| client_error(e, "profile"))?;
        Ok(response
            .into_iter()
            .filter(|(name, value)| field.is_none_or(|f| f == name) && !value.is_null())
            .collect())
    }

    /// A remote room alias, asked of the alias's server: the room and servers to join through.
    pub async fn remote_alias(
        &self,
        alias: &RoomAliasId,
    ) -> Result<(OwnedRoomId, Vec<OwnedServerName>), Error> {
        let request = get_room_information::v1::Request::new(alias.to_owned());
        let response = self
            .client
            .send(alias.server_name(), request)
            .await
            .map_err(|e| client_error(e, "room alias"))?;
        Ok((response.room_id, response.servers))
    }

    /// A page of `server`'s public room directory. Without a search term the plain `GET` is
    /// used (as Synapse does), with one the filtered `POST`.
    pub async fn remote_public_rooms(
        &self,
        server: &ServerName,
        limit: Option<UInt>,
        since: Option<String>,
        filter: Filter,
        room_network: RoomNetwork,
    ) -> Result<RemotePublicRooms, Error> {
        let unfiltered = filter.generic_search_term.is_none() && filter.room_types.is_empty();
        let result = if unfiltered {
            let mut request = get_public_rooms::v1::Request::new();
            request.limit = limit;
            request.since = since;
            request.room_network = room_network;
            self.client.send(server, request).await.map(|r| {
                let mut page = RemotePublicRooms::new();
                page.chunk = r.chunk;
                page.next_batch = r.next_batch;
                page.prev_batch = r.prev_batch;
                page.total_room_count_estimate = r.total_room_count_estimate;
                page
            })
        } else {
            let mut request = get_public_rooms_filtered::v1::Request::new();
            request.limit = limit;
            request.since = since;
            request.filter = filter;
            request.room_network = room_network;
            self.client.send(server, request).await
        };
        result.map_err(|e| client_error(e, "room directory"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_errors_map_to_client_errors() {
        let server: OwnedServerName = "remote.example".try_into().unwrap();
        let remote = |status: u16, errcode: &str| FederationError::Remote {
            server: server.clone(),
            status,
            errcode: errcode.into(),
            error: "nope".into(),
        };
        let status_and_code = |e: Error| match e {
            Error::Matrix {
                status, errcode, ..
            } => (status.as_u16(), errcode),
            other => panic!("not a Matrix error: {other}"),
        };
        assert_eq!(
            status_and_code(client_error(remote(404, "M_UNRECOGNIZED"), "profile")),
            (404, "M_NOT_FOUND")
        );
        assert_eq!(
            status_and_code(client_error(remote(403, "M_FORBIDDEN"), "profile")),
            (403, "M_FORBIDDEN")
        );
        assert_eq!(
            status_and_code(client_error(remote(400, "X_WEIRD"), "profile")),
            (400, "M_UNKNOWN")
        );
        assert_eq!(
            status_and_code(client_error(remote(500, "M_UNKNOWN"), "profile")),
            (502, "M_UNKNOWN")
        );
        assert_eq!(
            status_and_code(client_error(
                FederationError::Unreachable("down".into()),
                "profile"
            )),
            (502, "M_UNKNOWN")
        );
        assert_eq!(
            status_and_code(client_error(
                FederationError::NotAllowed("off".into()),
                "profile"
            )),
            (403, "M_FORBIDDEN")
        );
    }
}
