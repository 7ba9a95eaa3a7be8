//! Whom a room's events wake, kept per room between events and kept current by the membership
//! changes a trigger announces (migration 000046), instead of read again after each of them:
//! in a room of 20,000 members every join was followed by a read of every member.
//!
//! A change may be announced after the read that already saw it (the read and the
//! notifications come over different connections), and applying an old change again could
//! drop someone who joined since. So the read also takes the statement's snapshot, and a
//! change is applied only when its transaction was not visible in that snapshot. Changes
//! announced while the read is under way wait for it and are then filtered the same way.

use std::{
    collections::HashSet,
    num::NonZeroUsize,
    sync::{Arc, Mutex, MutexGuard},
};

use lru::LruCache;
use serde::Deserialize;
use tokio::sync::OnceCell;

/// The memberships a room's events wake: a member's syncs, and those of users invited or
/// knocking (their invite or knock shows in their syncs).
pub(super) const AUDIENCE: [&str; 3] = ["join", "invite", "knock"];
/// Most rooms whose audience is kept.
const AUDIENCE_ROOMS: usize = 1_000;
/// Most members kept over all rooms: beyond it the least recently woken rooms are forgotten
/// (the room being added is kept whatever its size).
const AUDIENCE_MEMBERS: usize = 100_000;

/// A PostgreSQL snapshot (`pg_current_snapshot()` as text: `xmin:xmax:xip,...`): which
/// transactions' writes a statement saw.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Snapshot {
    xmin: u64,
    xmax: u64,
    in_progress: Vec<u64>,
}

impl Snapshot {
    /// Parses the text form; `None` for anything else.
    pub(crate) fn parse(text: &str) -> Option<Snapshot> {
        let mut parts = text.splitn(3, ':');
        let xmin = parts.next()?.parse().ok()?;
        let xmax = parts.next()?.parse().ok()?;
        let in_progress = match parts.next()? {
            "" => Vec::new(),
            list => list
                .split(',')
                .map(|xid| xid.parse().ok())
                .collect::<Option<_>>()?,
        };
        Some(Snapshot {
            xmin,
            xmax,
            in_progress,
        })
    }

    /// Whether the committed transaction `xid` was visible in the snapshot (as PostgreSQL's
    /// `pg_visible_in_snapshot`).
    fn saw(&self, xid: u64) -> bool {
        xid < self.xmin || (xid < self.xmax && !self.in_progress.contains(&xid))
    }
}

/// What the trigger announces on `myelin_members`.
pub(crate) enum Announcement {
    /// A membership row written.
    Change(MemberChange),
    /// A row deleted (a purge), announced as the bare room ID: the room's audience is
    /// forgotten.
    Forget(String),
    /// JSON this process cannot read: no kept audience can be trusted.
    Unreadable,
}

impl Announcement {
    pub(crate) fn parse(payload: &str) -> Announcement {
        #[derive(Deserialize)]
        struct Announced {
            room: String,
            user: String,
            membership: String,
            xid: String,
        }
        if !payload.starts_with('{') {
            return Announcement::Forget(payload.to_owned());
        }
        let Ok(announced) = serde_json::from_str::<Announced>(payload) else {
            return Announcement::Unreadable;
        };
        match announced.xid.parse() {
            Ok(xid) => Announcement::Change(MemberChange {
                room: announced.room,
                user: announced.user,
                membership: announced.membership,
                xid,
            }),
            Err(_) => Announcement::Unreadable,
        }
    }
}

/// One membership row written.
#[derive(Debug)]
pub(crate) struct MemberChange {
    pub room: String,
    pub user: String,
    pub membership: String,
    /// The writing transaction's ID (`pg_current_xact_id()`).
    xid: u64,
}

impl MemberChange {
    /// Whether the user is now among those the room's events wake.
    pub(crate) fn enters_audience(&self) -> bool {
        AUDIENCE.contains(&self.membership.as_str())
    }
}

/// What is known of one room's audience.
enum State {
    /// Being read: the changes announced meanwhile, applied once it is known.
    Reading(Vec<MemberChange>),
    /// Read, as of `snapshot`, with the changes announced since.
    Known {
        members: HashSet<String>,
        snapshot: Snapshot,
    },
}

/// One room's audience. The wake-ups that come while it is read wait for that read rather
/// than make their own.
pub(super) struct RoomAudience {
    read: OnceCell<()>,
    state: Mutex<State>,
}

