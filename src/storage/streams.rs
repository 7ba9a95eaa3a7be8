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

/// Takes the next position of a stream. The counter row stays locked until this transaction
/// commits, so every other writer of the stream waits from here to that commit: take it as
/// late as the transaction allows. `RoomWriter::append` sends it in one pipelined round trip
/// with everything the event writes; createRoom and upgrades, which append several events in
/// one transaction, store them at provisional positions and bump the counter once, just before
/// commit (`rooms::renumber_provisional_positions`).
pub async fn next_position(mut conn: &AsyncPgConnection, stream: &str) -> QueryResult<i64> {
    // Raw, because diesel never reuses the prepared form of this UPDATE (it was parsed again
    // on every send).
    let taken: Position = super::cached_sql(
        "UPDATE stream_positions SET position = position + 1 WHERE stream = $1 \
         RETURNING position",
    )
    .bind::<diesel::sql_types::Text, _>(stream)
    .get_result(&mut conn)
    .await?;
    Ok(taken.position)
}

/// The event-stream position this transaction took with [`next_position`], as SQL. Rows sent
/// in the same pipeline as the bump use it before its value is back, so the counter's row
/// lock (held to commit) spans one round trip and the commit.
pub const TAKEN_EVENT_POSITION: &str =
    "(SELECT position FROM stream_positions WHERE stream = 'events')";

#[derive(QueryableByName)]
struct Position {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    position: i64,
}

/// The highest committed position of a stream.
pub async fn current_position(mut conn: &AsyncPgConnection, stream: &str) -> QueryResult<i64> {
    stream_positions::table
        .find(stream)
        .select(stream_positions::position)
        .first(&mut conn)
        .await
}
