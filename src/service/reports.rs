//! Reports of events, rooms and users (`/rooms/{id}/report/{eventId}`, `/rooms/{id}/report`,
//! `/users/{id}/report`), stored for the server's admins, and the admin API's event reports.
//!
//! What a reporter learns is what they may already see: an event report needs the reporter
//! joined to the room and the event visible to them (otherwise 404 `M_NOT_FOUND`, the same
//! for an unknown event); a user report answers 200 for users of other servers and unknown
//! users without storing anything, as Synapse does, so it tells nothing about who exists.

use ruma::{OwnedServerName, RoomId, UserId};
use serde_json::{json, Value};

use super::rooms::Rooms;
use crate::{
    error::{Error, Result},
    storage::{
        now_ms,
        reports::{self as store, EventReportQuery, EventReportRow, NewEventReport},
        rooms as rooms_store, users, Db,
    },
};

/// Longest reason, in characters (Synapse's limit).
pub const MAX_REASON_LENGTH: usize = 1000;

/// Most event reports one admin listing returns.
const MAX_LIST_LIMIT: i64 = 1000;

/// Reports.
pub struct Reports {
    db: Db,
    /// This server's name: only its users' reports are kept.
    server_name: OwnedServerName,
}

/// Which event reports an admin listing shows.
#[derive(Default, Clone, Copy)]
pub struct ReportFilters<'a> {
    /// Only reports of this room.
    pub room_id: Option<&'a str>,
    /// Only reports by this user.
    pub user_id: Option<&'a str>,
    /// Only reports of events this user sent.
    pub event_sender: Option<&'a str>,
}

/// One page of event reports for the admin API.
pub struct EventReportPage {
    /// The reports, as the admin API shows them.
    pub reports: Vec<Value>,
    /// How many reports match the filters.
    pub total: i64,
    /// The `from` of the next page, when there is one.
    pub next_token: Option<i64>,
}

fn check_reason(reason: &str) -> Result<()> {
    if reason.chars().count() > MAX_REASON_LENGTH {
        return Err(Error::bad_json(format!(
            "Reason must be at most {MAX_REASON_LENGTH} characters"
        )));
    }
    Ok(())
}

impl Reports {
    /// Creates the service.
    pub fn new(db: Db, server_name: OwnedServerName) -> Self {
        Reports { db, server_name }
    }

    /// Reports an event. `body` is the request body as sent: `reason` (a string) and the
    /// legacy `score` (an integer from -100 to 0) are optional.
    pub async fn report_event(
        &self,
        rooms: &Rooms,
        reporter: &UserId,
        room_id: &RoomId,
        event_id: &str,
        body: &Value,
    ) -> Result<()> {
        let reason = match body.get("reason") {
            None | Some(Value::Null) => None,
            Some(Value::String(reason)) => Some(reason.as_str()),
            Some(_) => return Err(Error::bad_json("Param 'reason' must be a string")),
        };
        if let Some(reason) = reason {
            check_reason(reason)?;
        }
        let score = match body.get("score") {
            None | Some(Value::Null) => None,
            Some(score) => match score.as_i64() {
                Some(score) if (-100..=0).contains(&score) => Some(score),
                Some(_) => {
                    return Err(Error::invalid_param(
                        "Param 'score' must be an integer between -100 and 0",
                    ))
                }
                None => return Err(Error::bad_json("Param 'score' must be an integer")),
            },
        };
        let not_found = || {
            Error::not_found(
                "Unable to report event: it does not exist or you aren't able to see it.",
            )
        };
        // The spec wants the reporter joined; a redacted event has nothing left to report.
        if rooms.membership(room_id, reporter).await?.as_deref() != Some("join") {
            return Err(not_found());
        }
        let event = rooms
            .event(reporter, room_id, event_id)
            .await
            .map_err(|_| not_found())?;
        if event.pointer("/unsigned/redacted_because").is_some() {
            return Err(not_found());
        }
        let conn = self.db.conn().await?;
        store::insert_event_report(
            &conn,
            &NewEventReport {
                received_ts: now_ms(),
                room_id: room_id.as_str(),
                event_id,
                user_id: reporter.as_str(),
                reason,
                score,
                content: body,
            },
        )
        .await?;
        Ok(())
    }

