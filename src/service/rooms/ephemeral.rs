//! Typing notifications: checked here, then announced to every server process.

use std::time::Duration;

use ruma::{RoomId, UserId};

use super::Rooms;
use crate::{
    error::{Error, Result},
    service::{notifier::TYPING_CHANNEL, typing},
    storage::rooms::notify,
};

impl Rooms {
    /// Starts (with a timeout) or stops the user's typing in a room. Under load the update is
    /// dropped once the sender is known to be in the room: typing is the first thing to shed,
    /// and announcing it (waking every syncing member) is what costs.
    pub async fn set_typing(
        &self,
        user_id: &UserId,
        room_id: &RoomId,
        timeout: Option<Duration>,
    ) -> Result<()> {
        let conn = self.db.conn().await?;
        if !self.is_joined(&conn, room_id, user_id).await? {
            return Err(Error::forbidden("You are not in this room"));
        }
        if self.db.is_saturated() {
            tracing::debug!(%room_id, "typing update shed under load");
            return Ok(());
        }
        let payload = typing::encode(room_id.as_str(), user_id.as_str(), timeout);
        notify(&conn, TYPING_CHANNEL, &payload).await?;
        Ok(())
    }
}
