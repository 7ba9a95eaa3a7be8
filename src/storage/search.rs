//! Full-text search over message bodies (PostgreSQL `tsvector`, `simple` configuration so any
//! language matches word for word), by the vector each event stores (`events.body_vector`,
//! migration 000038).

use diesel::{
    prelude::*,
    sql_types::{Array, BigInt, Float4, Nullable, Text},
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::rooms::SERVED_TO_CLIENTS;

/// What to look for.
pub struct SearchQuery<'a> {
    /// Words to find.
    pub term: &'a str,
    /// Rooms to look in.
    pub rooms: &'a [String],
    /// Only these senders (`None`: all).
    pub senders: Option<&'a [String]>,
    /// Never these senders.
    pub not_senders: &'a [String],
    /// Only these event types (`None`: all).
    pub types: Option<&'a [String]>,
    /// Never these event types.
    pub not_types: &'a [String],
    /// Best matches first (`true`) or newest first.
    pub by_rank: bool,
}

/// One match.
#[derive(Debug, Clone, QueryableByName)]
pub struct SearchHit {
    /// The event.
    #[diesel(sql_type = Text)]
    pub event_id: String,
    /// How well it matches.
    #[diesel(sql_type = Float4)]
    pub rank: f32,
}

/// The matching events (only those served to clients), without the order.
const MATCHES: &str = "FROM events e, plainto_tsquery('simple', $1) q
     WHERE e.room_id = ANY($2) AND e.state_key IS NULL AND e.redacted_by IS NULL
       AND e.body_vector @@ q
       AND ($3::TEXT[] IS NULL OR e.sender = ANY($3)) AND NOT (e.sender = ANY($4))
       AND ($5::TEXT[] IS NULL OR e.event_type = ANY($5)) AND NOT (e.event_type = ANY($6))";

/// A page of matches.
pub async fn search(
    mut conn: &AsyncPgConnection,
    query: &SearchQuery<'_>,
    offset: i64,
    limit: i64,
) -> QueryResult<Vec<SearchHit>> {
    let order = if query.by_rank {
        "rank DESC, e.stream_ordering DESC"
    } else {
        "e.stream_ordering DESC"
    };
    diesel::sql_query(format!(
        "SELECT e.event_id,
                ts_rank(e.body_vector, q) AS rank
         {MATCHES} AND {SERVED_TO_CLIENTS} ORDER BY {order} OFFSET $7 LIMIT $8"
    ))
    .bind::<Text, _>(query.term)
    .bind::<Array<Text>, _>(query.rooms)
    .bind::<Nullable<Array<Text>>, _>(query.senders)
    .bind::<Array<Text>, _>(query.not_senders)
    .bind::<Nullable<Array<Text>>, _>(query.types)
    .bind::<Array<Text>, _>(query.not_types)
    .bind::<BigInt, _>(offset)
    .bind::<BigInt, _>(limit)
    .load(&mut conn)
    .await
}
