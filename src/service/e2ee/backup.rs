//! Server-side key backup (`/room_keys`): versions, and room keys that only the user can
//! decrypt, kept by the spec's rules for which copy of a session key is the better one.

use diesel_async::AsyncPgConnection;
use ruma::UserId;
use serde_json::{json, Map, Value};

use crate::{
    error::{Error, Result},
    storage::{
        backup::{self as store, KeyRow},
        Db,
    },
};

/// The backup service.
pub struct Backup {
    db: Db,
}

/// Which keys of a version a request is about.
#[derive(Debug, Clone, Copy, Default)]
pub struct Selector<'a> {
    /// One room.
    pub room_id: Option<&'a str>,
    /// One session of that room.
    pub session_id: Option<&'a str>,
}

fn no_version() -> Error {
    Error::not_found("Unknown backup version")
}

/// Parses a version path segment (anything else is an unknown version, as in Synapse).
fn parse_version(version: &str) -> Result<i64> {
    version.parse().map_err(|_| no_version())
}

/// Whether `new` should replace `old` (spec: a verified key beats an unverified one, then a
/// lower first message index, then fewer forwards).
fn better(new: &KeyRow, old: &KeyRow) -> bool {
    if new.is_verified != old.is_verified {
        return new.is_verified;
    }
    (new.first_message_index, new.forwarded_count) < (old.first_message_index, old.forwarded_count)
}

/// A stored key in its wire form.
fn key_json(row: &KeyRow) -> Value {
    json!({
        "first_message_index": row.first_message_index,
        "forwarded_count": row.forwarded_count,
        "is_verified": row.is_verified,
        "session_data": row.session_data,
    })
}

impl Backup {
    /// Creates the service.
    pub fn new(db: Db) -> Self {
        Backup { db }
    }

    /// Creates a version; returns its number as the string clients use.
    pub async fn create_version(
        &self,
        user_id: &UserId,
        algorithm: &str,
        auth_data: &Value,
    ) -> Result<String> {
        let mut conn = self.db.conn().await?;
        let version = crate::storage::transaction::transaction(&mut conn, async |conn| {
            crate::storage::account_data::lock_account_data_row(
                conn,
                user_id.as_str(),
                "",
                "room_keys_version",
            )
            .await?;
            Ok(store::create_version(conn, user_id.as_str(), algorithm, auth_data).await?)
        })
        .await?;
        Ok(version.to_string())
    }

    /// A version's info (the latest when `version` is `None`), with its key count and etag.
    pub async fn version_info(&self, user_id: &UserId, version: Option<&str>) -> Result<Value> {
        let version = version.map(parse_version).transpose()?;
        let conn = self.db.conn().await?;
        let row = store::get_version(&conn, user_id.as_str(), version)
            .await?
            .ok_or_else(|| Error::not_found("No backup version"))?;
        let count = store::count_keys(&conn, user_id.as_str(), row.version).await?;
        Ok(json!({
            "algorithm": row.algorithm,
            "auth_data": row.auth_data,
            "count": count,
            "etag": row.etag.to_string(),
            "version": row.version.to_string(),
        }))
    }

    /// Replaces a version's auth data (its algorithm cannot change).
    pub async fn update_version(
        &self,
        user_id: &UserId,
        version: &str,
        algorithm: &str,
        auth_data: &Value,
    ) -> Result<()> {
        let number = parse_version(version)?;
        let conn = self.db.conn().await?;
        let row = store::get_version(&conn, user_id.as_str(), Some(number))
            .await?
            .ok_or_else(no_version)?;
        if row.algorithm != algorithm {
            return Err(Error::invalid_param(
                "The algorithm of a backup cannot change",
            ));
        }
        store::update_version(&conn, user_id.as_str(), number, auth_data).await?;
        Ok(())
    }

    /// Deletes a version and its keys.
    pub async fn delete_version(&self, user_id: &UserId, version: &str) -> Result<()> {
        let number = parse_version(version)?;
        let mut conn = self.db.conn().await?;
        let deleted = crate::storage::transaction::transaction(&mut conn, async |conn| {
            Ok(store::delete_version(conn, user_id.as_str(), number).await?)
        })
        .await?;
        if deleted {
            Ok(())
        } else {
            Err(no_version())
        }
    }

