//! Stream positions: one counter row per stream, bumped inside the writer's transaction.
//!
//! The row lock taken by the bump is held until commit, so positions are committed strictly
//! in order and never reused: a reader that sees position N has everything at or below N.

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::schema::stream_positions;

/// The room event stream.
pub const EVENTS: &str = "events";
/// The account-data stream.
pub const ACCOUNT_DATA: &str = "account_data";
/// The read-receipt stream.
pub const RECEIPTS: &str = "receipts";
/// The presence stream.
pub const PRESENCE: &str = "presence";

/// Takes the next position of a stream (call it last in the transaction: it serialises commits).
pub async fn next_position(mut conn: &AsyncPgConnection, stream: &str) -> QueryResult<i64> {
    diesel::update(stream_positions::table.find(stream))
        .set(stream_positions::position.eq(stream_positions::position + 1))
        .returning(stream_positions::position)
        .get_result(&mut conn)
        .await
}

/// The highest committed position of a stream.
pub async fn current_position(mut conn: &AsyncPgConnection, stream: &str) -> QueryResult<i64> {
    stream_positions::table
        .find(stream)
        .select(stream_positions::position)
        .first(&mut conn)
        .await
}
