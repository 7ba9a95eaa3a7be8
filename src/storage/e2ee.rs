//! Device keys, one-time and fallback keys, cross-signing keys, signatures and the device-list
//! change stream.

use diesel::{
    prelude::*,
    sql_types::{BigInt, Text},
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::Value;

use super::{
    schema::{
        cross_signing_keys, device_keys, device_list_changes, devices, fallback_keys,
        key_signatures, one_time_keys,
    },
    streams,
};

/// The device-list stream.
pub const DEVICE_LISTS: &str = "device_lists";

/// Stores a device's keys; returns whether they changed.
pub async fn upsert_device_keys(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    device_id: &str,
    keys: &Value,
) -> QueryResult<bool> {
    let existing: Option<Value> = device_keys::table
        .find((user_id, device_id))
        .select(device_keys::keys)
        .first(&mut conn)
        .await
        .optional()?;
    if existing.as_ref() == Some(keys) {
        return Ok(false);
    }
    diesel::insert_into(device_keys::table)
        .values((
            device_keys::user_id.eq(user_id),
            device_keys::device_id.eq(device_id),
            device_keys::keys.eq(keys),
        ))
        .on_conflict((device_keys::user_id, device_keys::device_id))
        .do_update()
        .set(device_keys::keys.eq(keys))
        .execute(&mut conn)
        .await?;
    Ok(true)
}

/// One device's stored keys.
pub async fn get_device_key(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    device_id: &str,
) -> QueryResult<Option<Value>> {
    device_keys::table
        .find((user_id, device_id))
        .select(device_keys::keys)
        .first(&mut conn)
        .await
        .optional()
}

/// Device keys of the given users: `(user, device, keys, display name)`.
pub async fn get_device_keys(
    mut conn: &AsyncPgConnection,
    user_ids: &[String],
) -> QueryResult<Vec<(String, String, Value, Option<String>)>> {
    device_keys::table
        .inner_join(
            devices::table.on(devices::user_id
                .eq(device_keys::user_id)
                .and(devices::device_id.eq(device_keys::device_id))),
        )
        .filter(device_keys::user_id.eq_any(user_ids))
        .select((
            device_keys::user_id,
            device_keys::device_id,
            device_keys::keys,
            devices::display_name,
        ))
        .load(&mut conn)
        .await
}

/// Those of the given one-time key IDs a device already has, with their keys.
pub async fn get_one_time_keys(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    device_id: &str,
    key_ids: &[String],
) -> QueryResult<Vec<(String, Value)>> {
    one_time_keys::table
        .filter(one_time_keys::user_id.eq(user_id))
        .filter(one_time_keys::device_id.eq(device_id))
        .filter(one_time_keys::key_id.eq_any(key_ids))
        .select((one_time_keys::key_id, one_time_keys::key))
        .load(&mut conn)
        .await
}

/// Adds one-time keys (`(algorithm, key_id, key)`); keys already stored are left alone.
pub async fn insert_one_time_keys(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    device_id: &str,
    keys: &[(String, String, Value)],
) -> QueryResult<()> {
    let rows: Vec<_> = keys
        .iter()
        .map(|(algorithm, key_id, key)| {
            (
                one_time_keys::user_id.eq(user_id),
                one_time_keys::device_id.eq(device_id),
                one_time_keys::algorithm.eq(algorithm),
                one_time_keys::key_id.eq(key_id),
                one_time_keys::key.eq(key),
            )
        })
        .collect();
    diesel::insert_into(one_time_keys::table)
        .values(rows)
        .on_conflict_do_nothing()
        .execute(&mut conn)
        .await
        .map(drop)
}

/// How many one-time keys a device has left, per algorithm.
pub async fn count_one_time_keys(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    device_id: &str,
) -> QueryResult<Vec<(String, i64)>> {
    one_time_keys::table
        .filter(one_time_keys::user_id.eq(user_id))
        .filter(one_time_keys::device_id.eq(device_id))
        .group_by(one_time_keys::algorithm)
        .select((one_time_keys::algorithm, diesel::dsl::count_star()))
        .load(&mut conn)
        .await
}

#[derive(QueryableByName)]
struct ClaimedKey {
    #[diesel(sql_type = Text)]
    key_id: String,
    #[diesel(sql_type = diesel::sql_types::Jsonb)]
    key: Value,
}

/// Takes one one-time key of a device, atomically: concurrent claims skip each other's row, so
/// no key is ever handed out twice.
pub async fn claim_one_time_key(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    device_id: &str,
    algorithm: &str,
) -> QueryResult<Option<(String, Value)>> {
    let claimed: Option<ClaimedKey> = crate::storage::cached_sql(
        "DELETE FROM one_time_keys WHERE ctid = (
             SELECT ctid FROM one_time_keys
             WHERE user_id = $1 AND device_id = $2 AND algorithm = $3
             LIMIT 1 FOR UPDATE SKIP LOCKED)
         RETURNING key_id, key",
    )
    .bind::<Text, _>(user_id)
    .bind::<Text, _>(device_id)
    .bind::<Text, _>(algorithm)
    .get_result(&mut conn)
    .await
    .optional()?;
    Ok(claimed.map(|c| (c.key_id, c.key)))
}