    /// Stores keys (`room -> session -> key`) into the current version, keeping the better copy
    /// of each session; returns the new `(etag, count)`.
    pub async fn put_keys(
        &self,
        user_id: &UserId,
        version: &str,
        rooms: &Map<String, Value>,
    ) -> Result<Value> {
        let number = parse_version(version)?;
        let user = user_id.as_str();
        let mut incoming = Vec::new();
        for (room_id, sessions) in rooms {
            let Some(sessions) = sessions.as_object() else {
                return Err(Error::bad_json("sessions must be an object"));
            };
            for (session_id, key) in sessions {
                let field = |name: &str| key.get(name);
                let (Some(first), Some(forwarded), Some(verified), Some(data)) = (
                    field("first_message_index").and_then(Value::as_i64),
                    field("forwarded_count").and_then(Value::as_i64),
                    field("is_verified").and_then(Value::as_bool),
                    field("session_data").filter(|d| d.is_object()),
                ) else {
                    return Err(Error::bad_json(format!(
                        "Key for session {session_id} lacks first_message_index, \
                         forwarded_count, is_verified or session_data"
                    )));
                };
                incoming.push(KeyRow {
                    user_id: user.to_owned(),
                    version: number,
                    room_id: room_id.clone(),
                    session_id: session_id.clone(),
                    first_message_index: first,
                    forwarded_count: forwarded,
                    is_verified: verified,
                    session_data: data.clone(),
                });
            }
        }
        let mut conn = self.db.conn().await?;
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            self.check_current(conn, user, number).await?;
            let mut changed = false;
            for key in &incoming {
                let existing = store::get_keys(
                    conn,
                    user,
                    number,
                    Some(&key.room_id),
                    Some(&key.session_id),
                )
                .await?;
                if existing.first().is_none_or(|old| better(key, old)) {
                    store::upsert_key(conn, key).await?;
                    changed = true;
                }
            }
            if changed {
                store::bump_etag(conn, user, number).await?;
            }
            self.etag_and_count(conn, user, number).await
        })
        .await
    }

    /// Uploads go to the current version only (spec: `M_WRONG_ROOM_KEYS_VERSION`).
    async fn check_current(
        &self,
        conn: &AsyncPgConnection,
        user: &str,
        version: i64,
    ) -> Result<()> {
        let current = store::get_version(conn, user, None).await?;
        match current {
            Some(current) if current.version == version => Ok(()),
            Some(current) => Err(Error::matrix(
                actix_web::http::StatusCode::FORBIDDEN,
                "M_WRONG_ROOM_KEYS_VERSION",
                "That is not the current backup version",
            )
            .with("current_version", current.version.to_string())),
            None => Err(no_version()),
        }
    }

    async fn etag_and_count(
        &self,
        conn: &AsyncPgConnection,
        user: &str,
        version: i64,
    ) -> Result<Value> {
        let row = store::get_version(conn, user, Some(version))
            .await?
            .ok_or_else(no_version)?;
        let count = store::count_keys(conn, user, version).await?;
        Ok(json!({ "etag": row.etag.to_string(), "count": count }))
    }

    /// Reads keys: all (`{rooms: ...}`), one room (`{sessions: ...}`) or one session.
    pub async fn get_keys(
        &self,
        user_id: &UserId,
        version: &str,
        selector: Selector<'_>,
    ) -> Result<Value> {
        let number = parse_version(version)?;
        let user = user_id.as_str();
        let conn = self.db.conn().await?;
        store::get_version(&conn, user, Some(number))
            .await?
            .ok_or_else(no_version)?;
        let rows =
            store::get_keys(&conn, user, number, selector.room_id, selector.session_id).await?;
        if selector.session_id.is_some() {
            return rows
                .first()
                .map(key_json)
                .ok_or_else(|| Error::not_found("No key for that session"));
        }
        let mut rooms: Map<String, Value> = Map::new();
        for row in &rows {
            let room = rooms
                .entry(row.room_id.clone())
                .or_insert_with(|| json!({ "sessions": {} }));
            room["sessions"][&row.session_id] = key_json(row);
        }
        Ok(match selector.room_id {
            Some(room_id) => rooms
                .remove(room_id)
                .unwrap_or_else(|| json!({ "sessions": {} })),
            None => json!({ "rooms": rooms }),
        })
    }

    /// Deletes keys (all, one room's, or one session's); returns the new `(etag, count)`.
    pub async fn delete_keys(
        &self,
        user_id: &UserId,
        version: &str,
        selector: Selector<'_>,
    ) -> Result<Value> {
        let number = parse_version(version)?;
        let user = user_id.as_str();
        let mut conn = self.db.conn().await?;
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            store::get_version(conn, user, Some(number))
                .await?
                .ok_or_else(no_version)?;
            if store::delete_keys(conn, user, number, selector.room_id, selector.session_id).await?
                > 0
            {
                store::bump_etag(conn, user, number).await?;
            }
            self.etag_and_count(conn, user, number).await
        })
        .await
    }
}
