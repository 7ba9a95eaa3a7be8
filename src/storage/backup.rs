//! Server-side key backup: versions and the encrypted room keys stored under them.

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::Value;

use super::schema::{backup_keys, backup_versions};

/// A backup version.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = backup_versions)]
pub struct VersionRow {
    /// Version number.
    pub version: i64,
    /// Backup algorithm.
    pub algorithm: String,
    /// Algorithm-specific data (public key, signatures).
    pub auth_data: Value,
    /// Changes with every key change.
    pub etag: i64,
}

/// A backed-up room key.
#[derive(Debug, Clone, Queryable, Selectable, Insertable)]
#[diesel(table_name = backup_keys)]
pub struct KeyRow {
    /// Owner.
    pub user_id: String,
    /// Backup version.
    pub version: i64,
    /// Room.
    pub room_id: String,
    /// Megolm session.
    pub session_id: String,
    /// First message the key can decrypt.
    pub first_message_index: i64,
    /// Times the key was forwarded.
    pub forwarded_count: i64,
    /// Whether the key comes from a verified device.
    pub is_verified: bool,
    /// The encrypted key.
    pub session_data: Value,
}

/// Creates a new version (numbers are never reused, even after a delete).
pub async fn create_version(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    algorithm: &str,
    auth_data: &Value,
) -> QueryResult<i64> {
    let last: Option<i64> = backup_versions::table
        .filter(backup_versions::user_id.eq(user_id))
        .select(diesel::dsl::max(backup_versions::version))
        .first(&mut conn)
        .await?;
    let version = last.unwrap_or(0) + 1;
    diesel::insert_into(backup_versions::table)
        .values((
            backup_versions::user_id.eq(user_id),
            backup_versions::version.eq(version),
            backup_versions::algorithm.eq(algorithm),
            backup_versions::auth_data.eq(auth_data),
        ))
        .execute(&mut conn)
        .await?;
    Ok(version)
}

/// A live version, or the latest live one when `version` is `None`.
pub async fn get_version(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    version: Option<i64>,
) -> QueryResult<Option<VersionRow>> {
    let mut query = backup_versions::table
        .filter(backup_versions::user_id.eq(user_id))
        .filter(backup_versions::deleted.eq(false))
        .order(backup_versions::version.desc())
        .select(VersionRow::as_select())
        .into_boxed();
    if let Some(version) = version {
        query = query.filter(backup_versions::version.eq(version));
    }
    query.first(&mut conn).await.optional()
}

/// Replaces a live version's auth data; returns whether it existed.
pub async fn update_version(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    version: i64,
    auth_data: &Value,
) -> QueryResult<bool> {
    diesel::update(
        backup_versions::table
            .find((user_id, version))
            .filter(backup_versions::deleted.eq(false)),
    )
    .set(backup_versions::auth_data.eq(auth_data))
    .execute(&mut conn)
    .await
    .map(|n| n > 0)
}

/// Deletes a version and its keys; returns whether it existed.
pub async fn delete_version(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    version: i64,
) -> QueryResult<bool> {
    diesel::delete(
        backup_keys::table
            .filter(backup_keys::user_id.eq(user_id))
            .filter(backup_keys::version.eq(version)),
    )
    .execute(&mut conn)
    .await?;
    diesel::update(
        backup_versions::table
            .find((user_id, version))
            .filter(backup_versions::deleted.eq(false)),
    )
    .set(backup_versions::deleted.eq(true))
    .execute(&mut conn)
    .await
    .map(|n| n > 0)
}

/// Moves a version's etag on.
pub async fn bump_etag(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    version: i64,
) -> QueryResult<()> {
    diesel::update(backup_versions::table.find((user_id, version)))
        .set(backup_versions::etag.eq(backup_versions::etag + 1))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// How many keys a version holds.
pub async fn count_keys(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    version: i64,
) -> QueryResult<i64> {
    backup_keys::table
        .filter(backup_keys::user_id.eq(user_id))
        .filter(backup_keys::version.eq(version))
        .count()
        .get_result(&mut conn)
        .await
}

/// Keys of a version, optionally of one room or one session, locked for update.
pub async fn get_keys(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    version: i64,
    room_id: Option<&str>,
    session_id: Option<&str>,
) -> QueryResult<Vec<KeyRow>> {
    let mut query = backup_keys::table
        .filter(backup_keys::user_id.eq(user_id))
        .filter(backup_keys::version.eq(version))
        .select(KeyRow::as_select())
        .into_boxed();
    if let Some(room_id) = room_id {
        query = query.filter(backup_keys::room_id.eq(room_id));
    }
    if let Some(session_id) = session_id {
        query = query.filter(backup_keys::session_id.eq(session_id));
    }
    query.load(&mut conn).await
}

/// Stores a key (replacing the stored one of the same session).
pub async fn upsert_key(mut conn: &AsyncPgConnection, key: &KeyRow) -> QueryResult<()> {
    diesel::insert_into(backup_keys::table)
        .values(key)
        .on_conflict((
            backup_keys::user_id,
            backup_keys::version,
            backup_keys::room_id,
            backup_keys::session_id,
        ))
        .do_update()
        .set((
            backup_keys::first_message_index.eq(key.first_message_index),
            backup_keys::forwarded_count.eq(key.forwarded_count),
            backup_keys::is_verified.eq(key.is_verified),
            backup_keys::session_data.eq(&key.session_data),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Deletes keys of a version, optionally of one room or one session; returns how many.
pub async fn delete_keys(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    version: i64,
    room_id: Option<&str>,
    session_id: Option<&str>,
) -> QueryResult<usize> {
    let mut query = diesel::delete(backup_keys::table)
        .filter(backup_keys::user_id.eq(user_id))
        .filter(backup_keys::version.eq(version))
        .into_boxed();
    if let Some(room_id) = room_id {
        query = query.filter(backup_keys::room_id.eq(room_id));
    }
    if let Some(session_id) = session_id {
        query = query.filter(backup_keys::session_id.eq(session_id));
    }
    query.execute(&mut conn).await
}
