//! Read receipts.

use diesel::{prelude::*, upsert::excluded};
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

/// Stores a receipt unless the user's existing one points at a later event; returns whether
/// it moved. Run inside a transaction: the position bump serialises commits.
pub async fn set_receipt(
    mut conn: &AsyncPgConnection,
    receipt: &NewReceipt<'_>,
) -> QueryResult<bool> {
    let current: Option<i64> = receipts::table
        .find((
            receipt.room_id,
            receipt.user_id,
            receipt.receipt_type,
            receipt.thread_id,
        ))
        .select(receipts::event_stream)
        .for_update()
        .first(&mut conn)
        .await
        .optional()?;
    if current.is_some_and(|existing| existing >= receipt.event_stream) {
        return Ok(false);
    }
    let position = super::streams::next_position(conn, super::streams::RECEIPTS).await?;
    let upsert = diesel::insert_into(receipts::table)
        .values((
            receipts::room_id.eq(receipt.room_id),
            receipts::user_id.eq(receipt.user_id),
            receipts::receipt_type.eq(receipt.receipt_type),
            receipts::thread_id.eq(receipt.thread_id),
            receipts::event_id.eq(receipt.event_id),
            receipts::event_stream.eq(receipt.event_stream),
            receipts::ts.eq(receipt.ts),
            receipts::stream_ordering.eq(position),
        ))
        .on_conflict((
            receipts::room_id,
            receipts::user_id,
            receipts::receipt_type,
            receipts::thread_id,
        ))
        .do_update()
        .set((
            receipts::event_id.eq(receipt.event_id),
            receipts::event_stream.eq(receipt.event_stream),
            receipts::ts.eq(receipt.ts),
            receipts::stream_ordering.eq(position),
        ));
    // Two first receipts race past the lock above (there is no row to lock yet): the later
    // commit must not move the receipt back.
    let stored = diesel::query_dsl::methods::FilterDsl::filter(
        upsert,
        receipts::event_stream.lt(excluded(receipts::event_stream)),
    )
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
