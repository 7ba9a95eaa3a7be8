//! Account data (global and per room) and stored filters.

use diesel::{
    prelude::*,
    sql_types::{BigInt, Jsonb, Text},
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::Value;

use super::schema::{account_data, filters};

/// Room ID used for global account data.
pub const GLOBAL: &str = "";

/// One account-data entry; `room_id` is [`GLOBAL`] for global data.
pub async fn get_account_data(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    room_id: &str,
    data_type: &str,
) -> QueryResult<Option<Value>> {
    account_data::table
        .find((user_id, room_id, data_type))
        .select(account_data::content)
        .first(&mut conn)
        .await
        .optional()
}

/// Sets an account-data entry at a new stream position, taken and written in one statement
/// (one round trip). Run it inside a transaction: the position stays held until commit, so
/// positions become visible in order.
pub async fn set_account_data(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    room_id: &str,
    data_type: &str,
    content: &Value,
) -> QueryResult<i64> {
    let stored: StoredAt = super::cached_sql(
        "INSERT INTO account_data (user_id, room_id, data_type, content, stream_ordering) \
         VALUES ($1, $2, $3, $4, (myelin_take_positions($5, 1))[1]) \
         ON CONFLICT (user_id, room_id, data_type) DO UPDATE \
         SET content = excluded.content, stream_ordering = excluded.stream_ordering \
         RETURNING stream_ordering",
    )
    .bind::<Text, _>(user_id)
    .bind::<Text, _>(room_id)
    .bind::<Text, _>(data_type)
    .bind::<Jsonb, _>(content)
    .bind::<Text, _>(super::streams::ACCOUNT_DATA)
    .get_result(&mut conn)
    .await?;
    Ok(stored.stream_ordering)
}

#[derive(QueryableByName)]
struct StoredAt {
    #[diesel(sql_type = BigInt)]
    stream_ordering: i64,
}

/// Stores a filter and returns its ID.
pub async fn insert_filter(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    content: &Value,
) -> QueryResult<i64> {
    diesel::insert_into(filters::table)
        .values((filters::user_id.eq(user_id), filters::content.eq(content)))
        .returning(filters::filter_id)
        .get_result(&mut conn)
        .await
}

/// Loads a stored filter.
pub async fn get_filter(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    filter_id: i64,
) -> QueryResult<Option<Value>> {
    filters::table
        .find((user_id, filter_id))
        .select(filters::content)
        .first(&mut conn)
        .await
        .optional()
}

/// Account data of a user changed in `(after, up_to]`: `(room_id, type, content)`.
pub async fn get_account_data_changed(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    after: i64,
    up_to: i64,
) -> QueryResult<Vec<(String, String, Value)>> {
    account_data::table
        .filter(account_data::user_id.eq(user_id))
        .filter(account_data::stream_ordering.gt(after))
        .filter(account_data::stream_ordering.le(up_to))
        .order(account_data::stream_ordering)
        .select((
            account_data::room_id,
            account_data::data_type,
            account_data::content,
        ))
        .load(&mut conn)
        .await
}

/// Serialises read-modify-write cycles on one entry until the transaction ends (an advisory
/// lock, so it also holds while the entry does not exist yet).
pub async fn lock_account_data_row(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    room_id: &str,
    data_type: &str,
) -> QueryResult<()> {
    crate::storage::cached_sql("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind::<diesel::sql_types::Text, _>(format!("{user_id} {room_id} {data_type}"))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// One global account-data type for several users: `(user_id, content)` for those who have it.
pub async fn get_global_account_data_of_users(
    mut conn: &AsyncPgConnection,
    user_ids: &[&str],
    data_type: &str,
) -> QueryResult<Vec<(String, Value)>> {
    account_data::table
        .filter(account_data::user_id.eq_any(user_ids))
        .filter(account_data::room_id.eq(GLOBAL))
        .filter(account_data::data_type.eq(data_type))
        .select((account_data::user_id, account_data::content))
        .load(&mut conn)
        .await
}

/// The positions of one global account-data type for several users (those who have it).
pub async fn get_global_account_data_positions(
    mut conn: &AsyncPgConnection,
    user_ids: &[&str],
    data_type: &str,
) -> QueryResult<Vec<(String, i64)>> {
    account_data::table
        .filter(account_data::user_id.eq_any(user_ids))
        .filter(account_data::room_id.eq(GLOBAL))
        .filter(account_data::data_type.eq(data_type))
        .select((account_data::user_id, account_data::stream_ordering))
        .load(&mut conn)
        .await
}
