//! Per-connection state: what each room was last sent with, kept in PostgreSQL so a `pos`
//! survives a restart and works on any server process.
//!
//! A `pos` is `{version}/{sync token}`. A response that changes what the connection knows
//! mints a new version, recorded as *pending*: the client may never have received it. The
//! next request shows which one it holds: a pending version (it becomes the base, the rows it
//! superseded and the other pending versions are deleted) or the base again (a retry: the
//! pending ones are dropped). Several are pending when a request the client gave up on (a
//! long-poll it cancelled to send another) answered after the one it kept.
//! Version 0 keeps no state (a connection without lists or subscriptions, such as Element X's
//! `encryption` connection, never touches the tables).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use actix_web::http::StatusCode;

use super::model::{RequiredState, RoomConfig};
use crate::{
    error::{Error, Result},
    service::sync::token::SyncToken,
    storage::{now_ms, sliding_sync as store, Db},
};

/// Unused connections are forgotten after this long (a later `pos` gets `M_UNKNOWN_POS`).
pub const CONNECTION_EXPIRY_MS: i64 = 7 * 24 * 3600 * 1000;
/// `last_used_ts` is rewritten at most this often when nothing else changes.
const TOUCH_EVERY_MS: i64 = 5 * 60 * 1000;
/// Connections kept per device (the least recently used go first).
const CONNECTIONS_PER_DEVICE: i64 = 10;

/// `400 M_UNKNOWN_POS`: the client must start the connection again.
pub fn unknown_pos(why: &str) -> Error {
    Error::matrix(StatusCode::BAD_REQUEST, "M_UNKNOWN_POS", why)
}

/// A parsed `pos`.
#[derive(Debug, Clone, Copy)]
pub struct Pos {
    /// Connection version.
    pub version: i64,
    /// Where the streams stood.
    pub token: SyncToken,
}

impl Pos {
    /// Parses `{version}/{sync token}`; anything else is `M_UNKNOWN_POS` (a client that
    /// stored a corrupt `pos` must be told to start over, not wedged).
    pub fn parse(pos: &str) -> Result<Pos> {
        let bad = || unknown_pos("Unknown position");
        let (version, token) = pos.split_once('/').ok_or_else(bad)?;
        let version = version
            .parse::<i64>()
            .ok()
            .filter(|v| *v >= 0)
            .ok_or_else(bad)?;
        let token = SyncToken::parse(token).map_err(|_| bad())?;
        Ok(Pos { version, token })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pos_round_trips_and_garbage_is_unknown() {
        let pos = Pos::parse("12/s5_1_2_3_4_5_6").unwrap();
        assert_eq!(pos.version, 12);
        assert_eq!(pos.token.events, 5);
        assert_eq!(pos.to_string(), "12/s5_1_2_3_4_5_6");
        for bad in ["", "12", "/s5", "-1/s5", "x/s5", "1/", "1/t5", "1/s5/2"] {
            let err = Pos::parse(bad).unwrap_err();
            assert_eq!(err.errcode(), "M_UNKNOWN_POS", "{bad}");
        }
    }
}

impl std::fmt::Display for Pos {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.version, self.token)
    }
}

/// What a connection has sent of one room.
#[derive(Debug, Clone, PartialEq)]
pub struct RoomStatus {
    /// The user's membership when it was sent.
    pub membership: String,
    /// `None`: everything up to the request's `pos` was sent ("live"); otherwise the room
    /// changed after this event position without being sent.
    pub events_from: Option<i64>,
    /// What it was sent with (shared: most rooms of a connection have the same).
    pub config: Arc<RoomConfig>,
}

/// Room statuses of one version of a connection.
pub type RoomStatuses = HashMap<String, RoomStatus>;

/// Connections' room statuses by (connection, version), so a request whose `pos` this
/// process served reads nothing but the connection row. A version's statuses never change,
/// so an entry is right whichever process moved the connection since; each connection keeps
/// its base and its newest version.
#[derive(Default)]
pub struct Cache {
    /// Connection key -> its cached `(version, statuses)`.
    entries: Mutex<HashMap<i64, Vec<CachedVersion>>>,
}

