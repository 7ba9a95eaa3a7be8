//! Delayed events (MSC4140): the durable timer. A row goes `scheduled` -> `sending` (claimed
//! by exactly one process with a conditional update) -> `sent` | `failed`, or `scheduled` ->
//! `cancelled` (by its owner, or by a trigger when someone else sets the same state).

use diesel::{
    prelude::*,
    sql_types::{BigInt, Text},
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::Value;

use super::schema::delayed_events;

/// Status of a delayed event waiting for its time.
pub const SCHEDULED: &str = "scheduled";
/// Status of a delayed event one process is sending.
pub const SENDING: &str = "sending";

/// One delayed event.
#[derive(Debug, Clone, Queryable, Selectable, QueryableByName)]
#[diesel(table_name = delayed_events)]
pub struct DelayedEventRow {
    /// Its opaque ID (the capability to manage it).
    pub delay_id: String,
    /// Its owner, who will be the sender.
    pub user_id: String,
    /// The owner's device that scheduled it.
    pub device_id: Option<String>,
    /// Target room.
    pub room_id: String,
    /// Event type.
    pub event_type: String,
    /// State key, for a state event.
    pub state_key: Option<String>,
    /// Event content.
    pub content: Value,
    /// The delay, restarted from now by `restart`.
    pub delay_ms: i64,
    /// When it is due.
    pub send_ts: i64,
    /// `scheduled`, `sending`, `sent`, `cancelled` or `failed`.
    pub status: String,
    /// When a process claimed it for sending.
    pub claimed_ts: Option<i64>,
    /// The event sent.
    pub event_id: Option<String>,
    /// Why it failed or was cancelled.
    pub error: Option<String>,
    /// When it was scheduled.
    pub created_ts: i64,
    /// When it reached its final status.
    pub finalised_ts: Option<i64>,
    /// The client transaction of a delayed `/send`.
    pub txn_id: Option<String>,
}

/// What a new delayed event holds.
pub struct NewDelayedEvent<'a> {
    /// Its ID.
    pub delay_id: &'a str,
    /// Its owner.
    pub user_id: &'a str,
    /// The owner's device.
    pub device_id: &'a str,
    /// Target room.
    pub room_id: &'a str,
    /// Event type.
    pub event_type: &'a str,
    /// State key, for a state event.
    pub state_key: Option<&'a str>,
    /// Event content.
    pub content: &'a Value,
    /// The delay in milliseconds.
    pub delay_ms: i64,
    /// The client transaction of a delayed `/send`.
    pub txn_id: Option<&'a str>,
}

/// Stores a new scheduled delayed event, due `delay_ms` after `now`; with a transaction ID
/// used before by the same device, stores nothing and returns the earlier event's delay ID.
pub async fn insert(
    mut conn: &AsyncPgConnection,
    event: &NewDelayedEvent<'_>,
    now: i64,
) -> QueryResult<String> {
    let inserted: Option<String> = diesel::insert_into(delayed_events::table)
        .values((
            delayed_events::delay_id.eq(event.delay_id),
            delayed_events::user_id.eq(event.user_id),
            delayed_events::device_id.eq(event.device_id),
            delayed_events::room_id.eq(event.room_id),
            delayed_events::event_type.eq(event.event_type),
            delayed_events::state_key.eq(event.state_key),
            delayed_events::content.eq(event.content),
            delayed_events::delay_ms.eq(event.delay_ms),
            delayed_events::send_ts.eq(now + event.delay_ms),
            delayed_events::status.eq(SCHEDULED),
            delayed_events::created_ts.eq(now),
            delayed_events::txn_id.eq(event.txn_id),
        ))
        .on_conflict_do_nothing()
        .returning(delayed_events::delay_id)
        .get_result(&mut conn)
        .await
        .optional()?;
    if let Some(delay_id) = inserted {
        return Ok(delay_id);
    }
    // Only the transaction's unique index can conflict (delay IDs are 256 random bits).
    delayed_events::table
        .filter(delayed_events::user_id.eq(event.user_id))
        .filter(delayed_events::device_id.eq(event.device_id))
        .filter(delayed_events::txn_id.eq(event.txn_id))
        .select(delayed_events::delay_id)
        .first(&mut conn)
        .await
}

/// How many scheduled delayed events a user has.
pub async fn count_scheduled(mut conn: &AsyncPgConnection, user_id: &str) -> QueryResult<i64> {
    delayed_events::table
        .filter(delayed_events::user_id.eq(user_id))
        .filter(delayed_events::status.eq(SCHEDULED))
        .count()
        .get_result(&mut conn)
        .await
}

/// One delayed event, whatever its status.
pub async fn get(
    mut conn: &AsyncPgConnection,
    delay_id: &str,
) -> QueryResult<Option<DelayedEventRow>> {
    delayed_events::table
        .find(delay_id)
        .select(DelayedEventRow::as_select())
        .first(&mut conn)
        .await
        .optional()
}

/// A user's scheduled delayed events, soonest first.
pub async fn get_scheduled_for_user(
    mut conn: &AsyncPgConnection,
    user_id: &str,
) -> QueryResult<Vec<DelayedEventRow>> {
    delayed_events::table
        .filter(delayed_events::user_id.eq(user_id))
        .filter(delayed_events::status.eq(SCHEDULED))
        .order(delayed_events::send_ts)
        .select(DelayedEventRow::as_select())
        .load(&mut conn)
        .await
}

