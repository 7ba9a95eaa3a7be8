//! Other servers' users' device lists and cross-signing keys, as cached.

use diesel::{
    prelude::*,
    sql_types::{Array, Text},
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::Value;

use super::schema::{remote_device_lists, remote_devices};

/// A cached remote user's device list header.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = remote_device_lists)]
pub struct RemoteDeviceList {
    /// The remote user.
    pub user_id: String,
    /// The origin's device-list stream position the cache reflects.
    pub stream_id: i64,
    /// Whether an update that does not follow on from `stream_id` arrived.
    pub stale: bool,
    /// The user's master key.
    pub master_key: Option<Value>,
    /// The user's self-signing key.
    pub self_signing_key: Option<Value>,
}

/// One cached remote device.
#[derive(Debug, Clone, Queryable)]
pub struct RemoteDevice {
    /// The device's owner.
    pub user_id: String,
    /// The device ID.
    pub device_id: String,
    /// Its signed identity keys.
    pub keys: Option<Value>,
    /// Its display name.
    pub display_name: Option<String>,
}

/// The cached lists of the given users.
pub async fn get_lists(
    mut conn: &AsyncPgConnection,
    user_ids: &[String],
) -> QueryResult<Vec<RemoteDeviceList>> {
    remote_device_lists::table
        .filter(remote_device_lists::user_id.eq_any(user_ids))
        .select(RemoteDeviceList::as_select())
        .load(&mut conn)
        .await
}

/// One user's cached list, locked for update until the transaction ends.
pub async fn lock_list(
    mut conn: &AsyncPgConnection,
    user_id: &str,
) -> QueryResult<Option<RemoteDeviceList>> {
    remote_device_lists::table
        .find(user_id)
        .select(RemoteDeviceList::as_select())
        .for_update()
        .first(&mut conn)
        .await
        .optional()
}

/// The cached devices of the given users.
pub async fn get_devices(
    mut conn: &AsyncPgConnection,
    user_ids: &[String],
) -> QueryResult<Vec<RemoteDevice>> {
    remote_devices::table
        .filter(remote_devices::user_id.eq_any(user_ids))
        .select((
            remote_devices::user_id,
            remote_devices::device_id,
            remote_devices::keys,
            remote_devices::display_name,
        ))
        .load(&mut conn)
        .await
}

/// Replaces a user's whole cached list (a resync), which is then fresh. Call in a transaction.
pub async fn replace_list(
    mut conn: &AsyncPgConnection,
    list: &RemoteDeviceList,
    devices: &[RemoteDevice],
    now: i64,
) -> QueryResult<()> {
    diesel::insert_into(remote_device_lists::table)
        .values((
            remote_device_lists::user_id.eq(&list.user_id),
            remote_device_lists::stream_id.eq(list.stream_id),
            remote_device_lists::stale.eq(false),
            remote_device_lists::master_key.eq(&list.master_key),
            remote_device_lists::self_signing_key.eq(&list.self_signing_key),
            remote_device_lists::updated_ts.eq(now),
        ))
        .on_conflict(remote_device_lists::user_id)
        .do_update()
        .set((
            remote_device_lists::stream_id.eq(list.stream_id),
            remote_device_lists::stale.eq(false),
            remote_device_lists::master_key.eq(&list.master_key),
            remote_device_lists::self_signing_key.eq(&list.self_signing_key),
            remote_device_lists::updated_ts.eq(now),
        ))
        .execute(&mut conn)
        .await?;
    diesel::delete(remote_devices::table.filter(remote_devices::user_id.eq(&list.user_id)))
        .execute(&mut conn)
        .await?;
    let rows: Vec<_> = devices
        .iter()
        .map(|d| {
            (
                remote_devices::user_id.eq(&list.user_id),
                remote_devices::device_id.eq(&d.device_id),
                remote_devices::keys.eq(&d.keys),
                remote_devices::display_name.eq(&d.display_name),
            )
        })
        .collect();
    if !rows.is_empty() {
        diesel::insert_into(remote_devices::table)
            .values(rows)
            .execute(&mut conn)
            .await?;
    }
    Ok(())
}

/// Stores one device of a cached list (an incremental update).
pub async fn upsert_device(mut conn: &AsyncPgConnection, device: &RemoteDevice) -> QueryResult<()> {
    diesel::insert_into(remote_devices::table)
        .values((
            remote_devices::user_id.eq(&device.user_id),
            remote_devices::device_id.eq(&device.device_id),
            remote_devices::keys.eq(&device.keys),
            remote_devices::display_name.eq(&device.display_name),
        ))
        .on_conflict((remote_devices::user_id, remote_devices::device_id))
        .do_update()
        .set((
            remote_devices::keys.eq(&device.keys),
            remote_devices::display_name.eq(&device.display_name),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Removes one device of a cached list.
pub async fn delete_device(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    device_id: &str,
) -> QueryResult<()> {
    diesel::delete(remote_devices::table.find((user_id, device_id)))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Moves a cached list to `stream_id` (after applying the update that has it).
pub async fn set_stream_id(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    stream_id: i64,
    now: i64,
) -> QueryResult<()> {
    diesel::update(remote_device_lists::table.find(user_id))
        .set((
            remote_device_lists::stream_id.eq(stream_id),
            remote_device_lists::updated_ts.eq(now),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Marks a cached list as needing a resync.
pub async fn mark_stale(mut conn: &AsyncPgConnection, user_id: &str, now: i64) -> QueryResult<()> {
    diesel::update(remote_device_lists::table.find(user_id))
        .set((
            remote_device_lists::stale.eq(true),
            remote_device_lists::updated_ts.eq(now),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Replaces a cached user's master and/or self-signing key (`None` leaves it as it is).
pub async fn set_signing_keys(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    master_key: Option<&Value>,
    self_signing_key: Option<&Value>,
    now: i64,
) -> QueryResult<()> {
    let target = remote_device_lists::table.find(user_id);
    if let Some(key) = master_key {
        diesel::update(target)
            .set((
                remote_device_lists::master_key.eq(key),
                remote_device_lists::updated_ts.eq(now),
            ))
            .execute(&mut conn)
            .await?;
    }
    if let Some(key) = self_signing_key {
        diesel::update(target)
            .set((
                remote_device_lists::self_signing_key.eq(key),
                remote_device_lists::updated_ts.eq(now),
            ))
            .execute(&mut conn)
            .await?;
    }
    Ok(())
}

#[derive(QueryableByName)]
struct UserRow {
    #[diesel(sql_type = Text)]
    user_id: String,
}

/// Those of the given (remote) users who share a joined room with a local user: the users
/// whose servers send us their device-list updates.
pub async fn get_users_sharing_rooms(
    mut conn: &AsyncPgConnection,
    user_ids: &[String],
) -> QueryResult<Vec<String>> {
    let rows: Vec<UserRow> = diesel::sql_query(
        "SELECT DISTINCT theirs.user_id FROM room_memberships theirs
         JOIN room_memberships mine ON mine.room_id = theirs.room_id
         WHERE theirs.user_id = ANY($1) AND theirs.membership = 'join'
           AND mine.membership = 'join'
           AND mine.user_id IN (SELECT user_id FROM users)",
    )
    .bind::<Array<Text>, _>(user_ids)
    .load(&mut conn)
    .await?;
    Ok(rows.into_iter().map(|r| r.user_id).collect())
}