/// One cached version of a connection.
type CachedVersion = (i64, Arc<RoomStatuses>);

/// Connections cached per process (all of them dropped when there are more).
const CACHED_CONNECTIONS: usize = 4096;

impl Cache {
    fn get(&self, conn_key: i64, version: i64) -> Option<Arc<RoomStatuses>> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .get(&conn_key)?
            .iter()
            .find(|(v, _)| *v == version)
            .map(|(_, rooms)| rooms.clone())
    }

    /// Keeps `rooms` as `version`, and of the connection's other versions only `keep`.
    fn put(&self, conn_key: i64, version: i64, rooms: Arc<RoomStatuses>, keep: i64) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= CACHED_CONNECTIONS && !entries.contains_key(&conn_key) {
            entries.clear();
        }
        let versions = entries.entry(conn_key).or_default();
        versions.retain(|(v, _)| *v == keep && *v != version);
        versions.push((version, rooms));
    }
}

/// A connection as a request found it.
pub struct Connection {
    /// Its key (`None`: a stateless connection).
    pub conn_key: Option<i64>,
    /// The version the request is served from.
    pub base_version: i64,
    /// Room statuses at that version (absent: never sent).
    pub rooms: Arc<RoomStatuses>,
}

/// Loads (or starts) the connection a request names, checking its `pos`.
pub async fn open(
    db: &Db,
    cache: &Cache,
    (user_id, device_id, conn_id): (&str, &str, &str),
    pos: Option<&Pos>,
    stateful: bool,
) -> Result<Connection> {
    if !stateful && pos.is_some_and(|p| p.version == 0) {
        // A connection that never kept state goes on keeping none, without a write.
        return Ok(Connection {
            conn_key: None,
            base_version: 0,
            rooms: Arc::default(),
        });
    }
    let mut pooled = db.conn().await?;
    let now = now_ms();
    // The steady state (the client shows the base, nothing pending, used lately, its
    // statuses cached here) needs no write and so no lock: one read.
    if let Some(pos) = pos.filter(|p| p.version != 0) {
        if let Some(row) = store::get_connection(&pooled, user_id, device_id, conn_id).await? {
            let steady = row.base_version == pos.version
                && row.pending_versions.is_empty()
                && row.last_used_ts >= now - TOUCH_EVERY_MS;
            if let Some(rooms) = cache.get(row.conn_key, pos.version).filter(|_| steady) {
                return Ok(Connection {
                    conn_key: Some(row.conn_key),
                    base_version: pos.version,
                    rooms,
                });
            }
            // The next commonest: the client shows the version it was last sent.
            if row.pending_versions.contains(&pos.version) {
                if let Some(rooms) = cache.get(row.conn_key, pos.version) {
                    let unexpired = now - CONNECTION_EXPIRY_MS;
                    let versions = (row.base_version, pos.version);
                    if store::try_acknowledge(&pooled, row.conn_key, versions, (now, unexpired))
                        .await?
                    {
                        cache.put(row.conn_key, pos.version, rooms.clone(), pos.version);
                        return Ok(Connection {
                            conn_key: Some(row.conn_key),
                            base_version: pos.version,
                            rooms,
                        });
                    }
                }
            }
        }
    }
    crate::storage::transaction::transaction(&mut pooled, async |conn| {
        let fresh = async |conn: &diesel_async::AsyncPgConnection| -> Result<Connection> {
            store::delete_connection(conn, user_id, device_id, conn_id).await?;
            if !stateful {
                return Ok(Connection {
                    conn_key: None,
                    base_version: 0,
                    rooms: Arc::default(),
                });
            }
            store::delete_unused_since(conn, now - CONNECTION_EXPIRY_MS).await?;
            let version = store::next_version(conn).await?;
            let conn_key =
                store::create_connection(conn, (user_id, device_id, conn_id), version, now).await?;
            store::trim_device_connections(conn, user_id, device_id, CONNECTIONS_PER_DEVICE)
                .await?;
            Ok(Connection {
                conn_key: Some(conn_key),
                base_version: version,
                rooms: Arc::default(),
            })
        };
        let Some(pos) = pos.filter(|p| p.version != 0) else {
            return fresh(conn).await;
        };
        let row = store::lock_connection(conn, user_id, device_id, conn_id)
            .await?
            .ok_or_else(|| unknown_pos("Unknown position"))?;
        if row.last_used_ts < now - CONNECTION_EXPIRY_MS {
            store::delete_connection(conn, user_id, device_id, conn_id).await?;
            return Err(unknown_pos("The connection expired"));
        }
        if row.pending_versions.contains(&pos.version) {
            store::acknowledge(conn, row.conn_key, (row.base_version, pos.version), now).await?;
        } else if pos.version == row.base_version {
            if !row.pending_versions.is_empty() || row.last_used_ts < now - TOUCH_EVERY_MS {
                store::drop_pending(conn, row.conn_key, row.base_version, now).await?;
            }
        } else {
            return Err(unknown_pos("Unknown position"));
        }
        let rooms = match cache.get(row.conn_key, pos.version) {
            Some(rooms) => rooms,
            None => {
                let rooms = Arc::new(load_rooms(conn, row.conn_key, pos.version).await?);
                cache.put(row.conn_key, pos.version, rooms.clone(), pos.version);
                rooms
            }
        };
        Ok(Connection {
            conn_key: Some(row.conn_key),
            base_version: pos.version,
            rooms,
        })
    })
    .await
}

