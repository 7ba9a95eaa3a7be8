//! Stream positions: one sequence per stream, and a persisted-up-to position for readers.
//!
//! A writer takes positions inside its transaction ([`next_position`]) and holds an advisory
//! lock on the lowest one until it commits or rolls back; taking a position waits for no other
//! writer. Readers advance only to the persisted-up-to position ([`positions`]): below every
//! position still held, so a reader that has seen position N has everything at or below N,
//! whichever order the writers commit in (DESIGN.md, invariant 1). The SQL side is in
//! migration 000016 (`myelin_take_positions`, `myelin_stream_positions`).

use diesel::{
    sql_types::{BigInt, Text},
    QueryResult,
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

/// The room event stream.
pub const EVENTS: &str = "events";
/// The account-data stream.
pub const ACCOUNT_DATA: &str = "account_data";
/// The read-receipt stream.
pub const RECEIPTS: &str = "receipts";
/// The presence stream.
pub const PRESENCE: &str = "presence";

/// Takes the next position of a stream for this transaction. Readers stay below it until the
/// transaction ends, so take it as late as the transaction allows. `RoomWriter::append` sends
/// it in one pipelined round trip with everything the event writes; createRoom and upgrades,
/// which append several events in one transaction, store them at provisional positions and
/// take real ones just before commit (`rooms::renumber_provisional_positions`).
pub async fn next_position(mut conn: &AsyncPgConnection, stream: &str) -> QueryResult<i64> {
    let taken: Taken = super::cached_sql("SELECT (myelin_take_positions($1, 1))[1] AS position")
        .bind::<Text, _>(stream)
        .get_result(&mut conn)
        .await?;
    Ok(taken.position)
}

/// The event-stream position this transaction took last with [`next_position`], as SQL. Rows
/// sent in the same pipeline as the take use it before its value is back.
pub const TAKEN_EVENT_POSITION: &str = "currval('stream_events_seq')";

#[derive(diesel::QueryableByName)]
struct Taken {
    #[diesel(sql_type = BigInt)]
    position: i64,
}

#[derive(diesel::QueryableByName, Debug, Clone)]
struct PositionRow {
    #[diesel(sql_type = Text)]
    stream: String,
    #[diesel(sql_type = BigInt)]
    persisted: i64,
    #[diesel(sql_type = BigInt)]
    taken: i64,
}

/// Where every stream stands.
#[derive(Debug, Clone, Default)]
pub struct Positions {
    rows: Vec<PositionRow>,
}

impl Positions {
    /// The persisted-up-to position of a stream: everything at or below it is committed (or
    /// will never be).
    pub fn persisted(&self, stream: &str) -> i64 {
        self.rows
            .iter()
            .find(|row| row.stream == stream)
            .map_or(0, |row| row.persisted)
    }

    /// Each stream's name, highest position taken and persisted-up-to position.
    pub fn each(&self) -> impl Iterator<Item = (&str, i64, i64)> {
        self.rows
            .iter()
            .map(|row| (row.stream.as_str(), row.taken, row.persisted))
    }

    /// Whether some stream has positions taken above its persisted-up-to position: a writer
    /// is in flight, and a reader that found nothing new may find it shortly without being
    /// woken (the writer that holds it back may be writing elsewhere, or roll back).
    pub fn held_back(&self) -> bool {
        self.rows.iter().any(|row| row.taken > row.persisted)
    }

    /// Whether every position `earlier` had taken is persisted here.
    pub fn covers(&self, earlier: &Positions) -> bool {
        earlier
            .rows
            .iter()
            .all(|row| self.persisted(&row.stream) >= row.taken)
    }
}

/// Every stream's persisted-up-to position, in one round trip.
pub async fn positions(mut conn: &AsyncPgConnection) -> QueryResult<Positions> {
    let rows = super::cached_sql("SELECT stream, persisted, taken FROM myelin_stream_positions()")
        .load(&mut conn)
        .await?;
    Ok(Positions { rows })
}

/// The persisted-up-to position of one stream.
pub async fn persisted(conn: &AsyncPgConnection, stream: &str) -> QueryResult<i64> {
    Ok(positions(conn).await?.persisted(stream))
}
