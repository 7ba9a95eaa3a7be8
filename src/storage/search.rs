//! Full-text search over message bodies (PostgreSQL `tsvector`, `simple` configuration so any
//! language matches word for word), by the vector each event stores (`events.body_vector`,
//! migration 000038).

use diesel::{
    pg::Pg,
    prelude::*,
    query_builder::{BoxedSqlQuery, SqlQuery},
    sql_types::{Array, BigInt, Float4, Nullable, Text},
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::rooms::{Placement, SERVED_TO_CLIENTS};

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

/// Where one match is, without its content: what the approximate `count` is judged from.
#[derive(Debug, Clone, QueryableByName)]
pub struct MatchPlace {
    #[diesel(sql_type = Text)]
    room_id: String,
    #[diesel(sql_type = BigInt)]
    stream_ordering: i64,
    #[diesel(sql_type = BigInt)]
    depth: i64,
    #[diesel(sql_type = Text)]
    event_type: String,
    #[diesel(sql_type = Nullable<Text>)]
    state_key: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    state_group: Option<i64>,
}

impl MatchPlace {
    /// The match's place, as history visibility judges it.
    pub fn placement(&self) -> Placement<'_> {
        Placement {
            room_id: &self.room_id,
            stream_ordering: self.stream_ordering,
            depth: self.depth,
            event_type: &self.event_type,
            state_key: self.state_key.as_deref(),
            state_group: self.state_group,
        }
    }
}

/// The matching events (only those served to clients), without the order.
const MATCHES: &str = "FROM events e, plainto_tsquery('simple', $1) q
     WHERE e.room_id = ANY($2) AND e.state_key IS NULL AND e.redacted_by IS NULL
       AND e.body_vector @@ q
       AND ($3::TEXT[] IS NULL OR e.sender = ANY($3)) AND NOT (e.sender = ANY($4))
       AND ($5::TEXT[] IS NULL OR e.event_type = ANY($5)) AND NOT (e.event_type = ANY($6))";

/// A statement reading [`MATCHES`], its six parameters bound from the query.
fn bind_matches<'a>(sql: String, query: &'a SearchQuery<'_>) -> BoxedSqlQuery<'a, Pg, SqlQuery> {
    diesel::sql_query(sql)
        .into_boxed()
        .bind::<Text, _>(query.term)
        .bind::<Array<Text>, _>(query.rooms)
        .bind::<Nullable<Array<Text>>, _>(query.senders)
        .bind::<Array<Text>, _>(query.not_senders)
        .bind::<Nullable<Array<Text>>, _>(query.types)
        .bind::<Array<Text>, _>(query.not_types)
}

/// The places of the newest `limit` matches, whatever the query's order: reads no event's
/// content, so counting the visible ones among them parses no PDU.
pub async fn newest_matches(
    mut conn: &AsyncPgConnection,
    query: &SearchQuery<'_>,
    limit: i64,
) -> QueryResult<Vec<MatchPlace>> {
    bind_matches(
        format!(
            "SELECT e.room_id, e.stream_ordering, e.depth, e.event_type, e.state_key,
                    e.state_group
             {MATCHES} AND {SERVED_TO_CLIENTS} ORDER BY e.stream_ordering DESC LIMIT $7"
        ),
        query,
    )
    .bind::<BigInt, _>(limit)
    .load(&mut conn)
    .await
}

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
    bind_matches(
        format!(
            "SELECT e.event_id,
                    ts_rank(e.body_vector, q) AS rank
             {MATCHES} AND {SERVED_TO_CLIENTS} ORDER BY {order} OFFSET $7 LIMIT $8"
        ),
        query,
    )
    .bind::<BigInt, _>(offset)
    .bind::<BigInt, _>(limit)
    .load(&mut conn)
    .await
}
