//! Application-service delivery state (`appservice_states`) and the event reads its sender
//! makes.

use diesel::{
    prelude::*,
    sql_types::{BigInt, Integer},
    QueryResult,
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::Value;

use super::{
    rooms::{EventRow, EVENT_COLUMNS, SERVED_TO_CLIENTS},
    schema::appservice_states,
};

/// An appservice's delivery state.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = appservice_states)]
pub struct AppserviceState {
    /// Events up to this stream position are in a transaction (or of no interest).
    pub events_upto: i64,
    /// The last transaction ID used.
    pub last_txn_id: i64,
    /// The transaction in flight, if any.
    pub txn_id: Option<i64>,
    /// Its body, resent unchanged.
    pub txn_body: Option<Value>,
    /// Failed attempts in a row.
    pub failures: i32,
    /// When the next attempt may be made (ms since 1970).
    pub retry_at_ts: i64,
}

/// Locks an appservice's state row for this transaction, creating it at `start` (the event
/// stream's current position: an appservice is sent what happens after it was added).
pub async fn lock_state(
    mut conn: &AsyncPgConnection,
    appservice_id: &str,
    start: i64,
) -> QueryResult<AppserviceState> {
    diesel::insert_into(appservice_states::table)
        .values((
            appservice_states::appservice_id.eq(appservice_id),
            appservice_states::events_upto.eq(start),
        ))
        .on_conflict_do_nothing()
        .execute(&mut conn)
        .await?;
    appservice_states::table
        .find(appservice_id)
        .select(AppserviceState::as_select())
        .for_update()
        .first(&mut conn)
        .await
}

/// Reads an appservice's state without locking it.
pub async fn get_state(
    mut conn: &AsyncPgConnection,
    appservice_id: &str,
) -> QueryResult<Option<AppserviceState>> {
    appservice_states::table
        .find(appservice_id)
        .select(AppserviceState::as_select())
        .first(&mut conn)
        .await
        .optional()
}

/// Moves the cursor past events of no interest.
pub async fn set_cursor(
    mut conn: &AsyncPgConnection,
    appservice_id: &str,
    events_upto: i64,
) -> QueryResult<()> {
    diesel::update(appservice_states::table.find(appservice_id))
        .set(appservice_states::events_upto.eq(events_upto))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Stores a new transaction in flight and moves the cursor past its events.
pub async fn set_txn_in_flight(
    mut conn: &AsyncPgConnection,
    appservice_id: &str,
    txn_id: i64,
    body: &Value,
    events_upto: i64,
) -> QueryResult<()> {
    diesel::update(appservice_states::table.find(appservice_id))
        .set((
            appservice_states::events_upto.eq(events_upto),
            appservice_states::last_txn_id.eq(txn_id),
            appservice_states::txn_id.eq(txn_id),
            appservice_states::txn_body.eq(body),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Forgets the delivered transaction `txn_id` and ends the backoff.
pub async fn finish_txn(
    mut conn: &AsyncPgConnection,
    appservice_id: &str,
    txn_id: i64,
) -> QueryResult<()> {
    diesel::update(
        appservice_states::table
            .find(appservice_id)
            .filter(appservice_states::txn_id.eq(txn_id)),
    )
    .set((
        appservice_states::txn_id.eq(None::<i64>),
        appservice_states::txn_body.eq(None::<Value>),
        appservice_states::failures.eq(0),
        appservice_states::retry_at_ts.eq(0),
    ))
    .execute(&mut conn)
    .await
    .map(drop)
}

/// Records a failed attempt and when to try again.
pub async fn set_backoff(
    mut conn: &AsyncPgConnection,
    appservice_id: &str,
    failures: i32,
    retry_at_ts: i64,
) -> QueryResult<()> {
    diesel::update(appservice_states::table.find(appservice_id))
        .set((
            appservice_states::failures.eq(failures),
            appservice_states::retry_at_ts.eq(retry_at_ts),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Ends an appservice's backoff (a successful ping says it is back).
pub async fn reset_backoff(mut conn: &AsyncPgConnection, appservice_id: &str) -> QueryResult<()> {
    diesel::update(appservice_states::table.find(appservice_id))
        .set(appservice_states::retry_at_ts.eq(0))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// The events clients are served in `(after, up_to]`, in stream order, at most `limit`.
pub async fn get_events_between(
    mut conn: &AsyncPgConnection,
    after: i64,
    up_to: i64,
    limit: i32,
) -> QueryResult<Vec<EventRow>> {
    super::cached_sql(format!(
        "SELECT {EVENT_COLUMNS} FROM events \
         WHERE stream_ordering > $1 AND stream_ordering <= $2 AND {SERVED_TO_CLIENTS} \
         ORDER BY stream_ordering LIMIT $3"
    ))
    .bind::<BigInt, _>(after)
    .bind::<BigInt, _>(up_to)
    .bind::<Integer, _>(limit)
    .load(&mut conn)
    .await
}
