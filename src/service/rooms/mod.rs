//! Rooms: the event graph, state, membership, aliases and the room directory.

pub mod alias;
pub mod create;
pub mod deferred;
pub mod ephemeral;
pub mod incoming;
mod members;
pub mod membership;
pub mod messages;
pub mod pdu;
pub mod power;
pub mod push_actions;
pub mod read;
pub mod receipts;
pub mod relations;
pub mod remote_join;
pub mod search;
pub mod send;
pub mod state_parts;
pub mod state_res;
pub mod summary;
pub mod upgrade;
pub mod versions;
pub mod visibility;
pub mod writer;

use std::{
    collections::HashMap,
    num::NonZeroUsize,
    sync::{Arc, Mutex},
    time::Instant,
};

use lru::LruCache;
use ruma::{RoomId, RoomVersionId};

use super::{federation::sender::Sender, keys::ServerKeys, rate_limit::RateLimiter};
use crate::{config::Config, storage::Db};

/// Matrix (Client-Server) versions `/versions` advertises: every endpoint a version adds that
/// clients rely on is served (README lists what later versions add that is missing). With the
/// room versions below because both say what the server speaks.
pub const SPEC_VERSIONS: &[&str] = &[
    "r0.5.0", "r0.6.0", "r0.6.1", "v1.1", "v1.2", "v1.3", "v1.4", "v1.5", "v1.6", "v1.7", "v1.8",
    "v1.9", "v1.10", "v1.11", "v1.12", "v1.13", "v1.14",
];

/// Room versions this server creates and joins.
pub const SUPPORTED_VERSIONS: [RoomVersionId; 3] =
    [RoomVersionId::V10, RoomVersionId::V11, RoomVersionId::V12];

/// The room version new rooms get unless the client asks for another.
pub const DEFAULT_VERSION: RoomVersionId = RoomVersionId::V12;

/// In-process per-room locks: writers of one room queue here before they take a database
/// connection and the room's advisory lock.
#[derive(Default)]
pub struct RoomLocks {
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl RoomLocks {
    /// Waits for the room's lock.
    pub async fn lock(&self, room_id: &RoomId) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
            if locks.len() > 10_000 {
                locks.retain(|_, lock| Arc::strong_count(lock) > 1);
            }
            locks
                .entry(room_id.as_str().to_owned())
                .or_default()
                .clone()
        };
        lock.lock_owned().await
    }
}

/// The rooms service.
pub struct Rooms {
    db: Db,
    config: Arc<Config>,
    keys: Arc<ServerKeys>,
    locks: RoomLocks,
    /// The message rate limit every client-asked event passes (see [`send::Origin`]).
    rate_limit: Arc<RateLimiter>,
    /// Queues typing and receipts for the other servers in a room.
    federation: Arc<Sender>,
    /// When this process last told other servers that a user (room, user) is typing.
    typing_sent: Mutex<LruCache<(String, String), Instant>>,
    /// Rooms' versions (a room's never changes): room ID -> version.
    versions: Mutex<LruCache<String, String>>,
    /// State events' client parts, by event ID.
    state_parts: state_parts::StatePartsCache,
}

impl Rooms {
    /// Creates the service.
    pub fn new(
        db: Db,
        config: Arc<Config>,
        keys: Arc<ServerKeys>,
        federation: Arc<Sender>,
        rate_limit: Arc<RateLimiter>,
    ) -> Self {
        Rooms {
            db,
            keys,
            locks: RoomLocks::default(),
            rate_limit,
            federation,
            typing_sent: Mutex::new(LruCache::new(NonZeroUsize::new(10_000).expect("non-zero"))),
            versions: Mutex::new(LruCache::new(NonZeroUsize::new(100_000).expect("non-zero"))),
            state_parts: state_parts::StatePartsCache::new(config.ops.state_cache_bytes),
            config,
        }
    }
}