/// A user's finalised delayed events, latest first.
pub async fn get_finalised_for_user(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    limit: i64,
) -> QueryResult<Vec<DelayedEventRow>> {
    delayed_events::table
        .filter(delayed_events::user_id.eq(user_id))
        .filter(delayed_events::finalised_ts.is_not_null())
        .order(delayed_events::finalised_ts.desc())
        .limit(limit)
        .select(DelayedEventRow::as_select())
        .load(&mut conn)
        .await
}

/// Moves a scheduled event's due time to `now` plus its delay; false when it is not scheduled.
pub async fn restart(mut conn: &AsyncPgConnection, delay_id: &str, now: i64) -> QueryResult<bool> {
    let updated = diesel::update(
        delayed_events::table
            .find(delay_id)
            .filter(delayed_events::status.eq(SCHEDULED)),
    )
    .set(delayed_events::send_ts.eq(delayed_events::delay_ms + now))
    .execute(&mut conn)
    .await?;
    Ok(updated == 1)
}

/// Cancels a scheduled event; false when it is not scheduled.
pub async fn cancel(
    mut conn: &AsyncPgConnection,
    delay_id: &str,
    reason: &str,
    now: i64,
) -> QueryResult<bool> {
    let updated = diesel::update(
        delayed_events::table
            .find(delay_id)
            .filter(delayed_events::status.eq(SCHEDULED)),
    )
    .set((
        delayed_events::status.eq("cancelled"),
        delayed_events::error.eq(reason),
        delayed_events::finalised_ts.eq(now),
    ))
    .execute(&mut conn)
    .await?;
    Ok(updated == 1)
}

/// Claims one scheduled event for sending now, whatever its due time; `None` when it is not
/// scheduled (already claimed, finalised or unknown). Only one claimer can win.
pub async fn claim_one(
    mut conn: &AsyncPgConnection,
    delay_id: &str,
    now: i64,
) -> QueryResult<Option<DelayedEventRow>> {
    diesel::update(
        delayed_events::table
            .find(delay_id)
            .filter(delayed_events::status.eq(SCHEDULED)),
    )
    .set((
        delayed_events::status.eq(SENDING),
        delayed_events::claimed_ts.eq(now),
    ))
    .returning(DelayedEventRow::as_returning())
    .get_result(&mut conn)
    .await
    .optional()
}

/// Claims up to `limit` scheduled events due by `now`, plus claims older than `stale_before`
/// that their process never finished (it died mid-send), oldest first. A taken-over claim
/// keeps its old `claimed_ts`, so the sender can tell it apart.
pub async fn claim_due(
    mut conn: &AsyncPgConnection,
    now: i64,
    stale_before: i64,
    limit: i64,
) -> QueryResult<Vec<DelayedEventRow>> {
    diesel::sql_query(
        "UPDATE delayed_events
         SET claimed_ts = CASE WHEN status = 'sending' THEN claimed_ts ELSE $1 END,
             status = 'sending'
         WHERE delay_id IN (
             SELECT delay_id FROM delayed_events
             WHERE (status = 'scheduled' AND send_ts <= $1)
                OR (status = 'sending' AND claimed_ts < $2)
             ORDER BY send_ts
             LIMIT $3
             FOR UPDATE SKIP LOCKED)
         RETURNING *",
    )
    .bind::<BigInt, _>(now)
    .bind::<BigInt, _>(stale_before)
    .bind::<BigInt, _>(limit)
    .load(&mut conn)
    .await
}

/// When the next scheduled event is due.
pub async fn next_due(mut conn: &AsyncPgConnection) -> QueryResult<Option<i64>> {
    delayed_events::table
        .filter(delayed_events::status.eq(SCHEDULED))
        .select(diesel::dsl::min(delayed_events::send_ts))
        .first(&mut conn)
        .await
}

/// Records how a claimed event ended: `sent` with its event ID, or `failed` with the reason.
pub async fn finish(
    mut conn: &AsyncPgConnection,
    delay_id: &str,
    outcome: std::result::Result<&str, &str>,
    now: i64,
) -> QueryResult<()> {
    let (status, event_id, error) = match outcome {
        Ok(event_id) => ("sent", Some(event_id), None),
        Err(error) => ("failed", None, Some(error)),
    };
    diesel::update(
        delayed_events::table
            .find(delay_id)
            .filter(delayed_events::status.eq(SENDING)),
    )
    .set((
        delayed_events::status.eq(status),
        delayed_events::event_id.eq(event_id),
        delayed_events::error.eq(error),
        delayed_events::finalised_ts.eq(now),
    ))
    .execute(&mut conn)
    .await
    .map(drop)
}

/// Forgets finalised events older than `before`.
pub async fn delete_finalised_before(
    mut conn: &AsyncPgConnection,
    before: i64,
) -> QueryResult<usize> {
    diesel::sql_query("DELETE FROM delayed_events WHERE finalised_ts < $1")
        .bind::<BigInt, _>(before)
        .execute(&mut conn)
        .await
}

/// Cancels every scheduled event of a user (their account is going away); a claimed one is
/// left to finish (and fails, the account being gone).
pub async fn cancel_all_for_user(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    now: i64,
) -> QueryResult<usize> {
    diesel::sql_query(
        "UPDATE delayed_events SET status = 'cancelled', error = 'the account was deactivated',
                finalised_ts = $2
         WHERE user_id = $1 AND status = 'scheduled'",
    )
    .bind::<Text, _>(user_id)
    .bind::<BigInt, _>(now)
    .execute(&mut conn)
    .await
}
