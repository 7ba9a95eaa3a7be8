//! Users' membership lists, kept in memory between syncs.
//!
//! Every `/sync` and sliding sync starts from the user's memberships: for an account in a
//! thousand rooms, a thousand rows to read and decode per request, although they rarely
//! change. A trigger on `room_memberships` moves a per-user counter with every change,
//! whichever process or path writes it (member events, forgetting, purges), so a request
//! reads that one row and reuses the list it has when the counter has not moved.

use std::{num::NonZeroUsize, sync::Arc, sync::Mutex};

use diesel_async::AsyncPgConnection;
use lru::LruCache;

use crate::{error::Result, storage::memberships as store};

/// One membership: `(room_id, membership, event_id, stream_ordering)`.
pub type Membership = (String, String, String, i64);

/// Users whose lists one process keeps (a list is about 200 bytes a room).
const USERS_CACHED: usize = 1024;

/// A user's list and the counter it was read at.
type Versioned = (i64, Arc<Vec<Membership>>);

/// The cache: user ID -> the counter the list was read at, and the list.
pub struct MembershipCache(Mutex<LruCache<String, Versioned>>);

impl Default for MembershipCache {
    fn default() -> Self {
        MembershipCache(Mutex::new(LruCache::new(
            NonZeroUsize::new(USERS_CACHED).expect("non-zero"),
        )))
    }
}

impl MembershipCache {
    /// Every room the user has a membership in (not forgotten), as of now or later.
    pub async fn get(
        &self,
        conn: &AsyncPgConnection,
        user_id: &str,
    ) -> Result<Arc<Vec<Membership>>> {
        let version = store::get_user_membership_version(conn, user_id).await?;
        if let Some((at, list)) = self.lock().get(user_id) {
            if *at == version {
                record("hit");
                return Ok(list.clone());
            }
        }
        record("miss");
        // Read after the counter: the list holds at least every change the counter counts,
        // so a later change moves the counter past `version` and is never hidden.
        let list = Arc::new(store::get_user_memberships(conn, user_id).await?);
        let mut cached = self.lock();
        // A concurrent request may have stored a list read at a later counter: keep that one.
        if cached.peek(user_id).is_none_or(|(at, _)| *at <= version) {
            cached.put(user_id.to_owned(), (version, list.clone()));
        }
        Ok(list)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<String, Versioned>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn record(result: &'static str) {
    crate::metrics::metrics()
        .cache_requests
        .get_or_create(&crate::metrics::CacheLabels {
            cache: "user_memberships",
            result,
        })
        .inc();
}
