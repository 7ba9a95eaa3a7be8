//! Federation sending: each destination's backoff and transaction in flight, the durable
//! outbox of EDUs and PDUs, and the cursor over the event stream that fills it with PDUs.
//! Only the sending process (the leader) queues PDUs and builds, sends and finishes
//! transactions; any process may queue EDUs.

use diesel::{
    prelude::*,
    sql_types::{BigInt, Integer, Jsonb, Nullable, Text},
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::Value;

use super::{
    rooms::SERVED_TO_CLIENTS,
    schema::{federation_destinations, federation_outbox, federation_pdu_cursor},
};

/// A destination's sending state.
#[derive(Debug, Clone, Queryable)]
pub struct DestinationRow {
    /// Failed attempts since the last success or inbound contact.
    pub failures: i32,
    /// No attempt before this time (ms).
    pub retry_at_ts: i64,
    /// The transaction in flight.
    pub txn_id: Option<String>,
    /// Its body, exactly as it is (re)sent.
    pub txn_body: Option<Value>,
}

/// A queued EDU.
#[derive(Debug, Clone, Queryable)]
pub struct OutboxRow {
    /// Queue order.
    pub outbox_id: i64,
    /// `m.direct_to_device`, ...
    pub edu_type: String,
    /// The EDU's `content`.
    pub content: Value,
}

/// A queued PDU.
#[derive(Debug, Clone, Queryable)]
pub struct PduOutboxRow {
    /// Queue order (stream order among a destination's PDUs).
    pub outbox_id: i64,
    /// The event's ID.
    pub event_id: String,
    /// The PDU as it is sent.
    pub pdu: Value,
}

/// Queues one EDU for `destination`.
pub async fn queue_edu(
    mut conn: &AsyncPgConnection,
    destination: &str,
    edu_type: &str,
    content: &Value,
    now: i64,
) -> QueryResult<()> {
    diesel::insert_into(federation_outbox::table)
        .values((
            federation_outbox::destination.eq(destination),
            federation_outbox::edu_type.eq(edu_type),
            federation_outbox::content.eq(content),
            federation_outbox::created_ts.eq(now),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Destinations with something queued whose backoff (if any) has run out by `now`. The
/// outbox is walked one destination at a time by index (a long backlog for a server that is
/// down costs one step, not a scan of its rows: this runs on every wake-up).
pub async fn get_ready_destinations(
    mut conn: &AsyncPgConnection,
    now: i64,
) -> QueryResult<Vec<String>> {
    #[derive(QueryableByName)]
    struct Destination {
        #[diesel(sql_type = Text)]
        destination: String,
    }
    let rows: Vec<Destination> = super::cached_sql(
        "WITH RECURSIVE queued (destination) AS ( \
             (SELECT destination FROM federation_outbox ORDER BY destination LIMIT 1) \
             UNION ALL \
             SELECT (SELECT o.destination FROM federation_outbox o \
                     WHERE o.destination > q.destination ORDER BY o.destination LIMIT 1) \
             FROM queued q WHERE q.destination IS NOT NULL \
         ) \
         SELECT q.destination FROM queued q \
         LEFT JOIN federation_destinations d ON d.destination = q.destination \
         WHERE q.destination IS NOT NULL AND (d.retry_at_ts IS NULL OR d.retry_at_ts <= $1)",
    )
    .bind::<BigInt, _>(now)
    .load(&mut conn)
    .await?;
    Ok(rows.into_iter().map(|row| row.destination).collect())
}

/// A destination's sending state, if it has any.
pub async fn get_destination(
    mut conn: &AsyncPgConnection,
    destination: &str,
) -> QueryResult<Option<DestinationRow>> {
    federation_destinations::table
        .find(destination)
        .select((
            federation_destinations::failures,
            federation_destinations::retry_at_ts,
            federation_destinations::txn_id,
            federation_destinations::txn_body,
        ))
        .first(&mut conn)
        .await
        .optional()
}

/// The oldest EDUs queued for `destination` not yet in a transaction.
pub async fn get_unsent_edus(
    mut conn: &AsyncPgConnection,
    destination: &str,
    limit: i64,
) -> QueryResult<Vec<OutboxRow>> {
    federation_outbox::table
        .filter(federation_outbox::destination.eq(destination))
        .filter(federation_outbox::txn_id.is_null())
        .filter(federation_outbox::event_id.is_null())
        .order(federation_outbox::outbox_id)
        .limit(limit)
        .select((
            federation_outbox::outbox_id,
            federation_outbox::edu_type.assume_not_null(),
            federation_outbox::content,
        ))
        .load(&mut conn)
        .await
}

/// Forgets EDUs of one type queued for `destination` before `before` and not yet in a
/// transaction: news too old to matter (typing after its receiver's timeout).
pub async fn delete_unsent_edus_before(
    mut conn: &AsyncPgConnection,
    destination: &str,
    edu_type: &str,
    before: i64,
) -> QueryResult<usize> {
    diesel::delete(
        federation_outbox::table
            .filter(federation_outbox::destination.eq(destination))
            .filter(federation_outbox::txn_id.is_null())
            .filter(federation_outbox::edu_type.eq(edu_type))
            .filter(federation_outbox::created_ts.lt(before)),
    )
    .execute(&mut conn)
    .await
}

/// The oldest PDUs queued for `destination` not yet in a transaction, in stream order.
pub async fn get_unsent_pdus(
    mut conn: &AsyncPgConnection,
    destination: &str,
    limit: i64,
) -> QueryResult<Vec<PduOutboxRow>> {
    federation_outbox::table
        .filter(federation_outbox::destination.eq(destination))
        .filter(federation_outbox::txn_id.is_null())
        .filter(federation_outbox::event_id.is_not_null())
        .order(federation_outbox::outbox_id)
        .limit(limit)
        .select((
            federation_outbox::outbox_id,
            federation_outbox::event_id.assume_not_null(),
            federation_outbox::content,
        ))
        .load(&mut conn)
        .await
}

/// A PDU to queue: `(destination, event ID, the PDU as it is sent)`.
pub type NewPdu<'a> = (&'a str, &'a str, &'a Value);

/// Queues PDUs, in the order given (each destination's PDUs leave in that order).
pub async fn queue_pdus(
    mut conn: &AsyncPgConnection,
    pdus: &[NewPdu<'_>],
    now: i64,
) -> QueryResult<()> {
    let rows: Vec<_> = pdus
        .iter()
        .map(|(destination, event_id, pdu)| {
            (
                federation_outbox::destination.eq(*destination),
                federation_outbox::event_id.eq(Some(*event_id)),
                federation_outbox::content.eq(*pdu),
                federation_outbox::created_ts.eq(now),
            )
        })
        .collect();
    for chunk in rows.chunks(1000) {
        diesel::insert_into(federation_outbox::table)
            .values(chunk)
            .execute(&mut conn)
            .await?;
    }
    Ok(())
}

/// Drops the oldest PDUs queued for `destination` and not yet in a transaction beyond the
/// newest `keep`; answers how many were dropped.
pub async fn trim_unsent_pdus(
    mut conn: &AsyncPgConnection,
    destination: &str,
    keep: i64,
) -> QueryResult<usize> {
    super::cached_sql(
        "DELETE FROM federation_outbox \
         WHERE destination = $1 AND event_id IS NOT NULL AND txn_id IS NULL \
           AND outbox_id <= (SELECT outbox_id FROM federation_outbox \
                             WHERE destination = $1 AND event_id IS NOT NULL AND txn_id IS NULL \
                             ORDER BY outbox_id DESC OFFSET $2 LIMIT 1)",
    )
    .bind::<Text, _>(destination)
    .bind::<BigInt, _>(keep)
    .execute(&mut conn)
    .await
}

/// The advisory lock the queuing transaction holds on the cursor.
const PDU_CURSOR_LOCK: i64 = 0x6d79_656c_7064_7563; // "myelpduc"

/// How far the event stream has been queued; holds the cursor's advisory lock until the
/// transaction ends, so two processes that both believe they lead cannot queue the same
/// events. An advisory lock, not a row lock: a row lock writes to the row, and a transaction
/// that writes waits at commit for its log to reach the disk, once for every event sent even
/// when nothing is queued. The lock and the read go out together, the read after the lock.
pub async fn lock_pdu_cursor(conn: &AsyncPgConnection) -> QueryResult<i64> {
    let lock = async {
        let mut conn = conn;
        super::cached_sql("SELECT pg_advisory_xact_lock($1)")
            .bind::<BigInt, _>(PDU_CURSOR_LOCK)
            .execute(&mut conn)
            .await
    };
    let read = async {
        let mut conn = conn;
        federation_pdu_cursor::table
            .select(federation_pdu_cursor::stream_ordering)
            .first(&mut conn)
            .await
    };
    let (_, cursor) = futures_util::try_join!(lock, read)?;
    Ok(cursor)
}

/// Moves the cursor (inside the transaction that queued the events up to `position`).
pub async fn set_pdu_cursor(mut conn: &AsyncPgConnection, position: i64) -> QueryResult<()> {
    diesel::update(federation_pdu_cursor::table)
        .set(federation_pdu_cursor::stream_ordering.eq(position))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// An event that may go to other servers.
#[derive(Debug, Clone, QueryableByName)]
pub struct EventToSend {
    /// Its position in the event stream.
    #[diesel(sql_type = BigInt)]
    pub stream_ordering: i64,
    /// Its ID.
    #[diesel(sql_type = Text)]
    pub event_id: String,
    /// Its sender (to be confirmed as local by the caller).
    #[diesel(sql_type = Text)]
    pub sender: String,
    /// `m.room.member`, ...
    #[diesel(sql_type = Text)]
    pub event_type: String,
    /// Its state key, for state events.
    #[diesel(sql_type = Nullable<Text>)]
    pub state_key: Option<String>,
    /// The state after it.
    #[diesel(sql_type = BigInt)]
    pub state_group: i64,
    /// The stored PDU.
    #[diesel(sql_type = Jsonb)]
    pub pdu: Value,
}

/// The events after position `after` up to `up_to` (at most `limit`, in stream order) that
/// clients are served and whose sender's ID ends in `:{server}` (the caller confirms the
/// server with a parser: a suffix is not a server name). The bounds are sub-selects so that
/// one generic plan serves every call (see `rooms::get_rooms_changed_between`).
pub async fn get_events_to_send(
    mut conn: &AsyncPgConnection,
    after: i64,
    up_to: i64,
    server: &str,
    limit: i32,
) -> QueryResult<Vec<EventToSend>> {
    super::cached_sql(format!(
        "SELECT stream_ordering, event_id, sender, event_type, state_key, state_group, pdu \
         FROM events \
         WHERE stream_ordering > (SELECT $1::BIGINT) AND stream_ordering <= (SELECT $2::BIGINT) \
           AND sender LIKE $3 \
           AND {SERVED_TO_CLIENTS} \
         ORDER BY stream_ordering LIMIT $4"
    ))
    .bind::<BigInt, _>(after)
    .bind::<BigInt, _>(up_to)
    .bind::<Text, _>(super::room_servers::suffix_pattern(server))
    .bind::<Integer, _>(limit)
    .load(&mut conn)
    .await
}

/// Drops everything queued for `destination` and its transaction in flight (a destination
/// that can never be contacted).
pub async fn delete_queue(mut conn: &AsyncPgConnection, destination: &str) -> QueryResult<()> {
    diesel::delete(federation_outbox::table.filter(federation_outbox::destination.eq(destination)))
        .execute(&mut conn)
        .await?;
    diesel::update(federation_destinations::table.find(destination))
        .set((
            federation_destinations::txn_id.eq(None::<String>),
            federation_destinations::txn_body.eq(None::<Value>),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Records the transaction now in flight to `destination` and the EDUs it carries.
pub async fn set_txn_in_flight(
    mut conn: &AsyncPgConnection,
    destination: &str,
    txn_id: &str,
    body: &Value,
    outbox_ids: &[i64],
) -> QueryResult<()> {
    diesel::update(
        federation_outbox::table.filter(federation_outbox::outbox_id.eq_any(outbox_ids)),
    )
    .set(federation_outbox::txn_id.eq(txn_id))
    .execute(&mut conn)
    .await?;
    diesel::insert_into(federation_destinations::table)
        .values((
            federation_destinations::destination.eq(destination),
            federation_destinations::txn_id.eq(txn_id),
            federation_destinations::txn_body.eq(body),
        ))
        .on_conflict(federation_destinations::destination)
        .do_update()
        .set((
            federation_destinations::txn_id.eq(txn_id),
            federation_destinations::txn_body.eq(body),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// The destination acknowledged `txn_id` (or it can never be delivered): its EDUs leave the
/// outbox, and the destination is no longer backed off.
pub async fn finish_txn(
    mut conn: &AsyncPgConnection,
    destination: &str,
    txn_id: &str,
) -> QueryResult<()> {
    diesel::delete(
        federation_outbox::table
            .filter(federation_outbox::destination.eq(destination))
            .filter(federation_outbox::txn_id.eq(txn_id)),
    )
    .execute(&mut conn)
    .await?;
    diesel::update(federation_destinations::table.find(destination))
        .set((
            federation_destinations::failures.eq(0),
            federation_destinations::retry_at_ts.eq(0),
            federation_destinations::txn_id.eq(None::<String>),
            federation_destinations::txn_body.eq(None::<Value>),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Records a failed attempt: `failures` so far, no new attempt before `retry_at`.
pub async fn set_backoff(
    mut conn: &AsyncPgConnection,
    destination: &str,
    failures: i32,
    retry_at: i64,
) -> QueryResult<()> {
    diesel::insert_into(federation_destinations::table)
        .values((
            federation_destinations::destination.eq(destination),
            federation_destinations::failures.eq(failures),
            federation_destinations::retry_at_ts.eq(retry_at),
        ))
        .on_conflict(federation_destinations::destination)
        .do_update()
        .set((
            federation_destinations::failures.eq(failures),
            federation_destinations::retry_at_ts.eq(retry_at),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Ends a destination's backoff; true when it was backed off.
pub async fn reset_backoff(mut conn: &AsyncPgConnection, destination: &str) -> QueryResult<bool> {
    diesel::update(
        federation_destinations::table.find(destination).filter(
            federation_destinations::failures
                .gt(0)
                .or(federation_destinations::retry_at_ts.gt(0)),
        ),
    )
    .set((
        federation_destinations::failures.eq(0),
        federation_destinations::retry_at_ts.eq(0),
    ))
    .execute(&mut conn)
    .await
    .map(|n| n > 0)
}
