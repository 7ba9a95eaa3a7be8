//! Application-service delivery state (`appservice_states`) and the reads its sender makes:
//! events, to-device messages, device-list changes and key counts.

use diesel::{
    prelude::*,
    sql_types::{BigInt, Integer},
    QueryResult,
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::Value;

use super::{
    rooms::{EventRow, EVENT_COLUMNS, SERVED_TO_CLIENTS},
    schema::{
        appservice_states, device_list_changes, devices, fallback_keys, one_time_keys,
        to_device_inbox,
    },
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
    /// To-device messages up to this stream position are in a transaction (or of no
    /// interest).
    pub to_device_upto: i64,
    /// Device-list changes up to this stream position likewise.
    pub device_lists_upto: i64,
}

impl AppserviceState {
    /// Where its cursors stand.
    pub fn cursors(&self) -> Cursors {
        Cursors {
            events: self.events_upto,
            to_device: self.to_device_upto,
            device_lists: self.device_lists_upto,
        }
    }
}

/// An appservice's position in each stream it is sent from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursors {
    /// In the event stream.
    pub events: i64,
    /// In the to-device stream.
    pub to_device: i64,
    /// In the device-list stream.
    pub device_lists: i64,
}

/// Locks an appservice's state row for this transaction, creating it at `start` (the
/// streams' current positions: an appservice is sent what happens after it was added).
pub async fn lock_state(
    mut conn: &AsyncPgConnection,
    appservice_id: &str,
    start: Cursors,
) -> QueryResult<AppserviceState> {
    diesel::insert_into(appservice_states::table)
        .values((
            appservice_states::appservice_id.eq(appservice_id),
            appservice_states::events_upto.eq(start.events),
            appservice_states::to_device_upto.eq(start.to_device),
            appservice_states::device_lists_upto.eq(start.device_lists),
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

/// Moves the cursors past what is of no interest.
pub async fn set_cursors(
    mut conn: &AsyncPgConnection,
    appservice_id: &str,
    cursors: Cursors,
) -> QueryResult<()> {
    diesel::update(appservice_states::table.find(appservice_id))
        .set((
            appservice_states::events_upto.eq(cursors.events),
            appservice_states::to_device_upto.eq(cursors.to_device),
            appservice_states::device_lists_upto.eq(cursors.device_lists),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Stores a new transaction in flight and moves the cursors past what it carries.
pub async fn set_txn_in_flight(
    mut conn: &AsyncPgConnection,
    appservice_id: &str,
    txn_id: i64,
    body: &Value,
    cursors: Cursors,
) -> QueryResult<()> {
    diesel::update(appservice_states::table.find(appservice_id))
        .set((
            appservice_states::events_upto.eq(cursors.events),
            appservice_states::to_device_upto.eq(cursors.to_device),
            appservice_states::device_lists_upto.eq(cursors.device_lists),
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

/// A message in some device's to-device inbox.
#[derive(Debug, Clone, Queryable)]
pub struct ToDeviceRow {
    /// Its stream position (one `sendToDevice` puts all its messages at one position).
    pub stream_ordering: i64,
    /// The recipient.
    pub user_id: String,
    /// The recipient's device.
    pub device_id: String,
    /// The sender.
    pub sender: String,
    /// The event type.
    pub event_type: String,
    /// The content.
    pub content: Value,
}

/// The to-device messages in `(after, up_to]` still in an inbox, in stream order (then by
/// recipient), at most `limit`.
pub async fn get_to_device_between(
    mut conn: &AsyncPgConnection,
    after: i64,
    up_to: i64,
    limit: i64,
) -> QueryResult<Vec<ToDeviceRow>> {
    to_device_inbox::table
        .filter(to_device_inbox::stream_ordering.gt(after))
        .filter(to_device_inbox::stream_ordering.le(up_to))
        .order((
            to_device_inbox::stream_ordering,
            to_device_inbox::user_id,
            to_device_inbox::device_id,
        ))
        .limit(limit)
        .select((
            to_device_inbox::stream_ordering,
            to_device_inbox::user_id,
            to_device_inbox::device_id,
            to_device_inbox::sender,
            to_device_inbox::event_type,
            to_device_inbox::content,
        ))
        .load(&mut conn)
        .await
}

/// The device-list changes in `(after, up_to]`: `(position, user)`, in stream order, at most
/// `limit`.
pub async fn get_device_list_changes_between(
    mut conn: &AsyncPgConnection,
    after: i64,
    up_to: i64,
    limit: i64,
) -> QueryResult<Vec<(i64, String)>> {
    device_list_changes::table
        .filter(device_list_changes::stream_ordering.gt(after))
        .filter(device_list_changes::stream_ordering.le(up_to))
        .order(device_list_changes::stream_ordering)
        .limit(limit)
        .select((
            device_list_changes::stream_ordering,
            device_list_changes::user_id,
        ))
        .load(&mut conn)
        .await
}

/// The (visible) devices of `user_ids`: `(user, device)`.
pub async fn get_devices_of(
    mut conn: &AsyncPgConnection,
    user_ids: &[String],
) -> QueryResult<Vec<(String, String)>> {
    devices::table
        .filter(devices::user_id.eq_any(user_ids))
        .filter(devices::hidden.eq(false))
        .select((devices::user_id, devices::device_id))
        .load(&mut conn)
        .await
}

/// How many one-time keys the devices of `user_ids` have left: `(user, device, algorithm,
/// count)`, for devices with any.
pub async fn count_one_time_keys_of(
    mut conn: &AsyncPgConnection,
    user_ids: &[String],
) -> QueryResult<Vec<(String, String, String, i64)>> {
    one_time_keys::table
        .filter(one_time_keys::user_id.eq_any(user_ids))
        .group_by((
            one_time_keys::user_id,
            one_time_keys::device_id,
            one_time_keys::algorithm,
        ))
        .select((
            one_time_keys::user_id,
            one_time_keys::device_id,
            one_time_keys::algorithm,
            diesel::dsl::count_star(),
        ))
        .load(&mut conn)
        .await
}

/// The algorithms of unused fallback keys of the devices of `user_ids`: `(user, device,
/// algorithm)`.
pub async fn get_unused_fallback_keys_of(
    mut conn: &AsyncPgConnection,
    user_ids: &[String],
) -> QueryResult<Vec<(String, String, String)>> {
    fallback_keys::table
        .filter(fallback_keys::user_id.eq_any(user_ids))
        .filter(fallback_keys::used.eq(false))
        .select((
            fallback_keys::user_id,
            fallback_keys::device_id,
            fallback_keys::algorithm,
        ))
        .load(&mut conn)
        .await
}
