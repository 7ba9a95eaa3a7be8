//! Client-Server API handlers, one file per area.

pub mod account;
pub mod account_data;
pub mod appservice;
pub mod backup;
pub mod dehydrated_devices;
pub mod delayed_events;
pub mod devices;
pub mod directory;
pub mod discovery;
pub mod events;
pub mod filters;
pub mod keys;
pub mod lookups;
pub mod media;
pub mod notifications;
pub mod presence;
pub mod profile;
pub mod push_rules;
pub mod pushers;
pub mod receipts;
pub mod register;
pub mod relations;
pub mod reports;
pub mod rooms;
pub mod search;
pub mod session;
pub mod sliding_sync;
pub mod spaces;
pub mod sync;
pub mod tags;
pub mod thirdparty;
pub mod typing;
pub mod voip;

use ruma::UserId;

use crate::error::{Error, Result};

/// Refuses acting on another user's data.
pub(crate) fn ensure_self(caller: &UserId, target: &UserId, what: &str) -> Result<()> {
    if caller == target {
        Ok(())
    } else {
        Err(Error::forbidden(format!("Cannot {what} for other users")))
    }
}
