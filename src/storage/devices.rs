//! Devices and the access and refresh tokens that belong to them.

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::schema::{access_tokens, devices, refresh_tokens, users};

/// A row of `devices`.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = devices)]
pub struct DeviceRow {
    /// The device ID.
    pub device_id: String,
    /// Human-readable name.
    pub display_name: Option<String>,
    /// Last time a request was made with one of its tokens.
    pub last_seen_ts: Option<i64>,
    /// Last IP address seen.
    pub last_seen_ip: Option<String>,
}

/// What an access token resolves to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenOwner {
    /// The user.
    pub user_id: String,
    /// The device.
    pub device_id: String,
    /// Expiry (only refreshable tokens expire).
    pub expires_ts: Option<i64>,
    /// Whether the user is a server admin.
    pub is_admin: bool,
    /// Whether the user is shadow-banned.
    pub shadow_banned: bool,
}

/// Creates a device, or renames an existing one when `display_name` is given.
pub async fn upsert_device(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    device_id: &str,
    display_name: Option<&str>,
    now: i64,
) -> QueryResult<()> {
    let insert = diesel::insert_into(devices::table).values((
        devices::user_id.eq(user_id),
        devices::device_id.eq(device_id),
        devices::display_name.eq(display_name),
        devices::created_ts.eq(now),
        devices::last_seen_ts.eq(now),
    ));
    match display_name {
        Some(name) => {
            insert
                .on_conflict((devices::user_id, devices::device_id))
                .do_update()
                .set(devices::display_name.eq(name))
                .execute(&mut conn)
                .await
        }
        None => insert.on_conflict_do_nothing().execute(&mut conn).await,
    }
    .map(drop)
}

