//! The room versions this server supports, and the rules each brings.

use ruma::{room_version_rules::RoomVersionRules, RoomVersionId};

use crate::error::{Error, Result};

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
