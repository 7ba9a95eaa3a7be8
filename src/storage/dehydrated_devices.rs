//! Dehydrated devices (MSC3814): which of a user's devices is the dehydrated one, and its
//! opaque data.

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::Value;

use super::schema::dehydrated_devices;

/// A user's dehydrated device: its ID and data.
pub async fn get(
    mut conn: &AsyncPgConnection,
    user_id: &str,
) -> QueryResult<Option<(String, Value)>> {
    dehydrated_devices::table
        .find(user_id)
        .select((
            dehydrated_devices::device_id,
            dehydrated_devices::device_data,
        ))
        .first(&mut conn)
        .await
        .optional()
}

/// Makes `device_id` the user's dehydrated device (replacing any other).
pub async fn set(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    device_id: &str,
    device_data: &Value,
    now: i64,
) -> QueryResult<()> {
    diesel::insert_into(dehydrated_devices::table)
        .values((
            dehydrated_devices::user_id.eq(user_id),
            dehydrated_devices::device_id.eq(device_id),
            dehydrated_devices::device_data.eq(device_data),
            dehydrated_devices::created_ts.eq(now),
        ))
        .on_conflict(dehydrated_devices::user_id)
        .do_update()
        .set((
            dehydrated_devices::device_id.eq(device_id),
            dehydrated_devices::device_data.eq(device_data),
            dehydrated_devices::created_ts.eq(now),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Forgets the user's dehydrated device; returns its ID.
pub async fn delete(mut conn: &AsyncPgConnection, user_id: &str) -> QueryResult<Option<String>> {
    diesel::delete(dehydrated_devices::table.find(user_id))
        .returning(dehydrated_devices::device_id)
        .get_result(&mut conn)
        .await
        .optional()
}