impl RoomAudience {
    fn new() -> Self {
        RoomAudience {
            read: OnceCell::new(),
            state: Mutex::new(State::Reading(Vec::new())),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `read` (the members and the snapshot they were read in) unless an earlier call
    /// did, then `wake` with the members.
    pub(super) async fn wake<E, F, R>(
        &self,
        read: F,
        wake: impl FnOnce(&HashSet<String>),
    ) -> Result<(), E>
    where
        F: FnOnce() -> R,
        R: std::future::Future<Output = Result<(Vec<String>, Snapshot), E>>,
    {
        self.read
            .get_or_try_init(|| async {
                let (members, snapshot) = read().await?;
                self.fill(members, snapshot);
                Ok(())
            })
            .await?;
        if let State::Known { members, .. } = &*self.state() {
            wake(members);
        }
        Ok(())
    }

    /// Records what a read found and applies the changes it did not see.
    fn fill(&self, members: Vec<String>, snapshot: Snapshot) {
        let mut state = self.state();
        let pending = match &mut *state {
            State::Reading(pending) => std::mem::take(pending),
            State::Known { .. } => return,
        };
        let mut members: HashSet<String> = members.into_iter().collect();
        for change in pending {
            apply(&mut members, &snapshot, change);
        }
        *state = State::Known { members, snapshot };
    }

    /// Applies an announced change, or keeps it for the read under way.
    fn change(&self, change: MemberChange) {
        match &mut *self.state() {
            State::Reading(pending) => pending.push(change),
            State::Known { members, snapshot } => apply(members, snapshot, change),
        }
    }

    fn len(&self) -> usize {
        match &*self.state() {
            State::Known { members, .. } => members.len(),
            State::Reading(_) => 0,
        }
    }
}

/// Applies a change the snapshot did not see.
fn apply(members: &mut HashSet<String>, snapshot: &Snapshot, change: MemberChange) {
    if snapshot.saw(change.xid) {
        return;
    }
    match change.enters_audience() {
        true => members.insert(change.user),
        false => members.remove(&change.user),
    };
}

/// The audiences of the rooms woken lately.
pub(super) struct RoomAudiences {
    rooms: LruCache<String, Arc<RoomAudience>>,
}

impl Default for RoomAudiences {
    fn default() -> Self {
        RoomAudiences {
            rooms: LruCache::new(NonZeroUsize::new(AUDIENCE_ROOMS).expect("non-zero")),
        }
    }
}

impl RoomAudiences {
    /// The room's audience, made (unread) when the room has none.
    pub(super) fn room(&mut self, room_id: &str) -> Arc<RoomAudience> {
        if let Some(room) = self.rooms.get(room_id) {
            return room.clone();
        }
        let mut held: usize = self.rooms.iter().map(|(_, room)| room.len()).sum();
        while held > AUDIENCE_MEMBERS {
            match self.rooms.pop_lru() {
                Some((_, room)) => held -= room.len(),
                None => break,
            }
        }
        let room = Arc::new(RoomAudience::new());
        self.rooms.put(room_id.to_owned(), room.clone());
        room
    }

    /// Applies an announced change to the room's audience, if one is kept.
    pub(super) fn change(&mut self, change: MemberChange) {
        if let Some(room) = self.rooms.peek(&change.room) {
            room.change(change);
        }
    }

    /// Forgets a room's audience. A read still under way fills an audience nobody will find.
    pub(super) fn forget(&mut self, room_id: &str) {
        self.rooms.pop(room_id);
    }

    /// Forgets every room's audience.
    pub(super) fn clear(&mut self) {
        self.rooms.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(user: &str, membership: &str, xid: u64) -> MemberChange {
        MemberChange {
            room: "!r:example.org".into(),
            user: user.into(),
            membership: membership.into(),
            xid,
        }
    }

    #[test]
    fn snapshot_sees_what_committed_before_it() {
        let snapshot = Snapshot::parse("100:105:101,103").expect("parses");
        assert!(snapshot.saw(99));
        assert!(snapshot.saw(102));
        assert!(snapshot.saw(104));
        assert!(!snapshot.saw(101));
        assert!(!snapshot.saw(103));
        assert!(!snapshot.saw(105));
        assert_eq!(
            Snapshot::parse("7:7:"),
            Some(Snapshot {
                xmin: 7,
                xmax: 7,
                in_progress: vec![]
            })
        );
        assert_eq!(Snapshot::parse("7:x:"), None);
        assert_eq!(Snapshot::parse("7:8"), None);
    }

    /// A change the read saw is not applied again when announced late: the member who left
    /// and came back stays.
    #[test]
    fn changes_apply_unless_the_read_saw_them() {
        let room = RoomAudience::new();
        // Announced while the read is under way: the leave (xid 10) was seen, the join of
        // bob (xid 12) not.
        room.change(change("@alice:x", "leave", 10));
        room.change(change("@bob:x", "join", 12));
        room.fill(
            vec!["@alice:x".into(), "@carol:x".into()],
            Snapshot::parse("11:13:12").expect("parses"),
        );
        // Announced after the read: carol's leave, seen (xid 9); dave's invite, not.
        room.change(change("@carol:x", "leave", 9));
        room.change(change("@dave:x", "invite", 13));
        room.change(change("@bob:x", "ban", 14));
        let State::Known { members, .. } = &*room.state() else {
            panic!("the read filled it");
        };
        let mut members: Vec<&str> = members.iter().map(String::as_str).collect();
        members.sort_unstable();
        assert_eq!(members, ["@alice:x", "@carol:x", "@dave:x"]);
    }

    #[test]
    fn announcements_are_changes_forgotten_rooms_or_unreadable() {
        assert!(matches!(
            Announcement::parse("!r:example.org"),
            Announcement::Forget(room) if room == "!r:example.org"
        ));
        let Announcement::Change(parsed) = Announcement::parse(
            r#"{"room":"!r:example.org","user":"@a:x","membership":"knock","xid":"5"}"#,
        ) else {
            panic!("a change");
        };
        assert!(parsed.enters_audience());
        assert_eq!((parsed.user.as_str(), parsed.xid), ("@a:x", 5));
        for unreadable in [
            r#"{"room":"!r:example.org","user":"@a:x","membership":"join","xid":"x"}"#,
            r#"{"room":"!r:example.org"}"#,
        ] {
            assert!(matches!(
                Announcement::parse(unreadable),
                Announcement::Unreadable
            ));
        }
    }
}
