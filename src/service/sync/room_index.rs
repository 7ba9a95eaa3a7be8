//! The room-change index: for every room, the last stream position at which it changed and
//! the last at which a membership in it changed.
//!
//! An incremental sync asks it which of the user's rooms changed since the token, so it reads
//! only those rooms, and whether any membership changed in them, so it looks for device-list
//! changes that follow from memberships only then. It is refreshed from the database (only the
//! events newer than what it has seen) before each use, so it is correct with several server
//! processes.
//!
//! It holds only the rooms asked about since the start: a room is read from the database
//! (its newest events, found from the newest end) the first time a sync asks about it, and
//! refreshes keep up only the rooms it holds. A start therefore reads nothing, however big
//! the database, and the memory follows the rooms of the users who sync.

use std::collections::{HashMap, HashSet};

use diesel_async::AsyncPgConnection;
use tokio::sync::Mutex;

use crate::{error::Result, storage::room_index as store};

#[derive(Default)]
struct Index {
    /// Every event at or below this position is reflected in `rooms`.
    up_to: i64,
    /// Whether it was refreshed since the start (`up_to` means nothing before).
    started: bool,
    /// The rooms read so far.
    rooms: HashMap<String, LastChange>,
}

impl Index {
    /// Reads the rooms of `rooms` not held yet, as of `up_to`.
    async fn load<'a>(
        &mut self,
        conn: &AsyncPgConnection,
        rooms: impl Iterator<Item = &'a str>,
    ) -> Result<()> {
        let missing: Vec<String> = rooms
            .filter(|room| !self.rooms.contains_key(*room))
            .map(str::to_owned)
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        for change in store::get_room_last_changes(conn, &missing, self.up_to).await? {
            self.rooms.insert(
                change.room_id,
                LastChange {
                    event: change.last_event,
                    membership: change.last_membership.unwrap_or(0),
                    bump: change.last_bump.unwrap_or(0),
                },
            );
        }
        Ok(())
    }
}

/// Where a room last changed.
#[derive(Default, Clone, Copy, Debug)]
pub struct LastChange {
    /// Its newest event (the room's activity).
    pub event: i64,
    /// Its newest membership event.
    pub membership: i64,
    /// Its newest message-like event (`bump_stamp`; see `storage::room_index::BUMP_TYPES`).
    pub bump: i64,
}

/// Which of a user's rooms changed since a position.
pub struct Changes<'a> {
    /// The rooms with an event after the position.
    pub rooms: Vec<&'a str>,
    /// Those of them with a membership event after the position.
    pub membership_rooms: HashSet<&'a str>,
}

/// The room-change index (empty at first: rooms are read on first use).
#[derive(Default)]
pub struct RoomIndex {
    index: Mutex<Index>,
}

impl RoomIndex {
    /// Brings the index up to `persisted` (the event stream's persisted-up-to position, read
    /// on `conn`) and returns the position the index is at (never lower than before).
    pub async fn refresh(&self, conn: &AsyncPgConnection, persisted: i64) -> Result<i64> {
        // The caller holds its connection before this lock: a sync holds its connection while
        // it waits for the lock in `changed_since`, so taking them in the other order
        // deadlocks once more syncs run than the pool has connections (found by the fan-out
        // benchmark).
        let mut index = self.index.lock().await;
        if !index.started {
            // The first use since the start: nothing held, nothing to keep up.
            index.started = true;
            index.up_to = persisted;
            index.rooms.clear();
        }
        // Everything at or below the persisted-up-to position is committed: reading events up
        // to it sees every one. Rooms not held are read whole when first asked about (what a
        // range says of them alone would leave out their older memberships).
        if persisted > index.up_to {
            for change in store::get_rooms_changed_between(conn, index.up_to, persisted).await? {
                let Some(last) = index.rooms.get_mut(&change.room_id) else {
                    continue;
                };
                last.event = change.last_event;
                if let Some(membership) = change.last_membership {
                    last.membership = membership;
                }
                if let Some(bump) = change.last_bump {
                    last.bump = bump;
                }
            }
            index.up_to = persisted;
        }
        Ok(index.up_to)
    }

    /// Where each of `rooms` last changed, in their order (zeros for a room with no served
    /// event yet).
    pub async fn last_changes<'a>(
        &self,
        conn: &AsyncPgConnection,
        rooms: impl Iterator<Item = &'a str> + Clone,
    ) -> Result<Vec<LastChange>> {
        let mut index = self.index.lock().await;
        index.load(conn, rooms.clone()).await?;
        Ok(rooms
            .map(|room| index.rooms.get(room).copied().unwrap_or_default())
            .collect())
    }

    /// Compares up to `sample` random rooms' entries with the same facts recomputed from the
    /// events table; returns how many agreed and a line for each that did not.
    pub async fn check_sample(
        &self,
        conn: &AsyncPgConnection,
        sample: usize,
    ) -> Result<(usize, Vec<String>)> {
        use rand::seq::IteratorRandom;
        let (up_to, picked) = {
            let index = self.index.lock().await;
            let picked: Vec<(String, LastChange)> = index
                .rooms
                .iter()
                .choose_multiple(&mut rand::rng(), sample)
                .into_iter()
                .map(|(room, last)| (room.clone(), *last))
                .collect();
            (index.up_to, picked)
        };
        let rooms: Vec<String> = picked.iter().map(|(room, _)| room.clone()).collect();
        let facts: HashMap<String, LastChange> =
            crate::storage::consistency::get_room_changes(conn, &rooms, up_to)
                .await?
                .into_iter()
                .map(|change| {
                    let last = LastChange {
                        event: change.last_event,
                        membership: change.last_membership.unwrap_or(0),
                        bump: change.last_bump.unwrap_or(0),
                    };
                    (change.room_id, last)
                })
                .collect();
        let mut agreed = 0;
        let mut mismatches = Vec::new();
        for (room, live) in picked {
            let recomputed = facts.get(&room).copied().unwrap_or_default();
            if (live.event, live.membership, live.bump)
                == (recomputed.event, recomputed.membership, recomputed.bump)
            {
                agreed += 1;
            } else {
                mismatches.push(format!(
                    "{room}: index has {live:?}, the events say {recomputed:?} (up to {up_to})"
                ));
            }
        }
        Ok((agreed, mismatches))
    }

    /// Which of `rooms` changed after `since`.
    pub async fn changed_since<'a>(
        &self,
        conn: &AsyncPgConnection,
        rooms: impl Iterator<Item = &'a str> + Clone,
        since: i64,
    ) -> Result<Changes<'a>> {
        let mut index = self.index.lock().await;
        index.load(conn, rooms.clone()).await?;
        let mut changes = Changes {
            rooms: Vec::new(),
            membership_rooms: HashSet::new(),
        };
        for room in rooms {
            let last = index.rooms.get(room).copied().unwrap_or_default();
            if last.event > since {
                changes.rooms.push(room);
                if last.membership > since {
                    changes.membership_rooms.insert(room);
                }
            }
        }
        Ok(changes)
    }
}