/// Stores a device's fallback key for an algorithm (a new key starts unused).
pub async fn upsert_fallback_key(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    device_id: &str,
    algorithm: &str,
    key_id: &str,
    key: &Value,
) -> QueryResult<()> {
    let existing: Option<String> = fallback_keys::table
        .find((user_id, device_id, algorithm))
        .select(fallback_keys::key_id)
        .first(&mut conn)
        .await
        .optional()?;
    if existing.as_deref() == Some(key_id) {
        return Ok(());
    }
    diesel::insert_into(fallback_keys::table)
        .values((
            fallback_keys::user_id.eq(user_id),
            fallback_keys::device_id.eq(device_id),
            fallback_keys::algorithm.eq(algorithm),
            fallback_keys::key_id.eq(key_id),
            fallback_keys::key.eq(key),
            fallback_keys::used.eq(false),
        ))
        .on_conflict((
            fallback_keys::user_id,
            fallback_keys::device_id,
            fallback_keys::algorithm,
        ))
        .do_update()
        .set((
            fallback_keys::key_id.eq(key_id),
            fallback_keys::key.eq(key),
            fallback_keys::used.eq(false),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Hands out a device's fallback key (it stays, marked used).
pub async fn claim_fallback_key(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    device_id: &str,
    algorithm: &str,
) -> QueryResult<Option<(String, Value)>> {
    diesel::update(fallback_keys::table.find((user_id, device_id, algorithm)))
        .set(fallback_keys::used.eq(true))
        .returning((fallback_keys::key_id, fallback_keys::key))
        .get_result(&mut conn)
        .await
        .optional()
}

/// Algorithms of a device's fallback keys that nobody has claimed yet.
pub async fn get_unused_fallback_algorithms(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    device_id: &str,
) -> QueryResult<Vec<String>> {
    fallback_keys::table
        .filter(fallback_keys::user_id.eq(user_id))
        .filter(fallback_keys::device_id.eq(device_id))
        .filter(fallback_keys::used.eq(false))
        .select(fallback_keys::algorithm)
        .load(&mut conn)
        .await
}

/// Cross-signing keys of the given users: `(user, key type, key)`.
pub async fn get_cross_signing_keys(
    mut conn: &AsyncPgConnection,
    user_ids: &[String],
) -> QueryResult<Vec<(String, String, Value)>> {
    cross_signing_keys::table
        .filter(cross_signing_keys::user_id.eq_any(user_ids))
        .select((
            cross_signing_keys::user_id,
            cross_signing_keys::key_type,
            cross_signing_keys::key,
        ))
        .load(&mut conn)
        .await
}

/// Stores a cross-signing key.
pub async fn set_cross_signing_key(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    key_type: &str,
    key: &Value,
) -> QueryResult<()> {
    diesel::insert_into(cross_signing_keys::table)
        .values((
            cross_signing_keys::user_id.eq(user_id),
            cross_signing_keys::key_type.eq(key_type),
            cross_signing_keys::key.eq(key),
        ))
        .on_conflict((cross_signing_keys::user_id, cross_signing_keys::key_type))
        .do_update()
        .set(cross_signing_keys::key.eq(key))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// A signature over a device or cross-signing key.
#[derive(Debug, Clone, Queryable, Insertable)]
#[diesel(table_name = key_signatures)]
pub struct SignatureRow {
    /// Owner of the signed key.
    pub target_user_id: String,
    /// Device ID or cross-signing public key signed.
    pub target_key_id: String,
    /// Who signed.
    pub signer_user_id: String,
    /// With which key (`ed25519:...`).
    pub signer_key_id: String,
    /// The signature.
    pub signature: String,
}

/// Stores signatures.
pub async fn add_signatures(
    mut conn: &AsyncPgConnection,
    rows: &[SignatureRow],
) -> QueryResult<()> {
    if rows.is_empty() {
        return Ok(());
    }
    diesel::insert_into(key_signatures::table)
        .values(rows)
        .on_conflict_do_nothing()
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Signatures over the keys of the given users.
pub async fn get_signatures(
    mut conn: &AsyncPgConnection,
    user_ids: &[String],
) -> QueryResult<Vec<SignatureRow>> {
    key_signatures::table
        .filter(key_signatures::target_user_id.eq_any(user_ids))
        .load(&mut conn)
        .await
}

/// Records that a user's devices or keys changed (inside the change's transaction).
pub async fn record_device_list_change(
    mut conn: &AsyncPgConnection,
    user_id: &str,
) -> QueryResult<i64> {
    let position = streams::next_position(conn, DEVICE_LISTS).await?;
    diesel::insert_into(device_list_changes::table)
        .values((
            device_list_changes::stream_ordering.eq(position),
            device_list_changes::user_id.eq(user_id),
        ))
        .execute(&mut conn)
        .await?;
    Ok(position)
}

/// The position of a user's latest device-list change, if any.
pub async fn latest_device_list_change(
    mut conn: &AsyncPgConnection,
    user_id: &str,
) -> QueryResult<Option<i64>> {
    device_list_changes::table
        .filter(device_list_changes::user_id.eq(user_id))
        .select(diesel::dsl::max(device_list_changes::stream_ordering))
        .first(&mut conn)
        .await
}

#[derive(QueryableByName)]
struct UserRow {
    #[diesel(sql_type = Text)]
    user_id: String,
}

/// Users whose devices changed in `(after, up_to]` who are `user_id` or share a joined room
/// with them.
pub async fn get_device_list_changes_for(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    after: i64,
    up_to: i64,
) -> QueryResult<Vec<String>> {
    let rows: Vec<UserRow> = diesel::sql_query(format!(
        "SELECT DISTINCT c.user_id FROM device_list_changes c
         WHERE c.stream_ordering > $2 AND c.stream_ordering <= $3
           AND (c.user_id = $1 OR {})",
        super::memberships::shares_joined_room("c.user_id")
    ))
    .bind::<Text, _>(user_id)
    .bind::<BigInt, _>(after)
    .bind::<BigInt, _>(up_to)
    .load(&mut conn)
    .await?;
    Ok(rows.into_iter().map(|r| r.user_id).collect())
}

/// Users whose membership changed in `(after, up_to]` (event stream) in rooms `user_id` was
/// joined to when it changed (a user who left, was banned or rejected an invite learns nothing
/// of the room's later members), together with whether they now share a joined room with
/// `user_id`.
pub async fn get_membership_changes_for(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    after: i64,
    up_to: i64,
) -> QueryResult<Vec<(String, bool)>> {
    #[derive(QueryableByName)]
    struct Changed {
        #[diesel(sql_type = Text)]
        user_id: String,
        #[diesel(sql_type = diesel::sql_types::Bool)]
        shares: bool,
    }
    let rows: Vec<Changed> = diesel::sql_query(format!(
        "WITH changed AS (
             SELECT DISTINCT e.state_key AS user_id FROM events e
             WHERE e.event_type = 'm.room.member' AND e.stream_ordering > $2
               AND e.stream_ordering <= $3 AND {served}
               AND e.room_id IN (SELECT room_id FROM room_memberships WHERE user_id = $1)
               AND (SELECT mine.pdu->'content'->>'membership' FROM events mine
                    WHERE mine.room_id = e.room_id AND mine.event_type = 'm.room.member'
                      AND mine.state_key = $1 AND mine.stream_ordering <= e.stream_ordering
                      AND {served}
                    ORDER BY mine.stream_ordering DESC LIMIT 1) = 'join'
             UNION
             -- Everyone in a room whose membership *I* changed.
             SELECT DISTINCT m.user_id FROM events e
             JOIN room_memberships m ON m.room_id = e.room_id
             WHERE e.event_type = 'm.room.member' AND e.state_key = $1
               AND e.stream_ordering > $2 AND e.stream_ordering <= $3 AND {served}
         )
         SELECT c.user_id, {shares} AS shares
         FROM changed c WHERE c.user_id <> $1",
        served = super::rooms::SERVED_TO_CLIENTS,
        shares = super::memberships::shares_joined_room("c.user_id")
    ))
    .bind::<Text, _>(user_id)
    .bind::<BigInt, _>(after)
    .bind::<BigInt, _>(up_to)
    .load(&mut conn)
    .await?;
    Ok(rows.into_iter().map(|r| (r.user_id, r.shares)).collect())
}
