//! Federation sending: each destination's backoff and transaction in flight, and the durable
//! EDU outbox. Only the sending process (the leader) builds, sends and finishes transactions;
//! any process may queue EDUs.

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::Value;

use super::schema::{federation_destinations, federation_outbox};

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

/// Destinations with queued EDUs whose backoff (if any) has run out by `now`.
pub async fn get_ready_destinations(
    mut conn: &AsyncPgConnection,
    now: i64,
) -> QueryResult<Vec<String>> {
    federation_outbox::table
        .left_join(
            federation_destinations::table
                .on(federation_destinations::destination.eq(federation_outbox::destination)),
        )
        .filter(
            federation_destinations::retry_at_ts
                .is_null()
                .or(federation_destinations::retry_at_ts.le(now)),
        )
        .select(federation_outbox::destination)
        .distinct()
        .load(&mut conn)
        .await
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
        .order(federation_outbox::outbox_id)
        .limit(limit)
        .select((
            federation_outbox::outbox_id,
            federation_outbox::edu_type,
            federation_outbox::content,
        ))
        .load(&mut conn)
        .await
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