/// A connection's statuses at its base version, read from the database.
async fn load_rooms(
    conn: &diesel_async::AsyncPgConnection,
    conn_key: i64,
    version: i64,
) -> Result<RoomStatuses> {
    let mut configs: HashMap<(i32, serde_json::Value), Arc<RoomConfig>> = HashMap::new();
    Ok(store::get_base_rooms(conn, conn_key, version)
        .await?
        .into_iter()
        .map(|r| {
            let config = configs
                .entry((r.timeline_limit, r.required_state))
                .or_insert_with_key(|(limit, state)| {
                    Arc::new(RoomConfig {
                        timeline_limit: (*limit).max(0) as u64,
                        required_state: serde_json::from_value::<RequiredState>(state.clone())
                            .unwrap_or_default(),
                    })
                })
                .clone();
            (
                r.room_id,
                RoomStatus {
                    membership: r.membership,
                    events_from: r.events_from,
                    config,
                },
            )
        })
        .collect())
}

/// Records the statuses a response changed as a new pending version; returns the version
/// the response's `pos` carries.
pub async fn save(
    db: &Db,
    cache: &Cache,
    connection: &Connection,
    changes: Vec<(String, RoomStatus)>,
) -> Result<i64> {
    let Some(conn_key) = connection.conn_key.filter(|_| !changes.is_empty()) else {
        return Ok(connection.base_version);
    };
    let rows: Vec<store::RoomRow> = changes
        .iter()
        .map(|(room_id, status)| store::RoomRow {
            conn_key,
            room_id: room_id.clone(),
            version: 0,
            membership: status.membership.clone(),
            events_from: status.events_from,
            timeline_limit: status.config.timeline_limit.min(i32::MAX as u64) as i32,
            required_state: serde_json::to_value(&status.config.required_state).unwrap_or_default(),
        })
        .collect();
    let pooled = db.conn().await?;
    let version = store::write_pending(&pooled, conn_key, connection.base_version, &rows)
        .await?
        // Another request on this connection moved its base meanwhile: this response's view
        // is stale.
        .ok_or_else(|| unknown_pos("The connection moved on"))?;
    let mut rooms = RoomStatuses::clone(&connection.rooms);
    rooms.extend(changes);
    cache.put(conn_key, version, Arc::new(rooms), connection.base_version);
    Ok(version)
}
