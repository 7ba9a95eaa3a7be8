//! Reports of events, rooms and users, and the admin API's reading of event reports.

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::Value;

use super::schema::{event_reports, events, room_reports, user_reports};

/// A stored event report.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = event_reports)]
pub struct EventReportRow {
    /// The report's ID.
    pub report_id: i64,
    /// When it was made (ms since 1970).
    pub received_ts: i64,
    /// The room of the event.
    pub room_id: String,
    /// The event reported.
    pub event_id: String,
    /// The reporter.
    pub user_id: String,
    /// Their reason, if any.
    pub reason: Option<String>,
    /// The legacy score (-100 to 0), if given.
    pub score: Option<i64>,
    /// The request body as sent.
    pub content: Value,
}

/// Insert form for `event_reports`.
#[derive(Insertable)]
#[diesel(table_name = event_reports)]
pub struct NewEventReport<'a> {
    /// When it was made.
    pub received_ts: i64,
    /// The room of the event.
    pub room_id: &'a str,
    /// The event reported.
    pub event_id: &'a str,
    /// The reporter.
    pub user_id: &'a str,
    /// Their reason.
    pub reason: Option<&'a str>,
    /// The legacy score.
    pub score: Option<i64>,
    /// The request body.
    pub content: &'a Value,
}

/// Stores an event report.
pub async fn insert_event_report(
    mut conn: &AsyncPgConnection,
    report: &NewEventReport<'_>,
) -> QueryResult<i64> {
    diesel::insert_into(event_reports::table)
        .values(report)
        .returning(event_reports::report_id)
        .get_result(&mut conn)
        .await
}

/// Stores a room report.
pub async fn insert_room_report(
    mut conn: &AsyncPgConnection,
    received_ts: i64,
    room_id: &str,
    user_id: &str,
    reason: &str,
) -> QueryResult<()> {
    diesel::insert_into(room_reports::table)
        .values((
            room_reports::received_ts.eq(received_ts),
            room_reports::room_id.eq(room_id),
            room_reports::user_id.eq(user_id),
            room_reports::reason.eq(reason),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Stores a user report.
pub async fn insert_user_report(
    mut conn: &AsyncPgConnection,
    received_ts: i64,
    target_user_id: &str,
    user_id: &str,
    reason: &str,
) -> QueryResult<()> {
    diesel::insert_into(user_reports::table)
        .values((
            user_reports::received_ts.eq(received_ts),
            user_reports::target_user_id.eq(target_user_id),
            user_reports::user_id.eq(user_id),
            user_reports::reason.eq(reason),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Which event reports a listing takes.
pub struct EventReportQuery<'a> {
    /// Reports skipped (of the order below).
    pub offset: i64,
    /// Most reports returned.
    pub limit: i64,
    /// Oldest first (otherwise newest first).
    pub oldest_first: bool,
    /// Only reports of this room.
    pub room_id: Option<&'a str>,
    /// Only reports by this user.
    pub user_id: Option<&'a str>,
    /// Only reports of events this user sent.
    pub event_sender: Option<&'a str>,
}

/// One page of event reports and how many match in all.
pub async fn list_event_reports(
    mut conn: &AsyncPgConnection,
    query: &EventReportQuery<'_>,
) -> QueryResult<(Vec<EventReportRow>, i64)> {
    let filtered = || {
        let mut q = event_reports::table.into_boxed();
        if let Some(room_id) = query.room_id {
            q = q.filter(event_reports::room_id.eq(room_id.to_owned()));
        }
        if let Some(user_id) = query.user_id {
            q = q.filter(event_reports::user_id.eq(user_id.to_owned()));
        }
        if let Some(sender) = query.event_sender {
            q = q.filter(
                event_reports::event_id.eq_any(
                    events::table
                        .filter(events::sender.eq(sender.to_owned()))
                        .select(events::event_id),
                ),
            );
        }
        q
    };
    let total: i64 = filtered().count().get_result(&mut conn).await?;
    let ordered = if query.oldest_first {
        filtered().order(event_reports::report_id.asc())
    } else {
        filtered().order(event_reports::report_id.desc())
    };
    let rows = ordered
        .offset(query.offset)
        .limit(query.limit)
        .select(EventReportRow::as_select())
        .load(&mut conn)
        .await?;
    Ok((rows, total))
}

/// One event report.
pub async fn get_event_report(
    mut conn: &AsyncPgConnection,
    report_id: i64,
) -> QueryResult<Option<EventReportRow>> {
    event_reports::table
        .find(report_id)
        .select(EventReportRow::as_select())
        .first(&mut conn)
        .await
        .optional()
}

/// Deletes one event report; whether it existed.
pub async fn delete_event_report(
    mut conn: &AsyncPgConnection,
    report_id: i64,
) -> QueryResult<bool> {
    diesel::delete(event_reports::table.find(report_id))
        .execute(&mut conn)
        .await
        .map(|n| n > 0)
}