/// Creates a device that device lists leave out (an admin's session as the user).
pub async fn insert_hidden_device(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    device_id: &str,
    now: i64,
) -> QueryResult<()> {
    diesel::insert_into(devices::table)
        .values((
            devices::user_id.eq(user_id),
            devices::device_id.eq(device_id),
            devices::created_ts.eq(now),
            devices::last_seen_ts.eq(now),
            devices::hidden.eq(true),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Sets when an access token stops working.
pub async fn set_access_token_expiry(
    mut conn: &AsyncPgConnection,
    token_hash: &[u8],
    expires_ts: i64,
) -> QueryResult<()> {
    diesel::update(access_tokens::table.find(token_hash))
        .set(access_tokens::expires_ts.eq(expires_ts))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// All devices of a user but hidden ones, oldest first.
pub async fn get_devices(
    mut conn: &AsyncPgConnection,
    user_id: &str,
) -> QueryResult<Vec<DeviceRow>> {
    devices::table
        .filter(devices::user_id.eq(user_id))
        .filter(devices::hidden.eq(false))
        .order(devices::created_ts)
        .select(DeviceRow::as_select())
        .load(&mut conn)
        .await
}

/// One device.
pub async fn get_device(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    device_id: &str,
) -> QueryResult<Option<DeviceRow>> {
    devices::table
        .find((user_id, device_id))
        .select(DeviceRow::as_select())
        .first(&mut conn)
        .await
        .optional()
}

/// Renames a device; returns false when it does not exist.
pub async fn rename_device(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    device_id: &str,
    display_name: Option<&str>,
) -> QueryResult<bool> {
    let updated = diesel::update(devices::table.find((user_id, device_id)))
        .set(devices::display_name.eq(display_name))
        .execute(&mut conn)
        .await?;
    Ok(updated > 0)
}

/// Deletes devices (and, by cascade, their tokens and keys), the pushers they set up and their
/// to-device inboxes; returns the hashes of the access tokens removed.
pub async fn delete_devices(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    device_ids: &[String],
) -> QueryResult<Vec<Vec<u8>>> {
    let hashes = access_tokens::table
        .filter(access_tokens::user_id.eq(user_id))
        .filter(access_tokens::device_id.eq_any(device_ids))
        .select(access_tokens::token_hash)
        .load(&mut conn)
        .await?;
    diesel::delete(
        devices::table
            .filter(devices::user_id.eq(user_id))
            .filter(devices::device_id.eq_any(device_ids)),
    )
    .execute(&mut conn)
    .await?;
    for device_id in device_ids {
        super::pushers::delete_pushers_of_device(conn, user_id, device_id).await?;
    }
    super::to_device::delete_inboxes(conn, user_id, device_ids).await?;
    Ok(hashes)
}

/// IDs of all devices of a user.
pub async fn get_device_ids(
    mut conn: &AsyncPgConnection,
    user_id: &str,
) -> QueryResult<Vec<String>> {
    devices::table
        .filter(devices::user_id.eq(user_id))
        .select(devices::device_id)
        .load(&mut conn)
        .await
}

/// Records when and from where a device was last used.
pub async fn touch_device(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    device_id: &str,
    now: i64,
    ip: Option<&str>,
) -> QueryResult<()> {
    diesel::update(devices::table.find((user_id, device_id)))
        .set((devices::last_seen_ts.eq(now), devices::last_seen_ip.eq(ip)))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Stores a new access token (by hash).
pub async fn insert_access_token(
    mut conn: &AsyncPgConnection,
    token_hash: &[u8],
    user_id: &str,
    device_id: &str,
    expires_ts: Option<i64>,
    refresh_token_hash: Option<&[u8]>,
    now: i64,
) -> QueryResult<()> {
    diesel::insert_into(access_tokens::table)
        .values((
            access_tokens::token_hash.eq(token_hash),
            access_tokens::user_id.eq(user_id),
            access_tokens::device_id.eq(device_id),
            access_tokens::expires_ts.eq(expires_ts),
            access_tokens::refresh_token_hash.eq(refresh_token_hash),
            access_tokens::created_ts.eq(now),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Stores a new refresh token (by hash).
pub async fn insert_refresh_token(
    mut conn: &AsyncPgConnection,
    token_hash: &[u8],
    user_id: &str,
    device_id: &str,
    now: i64,
) -> QueryResult<()> {
    diesel::insert_into(refresh_tokens::table)
        .values((
            refresh_tokens::token_hash.eq(token_hash),
            refresh_tokens::user_id.eq(user_id),
            refresh_tokens::device_id.eq(device_id),
            refresh_tokens::created_ts.eq(now),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Resolves an access token hash to its owner (deactivated users resolve to nothing).
pub async fn get_token_owner(
    mut conn: &AsyncPgConnection,
    token_hash: &[u8],
) -> QueryResult<Option<TokenOwner>> {
    access_tokens::table
        .inner_join(users::table.on(users::user_id.eq(access_tokens::user_id)))
        .filter(access_tokens::token_hash.eq(token_hash))
        .filter(users::deactivated.eq(false))
        .select((
            access_tokens::user_id,
            access_tokens::device_id,
            access_tokens::expires_ts,
            users::is_admin,
            users::shadow_banned,
        ))
        .first::<(String, String, Option<i64>, bool, bool)>(&mut conn)
        .await
        .optional()
        .map(|row| {
            row.map(
                |(user_id, device_id, expires_ts, is_admin, shadow_banned)| TokenOwner {
                    user_id,
                    device_id,
                    expires_ts,
                    is_admin,
                    shadow_banned,
                },
            )
        })
}

/// Deletes a refresh token, returning its owner and the hashes of the access tokens it had issued.
pub async fn take_refresh_token(
    mut conn: &AsyncPgConnection,
    token_hash: &[u8],
) -> QueryResult<Option<(String, String, Vec<Vec<u8>>)>> {
    // Access tokens first: deleting the refresh token would cascade to them silently.
    let access = diesel::delete(
        access_tokens::table.filter(access_tokens::refresh_token_hash.eq(token_hash)),
    )
    .returning(access_tokens::token_hash)
    .get_results(&mut conn)
    .await?;
    let owner = diesel::delete(refresh_tokens::table.find(token_hash))
        .returning((refresh_tokens::user_id, refresh_tokens::device_id))
        .get_result::<(String, String)>(&mut conn)
        .await
        .optional()?;
    Ok(owner.map(|(user_id, device_id)| (user_id, device_id, access)))
}

/// Deletes every token of one device, returning the access token hashes removed.
pub async fn delete_device_tokens(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    device_id: &str,
) -> QueryResult<Vec<Vec<u8>>> {
    diesel::delete(
        refresh_tokens::table
            .filter(refresh_tokens::user_id.eq(user_id))
            .filter(refresh_tokens::device_id.eq(device_id)),
    )
    .execute(&mut conn)
    .await?;
    diesel::delete(
        access_tokens::table
            .filter(access_tokens::user_id.eq(user_id))
            .filter(access_tokens::device_id.eq(device_id)),
    )
    .returning(access_tokens::token_hash)
    .get_results(&mut conn)
    .await
}

/// Deletes every token of a user except those of `keep_device`; returns access token hashes removed.
pub async fn delete_user_tokens(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    keep_device: Option<&str>,
) -> QueryResult<Vec<Vec<u8>>> {
    let keep = keep_device.unwrap_or("");
    diesel::delete(
        refresh_tokens::table
            .filter(refresh_tokens::user_id.eq(user_id))
            .filter(refresh_tokens::device_id.ne(keep)),
    )
    .execute(&mut conn)
    .await?;
    diesel::delete(
        access_tokens::table
            .filter(access_tokens::user_id.eq(user_id))
            .filter(access_tokens::device_id.ne(keep)),
    )
    .returning(access_tokens::token_hash)
    .get_results(&mut conn)
    .await
}
