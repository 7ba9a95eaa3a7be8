//! Read receipts.

use diesel::{
    prelude::*,
    sql_types::{BigInt, Text},
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::schema::receipts;

/// A stored receipt.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = receipts)]
pub struct ReceiptRow {
    /// Room.
    pub room_id: String,
    /// Reader.
    pub user_id: String,
    /// `m.read` or `m.read.private`.
    pub receipt_type: String,
    /// Thread (`""` for an unthreaded receipt).
    pub thread_id: String,
    /// The event read up to.
    pub event_id: String,
    /// When.
    pub ts: i64,
}

/// A receipt to store.
pub struct NewReceipt<'a> {
    /// Room.
    pub room_id: &'a str,
    /// Reader.
    pub user_id: &'a str,
    /// Receipt type.
    pub receipt_type: &'a str,
    /// Thread, `""` when unthreaded.
    pub thread_id: &'a str,
    /// Event.
    pub event_id: &'a str,
    /// The event's stream position.
    pub event_stream: i64,
    /// When.
    pub ts: i64,
}

/// Stores a receipt unless the user's existing one points at the same or a later event;
/// returns whether it moved. One statement: the receipt's stream position is taken only when
/// it moves. Run inside a transaction: the position stays held until commit.
pub async fn set_receipt(
    mut conn: &AsyncPgConnection,
    receipt: &NewReceipt<'_>,
) -> QueryResult<bool> {
    // Two receipts racing for one key: the later commit re-checks the conflict's condition
    // against the row the earlier one wrote, so a receipt never moves back.
    let stored = super::cached_sql(
        "INSERT INTO receipts (room_id, user_id, receipt_type, thread_id, event_id, event_stream, \
                               ts, stream_ordering) \
         SELECT $1, $2, $3, $4, $5, $6, $7, (myelin_take_positions($8, 1))[1] \
          WHERE NOT EXISTS (SELECT 1 FROM receipts \
                             WHERE room_id = $1 AND user_id = $2 AND receipt_type = $3 \
                               AND thread_id = $4 AND event_stream >= $6) \
         ON CONFLICT (room_id, user_id, receipt_type, thread_id) DO UPDATE \
         SET event_id = excluded.event_id, event_stream = excluded.event_stream, \
             ts = excluded.ts, stream_ordering = excluded.stream_ordering \
         WHERE receipts.event_stream < excluded.event_stream",
    )
    .bind::<Text, _>(receipt.room_id)
    .bind::<Text, _>(receipt.user_id)
    .bind::<Text, _>(receipt.receipt_type)
    .bind::<Text, _>(receipt.thread_id)
    .bind::<Text, _>(receipt.event_id)
    .bind::<BigInt, _>(receipt.event_stream)
    .bind::<BigInt, _>(receipt.ts)
    .bind::<Text, _>(super::streams::RECEIPTS)
    .execute(&mut conn)
    .await?;
    Ok(stored > 0)
}

/// Rooms where `user_id`'s own receipts changed in `(after, up_to]`.
pub async fn get_user_receipt_rooms_changed(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    after: i64,
    up_to: i64,
) -> QueryResult<Vec<String>> {
    receipts::table
        .filter(receipts::stream_ordering.gt(after))
        .filter(receipts::stream_ordering.le(up_to))
        .filter(receipts::user_id.eq(user_id))
        .select(receipts::room_id)
        .distinct()
        .load(&mut conn)
        .await
}

/// Public receipts (`m.read`) of any room that changed in `(after, up_to]`.
pub async fn get_public_receipts_changed(
    mut conn: &AsyncPgConnection,
    after: i64,
    up_to: i64,
) -> QueryResult<Vec<ReceiptRow>> {
    receipts::table
        .filter(receipts::receipt_type.eq("m.read"))
        .filter(receipts::stream_ordering.gt(after))
        .filter(receipts::stream_ordering.le(up_to))
        .select(ReceiptRow::as_select())
        .load(&mut conn)
        .await
}

/// Receipts in the given rooms that changed in `(after, up_to]`.
pub async fn get_receipts_changed(
    mut conn: &AsyncPgConnection,
    room_ids: &[String],
    after: i64,
    up_to: i64,
) -> QueryResult<Vec<ReceiptRow>> {
    receipts::table
        .filter(receipts::room_id.eq_any(room_ids))
        .filter(receipts::stream_ordering.gt(after))
        .filter(receipts::stream_ordering.le(up_to))
        .select(ReceiptRow::as_select())
        .load(&mut conn)
        .await
}