    /// Reports a room this server knows (404 `M_NOT_FOUND` for one it does not, as Synapse
    /// answers); the reporter need not be in it.
    pub async fn report_room(
        &self,
        reporter: &UserId,
        room_id: &RoomId,
        reason: &str,
    ) -> Result<()> {
        check_reason(reason)?;
        let conn = self.db.conn().await?;
        if rooms_store::get_room(&conn, room_id.as_str())
            .await?
            .is_none()
        {
            return Err(Error::not_found("Room does not exist"));
        }
        store::insert_room_report(&conn, now_ms(), room_id.as_str(), reporter.as_str(), reason)
            .await?;
        Ok(())
    }

    /// Reports a user: stored for a local account, silently dropped otherwise.
    pub async fn report_user(
        &self,
        reporter: &UserId,
        target: &UserId,
        reason: &str,
    ) -> Result<()> {
        check_reason(reason)?;
        if target.server_name() != self.server_name {
            return Ok(());
        }
        let conn = self.db.conn().await?;
        if users::get_user(&conn, target.as_str()).await?.is_none() {
            return Ok(());
        }
        store::insert_user_report(&conn, now_ms(), target.as_str(), reporter.as_str(), reason)
            .await?;
        Ok(())
    }

    /// A page of event reports (`GET /_synapse/admin/v1/event_reports`), filtered by room,
    /// reporter and the reported event's sender when given.
    pub async fn list_event_reports(
        &self,
        from: i64,
        limit: i64,
        oldest_first: bool,
        filters: ReportFilters<'_>,
    ) -> Result<EventReportPage> {
        if from < 0 {
            return Err(Error::invalid_param(
                "The parameter 'from' must be 0 or more",
            ));
        }
        if limit < 0 {
            return Err(Error::invalid_param(
                "The parameter 'limit' must be 0 or more",
            ));
        }
        let limit = limit.min(MAX_LIST_LIMIT);
        let conn = self.db.conn().await?;
        let (rows, total) = store::list_event_reports(
            &conn,
            &EventReportQuery {
                offset: from,
                limit,
                oldest_first,
                room_id: filters.room_id,
                user_id: filters.user_id,
                event_sender: filters.event_sender,
            },
        )
        .await?;
        let mut reports = Vec::with_capacity(rows.len());
        for row in &rows {
            reports.push(self.describe(&conn, row, false).await?);
        }
        let next = from + rows.len() as i64;
        Ok(EventReportPage {
            reports,
            total,
            next_token: (next < total && !rows.is_empty()).then_some(next),
        })
    }

    /// One event report with the reported event (`GET /_synapse/admin/v1/event_reports/{id}`).
    pub async fn get_event_report(&self, report_id: i64) -> Result<Value> {
        let conn = self.db.conn().await?;
        let row = store::get_event_report(&conn, report_id)
            .await?
            .ok_or_else(|| Error::not_found("Event report not found"))?;
        self.describe(&conn, &row, true).await
    }

    /// Deletes an event report (`DELETE /_synapse/admin/v1/event_reports/{id}`).
    pub async fn delete_event_report(&self, report_id: i64) -> Result<()> {
        let conn = self.db.conn().await?;
        if !store::delete_event_report(&conn, report_id).await? {
            return Err(Error::not_found("Event report not found"));
        }
        Ok(())
    }

    /// A report as the admin API shows it: with the room's name and canonical alias and the
    /// event's sender, and the event itself when `with_event`.
    async fn describe(
        &self,
        conn: &diesel_async::AsyncPgConnection,
        row: &EventReportRow,
        with_event: bool,
    ) -> Result<Value> {
        let state = rooms_store::get_current_state_events(
            conn,
            &row.room_id,
            &[("m.room.name", ""), ("m.room.canonical_alias", "")],
        )
        .await?;
        let field = |kind: &str, key: &str| {
            state
                .iter()
                .find(|e| e.event_type == kind)
                .and_then(|e| e.pdu.pointer(&format!("/content/{key}")).cloned())
                .filter(Value::is_string)
                .unwrap_or(Value::Null)
        };
        let event = rooms_store::get_event(conn, &row.event_id).await?;
        let mut report = json!({
            "id": row.report_id,
            "received_ts": row.received_ts,
            "room_id": row.room_id,
            "name": field("m.room.name", "name"),
            "event_id": row.event_id,
            "user_id": row.user_id,
            "reason": row.reason,
            "score": row.score,
            "sender": event.as_ref().map(|e| e.sender.clone()),
            "canonical_alias": field("m.room.canonical_alias", "alias"),
        });
        if with_event {
            report["event_json"] = event.map(|e| e.pdu).unwrap_or(Value::Null);
        }
        Ok(report)
    }
}
