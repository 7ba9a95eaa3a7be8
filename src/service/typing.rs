//! Typing notifications: held in memory only, never in the timeline or the database.
//!
//! A change is announced with `NOTIFY myelin_typing` and applied by every server process when
//! the notification arrives (the sender's own included), so each keeps the same picture.
//! Every change takes a position from a clock that never runs behind wall-clock milliseconds,
//! which keeps positions comparable between processes; a sync token carries the position it
//! has seen.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicI64, Ordering},
        Mutex,
    },
    time::{Duration, Instant},
};

use crate::storage::now_ms;

/// Longest typing timeout a client may ask for.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Default)]
struct RoomTyping {
    /// Typing users and when their typing expires.
    users: HashMap<String, Instant>,
    /// Position of the last change.
    changed_at: i64,
}

/// Who is typing where.
#[derive(Default)]
pub struct Typing {
    clock: AtomicI64,
    rooms: Mutex<HashMap<String, RoomTyping>>,
}

/// The payload of a typing notification: room, user and timeout (0: stopped).
pub fn encode(room_id: &str, user_id: &str, timeout: Option<Duration>) -> String {
    let ms = timeout.map_or(0, |t| t.min(MAX_TIMEOUT).as_millis().max(1));
    format!("{room_id} {user_id} {ms}")
}

/// Parses [`encode`]'s payload.
pub fn decode(payload: &str) -> Option<(&str, &str, Option<Duration>)> {
    let mut parts = payload.split(' ');
    let (room, user, ms) = (parts.next()?, parts.next()?, parts.next()?);
    let ms: u64 = ms.parse().ok()?;
    Some((room, user, (ms > 0).then(|| Duration::from_millis(ms))))
}

impl Typing {
    /// A new position, after every earlier one and not behind the wall clock.
    fn tick(&self) -> i64 {
        let now = now_ms();
        let previous = self
            .clock
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |current| {
                Some(current.saturating_add(1).max(now))
            })
            .unwrap_or_default();
        previous.saturating_add(1).max(now)
    }

    /// The position a sync response reports.
    pub fn position(&self) -> i64 {
        self.clock.load(Ordering::SeqCst)
    }

    /// The rooms with typing state (someone typing, or a recent change).
    pub fn rooms(&self) -> Vec<String> {
        let rooms = self.rooms.lock().unwrap_or_else(|e| e.into_inner());
        rooms.keys().cloned().collect()
    }

    /// Starts (with a timeout) or stops a user's typing; returns whether anything changed.
    pub fn apply(&self, room_id: &str, user_id: &str, timeout: Option<Duration>) -> bool {
        let mut rooms = self.rooms.lock().unwrap_or_else(|e| e.into_inner());
        let room = rooms.entry(room_id.to_owned()).or_default();
        let was_typing = room.users.contains_key(user_id);
        match timeout {
            Some(timeout) => {
                room.users.insert(
                    user_id.to_owned(),
                    Instant::now() + timeout.min(MAX_TIMEOUT),
                );
            }
            None => {
                room.users.remove(user_id);
            }
        }
        // Renewing a timeout changes nothing anyone sees.
        let changed = was_typing != timeout.is_some();
        if changed {
            room.changed_at = self.tick();
        }
        changed
    }

    /// Drops typing that has timed out in a room; returns whether anything changed.
    pub fn expire(&self, room_id: &str) -> bool {
        let mut rooms = self.rooms.lock().unwrap_or_else(|e| e.into_inner());
        let Some(room) = rooms.get_mut(room_id) else {
            return false;
        };
        let now = Instant::now();
        let before = room.users.len();
        room.users.retain(|_, expires| *expires > now);
        let changed = room.users.len() != before;
        if changed {
            room.changed_at = self.tick();
        }
        if room.users.is_empty() {
            // Keep the change position until it cannot matter, then forget the room.
            let changed_at = room.changed_at;
            if now_ms() - changed_at > MAX_TIMEOUT.as_millis() as i64 {
                rooms.remove(room_id);
            }
        }
        changed
    }

    /// Typing users of the given rooms whose typing changed after `since` and at or before
    /// `up_to`, the position the response reports (initial sync: `None`, rooms where someone
    /// is typing). A change after `up_to` waits for the next sync: reported now, it would be
    /// reported again from the token this response hands out.
    pub fn changed_since<R: AsRef<str>>(
        &self,
        room_ids: impl IntoIterator<Item = R>,
        since: Option<i64>,
        up_to: i64,
    ) -> HashMap<String, Vec<String>> {
        let rooms = self.rooms.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        room_ids
            .into_iter()
            .filter_map(|room_id| {
                let room_id = room_id.as_ref();
                let room = rooms.get(room_id)?;
                let mut users: Vec<String> = room
                    .users
                    .iter()
                    .filter(|(_, expires)| **expires > now)
                    .map(|(user, _)| user.clone())
                    .collect();
                let report = match since {
                    Some(since) => room.changed_at > since && room.changed_at <= up_to,
                    None => !users.is_empty(),
                };
                users.sort();
                report.then(|| (room_id.to_owned(), users))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_after_the_reported_position_waits_for_the_next_sync() {
        let typing = Typing::default();
        let rooms = vec!["!r:x".to_owned()];
        let since = typing.position();
        // The response's position is read, then the change lands while it is being built.
        let reported = typing.position();
        assert!(typing.apply("!r:x", "@a:x", Some(Duration::from_secs(30))));
        assert!(typing
            .changed_since(&rooms, Some(since), reported)
            .is_empty());
        // The next sync, from the position handed out, reports it once.
        let next = typing.position();
        assert_eq!(
            typing.changed_since(&rooms, Some(reported), next)["!r:x"],
            ["@a:x"]
        );
        assert!(typing
            .changed_since(&rooms, Some(next), typing.position())
            .is_empty());
    }

    #[test]
    fn typing_is_reported_once_per_change_and_expires() {
        let typing = Typing::default();
        let rooms = vec!["!r:x".to_owned()];
        let start = typing.position();
        assert!(typing.apply("!r:x", "@a:x", Some(Duration::from_millis(30))));
        assert!(!typing.apply("!r:x", "@a:x", Some(Duration::from_millis(30))));
        let seen = typing.changed_since(&rooms, Some(start), typing.position());
        assert_eq!(seen["!r:x"], ["@a:x"]);
        let after = typing.position();
        assert!(typing
            .changed_since(&rooms, Some(after), typing.position())
            .is_empty());
        std::thread::sleep(Duration::from_millis(40));
        assert!(typing.expire("!r:x"));
        assert_eq!(
            typing.changed_since(&rooms, Some(after), typing.position())["!r:x"],
            Vec::<String>::new()
        );
        assert_eq!(
            decode(&encode("!r:x", "@a:x", None)),
            Some(("!r:x", "@a:x", None))
        );
    }
}
