//! Typing notifications: checked here, then announced to every server process.

use std::time::{Duration, Instant};

use ruma::{RoomId, UserId};

use super::Rooms;
use crate::{
    error::{Error, Result},
    service::{federation::edus::TYPING_RENEW_AFTER, notifier::TYPING_CHANNEL, typing},
    storage::rooms::notify,
};

impl Rooms {
    /// Starts (with a timeout) or stops the user's typing in a room. Under load a start is
    /// dropped once the sender is known to be in the room: typing is the first thing to shed,
    /// and announcing it (waking every syncing member) is what costs. A stop always goes out:
    /// lost, it would show the user typing until their timeout.
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
        if timeout.is_some() && self.db.is_saturated() {
            tracing::debug!(%room_id, "typing update shed under load");
            crate::metrics::metrics()
                .shed
                .get_or_create(&crate::metrics::Kind { kind: "typing" })
                .inc();
            return Ok(());
        }
        let payload = typing::encode(room_id.as_str(), user_id.as_str(), timeout);
        notify(&conn, TYPING_CHANNEL, &payload).await?;
        if self.should_federate_typing(room_id, user_id, timeout.is_some()) {
            self.federation
                .queue_typing(&conn, room_id.as_str(), user_id, timeout.is_some())
                .await?;
        }
        Ok(())
    }

    /// Whether other servers must hear of this typing update: every stop, a start unless
    /// this process told them of the same typing less than [`TYPING_RENEW_AFTER`] ago (a
    /// client renews typing every few seconds; the receivers' timeout is longer).
    fn should_federate_typing(&self, room_id: &RoomId, user_id: &UserId, typing: bool) -> bool {
        let key = (room_id.as_str().to_owned(), user_id.as_str().to_owned());
        let mut sent = self.typing_sent.lock().unwrap_or_else(|e| e.into_inner());
        if !typing {
            sent.pop(&key);
            return true;
        }
        if sent
            .get(&key)
            .is_some_and(|at| at.elapsed() < TYPING_RENEW_AFTER)
        {
            return false;
        }
        sent.put(key, Instant::now());
        true
    }
}
