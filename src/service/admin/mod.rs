//! The Synapse-compatible admin API's domain logic: accounts (`users.rs`), rooms
//! (`rooms.rs`) and history purges (`history.rs`). Every event it causes (leaves, joins,
//! profile changes) goes through the rooms service's normal write path, so the auth rules and
//! fan-out apply as for any client.

mod history;
mod rooms;
mod users;

use std::sync::Arc;

pub use history::PurgePoint;
pub use rooms::{DeleteRoom, NewRoom, RoomPage};
pub use users::{UserPage, UserUpdate};

use crate::{config::Config, storage::Db};

/// Most rows one admin list returns, whatever `limit` asks.
pub const MAX_PAGE: i64 = 1000;

/// The admin API.
pub struct Admin {
    db: Db,
    config: Arc<Config>,
}

impl Admin {
    /// Creates the service.
    pub fn new(db: Db, config: Arc<Config>) -> Self {
        Admin { db, config }
    }
}

/// `(from, limit)` clamped to what a list serves.
fn page_bounds(from: i64, limit: i64) -> (i64, i64) {
    (from.max(0), limit.clamp(0, MAX_PAGE))
}
