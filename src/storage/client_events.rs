//! Stored events read as the parts of their client form only. PostgreSQL drops the rest
//! (signatures, hashes, auth and prev events: most of a member event's bytes) before sending,
//! and `content` comes as JSON text that is never parsed into a tree on the way to a client.

use std::collections::HashMap;

use diesel::{
    sql_types::{Array, BigInt, Bool, Nullable, Text},
    QueryResult, QueryableByName,
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

/// What a client-format event is made of.
#[derive(Debug, Clone, PartialEq, Eq, QueryableByName)]
pub struct ClientEventParts {
    /// Event ID.
    #[diesel(sql_type = Text)]
    pub event_id: String,
    /// Room ID.
    #[diesel(sql_type = Text)]
    pub room_id: String,
    /// Position in the event stream.
    #[diesel(sql_type = BigInt)]
    pub stream_ordering: i64,
    /// Sender.
    #[diesel(sql_type = Text)]
    pub sender: String,
    /// Event type.
    #[diesel(sql_type = Text)]
    pub event_type: String,
    /// State key, for state events.
    #[diesel(sql_type = Nullable<Text>)]
    pub state_key: Option<String>,
    /// Origin timestamp.
    #[diesel(sql_type = BigInt)]
    pub origin_server_ts: i64,
    /// `content` as JSON text, as PostgreSQL writes it (a space after each `:` and `,`).
    #[diesel(sql_type = Text)]
    pub content: String,
    /// `content.membership` as text (member events').
    #[diesel(sql_type = Nullable<Text>)]
    pub membership: Option<String>,
    /// Whether `content` has a `url` (for filters' `contains_url`).
    #[diesel(sql_type = Bool)]
    pub has_url: bool,
    /// The redaction that redacted this event, if any.
    #[diesel(sql_type = Nullable<Text>)]
    pub redacted_by: Option<String>,
}

/// The columns of [`ClientEventParts`], read from `events`.
macro_rules! client_parts_columns {
    () => {
        "event_id, room_id, stream_ordering, sender, event_type, state_key, origin_server_ts, \
         COALESCE(pdu -> 'content', '{}')::text AS content, \
         pdu -> 'content' ->> 'membership' AS membership, \
         COALESCE(jsonb_typeof(pdu -> 'content') = 'object' AND pdu -> 'content' ? 'url', false) \
             AS has_url, \
         redacted_by"
    };
}

/// [`ClientEventParts`] with its room's redaction count, read in the same statement.
#[derive(QueryableByName)]
struct CountedParts {
    #[diesel(embed)]
    parts: ClientEventParts,
    #[diesel(sql_type = BigInt)]
    room_redactions: i64,
}

/// [`get_state_event_parts`] by room, each room's with its redaction count read in the same
/// snapshot (`rooms.redactions`: the parts are as that many redactions left them). One
/// statement for the rooms of a sync's batch: planned once, not once a room.
pub async fn get_counted_state_event_parts(
    mut conn: &AsyncPgConnection,
    event_ids: &[String],
) -> QueryResult<HashMap<String, (Vec<ClientEventParts>, i64)>> {
    if event_ids.is_empty() {
        return Ok(HashMap::new());
    }
    let rows: Vec<CountedParts> = crate::storage::cached_sql(concat!(
        "SELECT ",
        client_parts_columns!(),
        ", (SELECT r.redactions FROM rooms r WHERE r.room_id = events.room_id) AS room_redactions \
         FROM events WHERE event_id = ANY($1) AND rejected_reason IS NULL"
    ))
    .bind::<Array<Text>, _>(event_ids)
    .load(&mut conn)
    .await?;
    let mut by_room: HashMap<String, (Vec<ClientEventParts>, i64)> = HashMap::new();
    for row in rows {
        let room = by_room
            .entry(row.parts.room_id.clone())
            .or_insert_with(|| (Vec::new(), row.room_redactions));
        room.0.push(row.parts);
    }
    Ok(by_room)
}

/// The client parts of the given state events that passed authorisation, in no order.
pub async fn get_state_event_parts(
    mut conn: &AsyncPgConnection,
    event_ids: &[String],
) -> QueryResult<Vec<ClientEventParts>> {
    if event_ids.is_empty() {
        return Ok(Vec::new());
    }
    crate::storage::cached_sql(concat!(
        "SELECT ",
        client_parts_columns!(),
        " FROM events WHERE event_id = ANY($1) AND rejected_reason IS NULL"
    ))
    .bind::<Array<Text>, _>(event_ids)
    .load(&mut conn)
    .await
}
