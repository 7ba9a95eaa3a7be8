//! Provisional stream positions for multi-event transactions.

use std::sync::atomic::{AtomicI64, Ordering};

use diesel_async::AsyncPgConnection;
use ruma::RoomId;

use crate::{error::Result, storage::rooms as store};

/// Provisional positions for the events of one multi-event transaction (createRoom, an
/// upgrade): each append takes the next (negative, unique across transactions, decreasing in
/// append order), and [`DeferredPositions::finish`] turns them into real positions just
/// before commit, so readers are not held below the transaction's positions from its first
/// event on.
pub struct DeferredPositions {
    next: AtomicI64,
    count: AtomicI64,
}

impl Default for DeferredPositions {
    fn default() -> Self {
        use rand::Rng;
        // Far below zero (below any backfilled event's position) and random, so concurrent
        // transactions' provisional positions never meet (positions are unique).
        let start = -rand::rng().random_range(-store::PROVISIONAL_POSITIONS_BELOW..1_i64 << 61);
        DeferredPositions {
            next: AtomicI64::new(start),
            count: AtomicI64::new(0),
        }
    }
}

impl DeferredPositions {
    /// The next provisional position.
    pub(super) fn take(&self) -> i64 {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.next.fetch_sub(1, Ordering::Relaxed)
    }

    /// Gives every event appended so far in these rooms its real position (call it last in
    /// the transaction); says how many there were.
    pub async fn finish(&self, conn: &AsyncPgConnection, room_ids: &[&RoomId]) -> Result<u64> {
        let rooms: Vec<&str> = room_ids.iter().map(|r| r.as_str()).collect();
        let count = self.count.swap(0, Ordering::Relaxed);
        store::renumber_provisional_positions(conn, &rooms, count).await?;
        Ok(u64::try_from(count).unwrap_or(0))
    }
}
