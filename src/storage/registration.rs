//! Registration tokens and user-interactive auth sessions.

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::Value;

use super::schema::{registration_tokens, uia_sessions};

/// A row of `registration_tokens`.
#[derive(Debug, Clone, Queryable, Selectable, serde::Serialize)]
#[diesel(table_name = registration_tokens)]
pub struct RegistrationTokenRow {
    /// The token itself.
    pub token: String,
    /// How many registrations it allows in all; `None` is unlimited.
    pub uses_allowed: Option<i32>,
    /// Registrations in progress that validated this token.
    pub pending: i32,
    /// Registrations completed with this token.
    pub completed: i32,
    /// Expiry in ms since the epoch.
    #[serde(rename = "expiry_time")]
    pub expiry_ts: Option<i64>,
}

/// A row of `uia_sessions`.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = uia_sessions)]
pub struct UiaSessionRow {
    /// Session ID handed to the client.
    pub session_id: String,
    /// The user the session authenticates (`None` during registration).
    pub user_id: Option<String>,
    /// Stages completed so far, as a JSON array of strings.
    pub completed_stages: Value,
    /// The registration token validated in this session, if any.
    pub registration_token: Option<String>,
    /// Creation time.
    pub created_ts: i64,
    /// The operation the session authorises (`METHOD path`).
    pub operation: Option<String>,
}

/// Creates a registration token; fails with a unique violation when it exists.
pub async fn insert_registration_token(
    mut conn: &AsyncPgConnection,
    token: &str,
    uses_allowed: Option<i32>,
    expiry_ts: Option<i64>,
    now: i64,
) -> QueryResult<RegistrationTokenRow> {
    diesel::insert_into(registration_tokens::table)
        .values((
            registration_tokens::token.eq(token),
            registration_tokens::uses_allowed.eq(uses_allowed),
            registration_tokens::expiry_ts.eq(expiry_ts),
            registration_tokens::created_ts.eq(now),
        ))
        .returning(RegistrationTokenRow::as_returning())
        .get_result(&mut conn)
        .await
}

/// All registration tokens.
pub async fn get_registration_tokens(
    mut conn: &AsyncPgConnection,
) -> QueryResult<Vec<RegistrationTokenRow>> {
    registration_tokens::table
        .order(registration_tokens::created_ts)
        .select(RegistrationTokenRow::as_select())
        .load(&mut conn)
        .await
}

/// One registration token.
pub async fn get_registration_token(
    mut conn: &AsyncPgConnection,
    token: &str,
) -> QueryResult<Option<RegistrationTokenRow>> {
    registration_tokens::table
        .find(token)
        .select(RegistrationTokenRow::as_select())
        .first(&mut conn)
        .await
        .optional()
}

/// Reserves one use of a token for a registration in progress, if it is still valid.
/// Returns false when the token is unknown, expired or used up (counting pending uses).
pub async fn reserve_registration_token(
    mut conn: &AsyncPgConnection,
    token: &str,
    now: i64,
) -> QueryResult<bool> {
    use registration_tokens::dsl as t;
    let updated = diesel::update(
        t::registration_tokens
            .filter(t::token.eq(token))
            .filter(t::expiry_ts.is_null().or(t::expiry_ts.gt(now)))
            .filter(
                t::uses_allowed.is_null().or(t::uses_allowed
                    .assume_not_null()
                    .gt(t::pending + t::completed)),
            ),
    )
    .set(t::pending.eq(t::pending + 1))
    .execute(&mut conn)
    .await?;
    Ok(updated > 0)
}

/// Turns a pending use of a token into a completed one.
pub async fn complete_registration_token(
    mut conn: &AsyncPgConnection,
    token: &str,
) -> QueryResult<()> {
    use registration_tokens::dsl as t;
    diesel::update(t::registration_tokens.find(token))
        .set((
            t::pending.eq(t::pending - 1),
            t::completed.eq(t::completed + 1),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Gives back a pending use of a token (its registration failed or its session expired).
pub async fn release_registration_token(
    mut conn: &AsyncPgConnection,
    token: &str,
) -> QueryResult<()> {
    use registration_tokens::dsl as t;
    diesel::update(t::registration_tokens.find(token).filter(t::pending.gt(0)))
        .set(t::pending.eq(t::pending - 1))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Deletes UIA sessions created before `cutoff`; returns the registration tokens they held.
pub async fn delete_expired_uia_sessions(
    mut conn: &AsyncPgConnection,
    cutoff: i64,
) -> QueryResult<Vec<String>> {
    let tokens: Vec<Option<String>> =
        diesel::delete(uia_sessions::table.filter(uia_sessions::created_ts.lt(cutoff)))
            .returning(uia_sessions::registration_token)
            .get_results(&mut conn)
            .await?;
    Ok(tokens.into_iter().flatten().collect())
}

/// Deletes a registration token; returns false when it did not exist.
pub async fn delete_registration_token(
    mut conn: &AsyncPgConnection,
    token: &str,
) -> QueryResult<bool> {
    Ok(diesel::delete(registration_tokens::table.find(token))
        .execute(&mut conn)
        .await?
        > 0)
}

/// Creates a UIA session.
pub async fn insert_uia_session(
    mut conn: &AsyncPgConnection,
    session_id: &str,
    user_id: Option<&str>,
    operation: &str,
    now: i64,
) -> QueryResult<()> {
    diesel::insert_into(uia_sessions::table)
        .values((
            uia_sessions::session_id.eq(session_id),
            uia_sessions::user_id.eq(user_id),
            uia_sessions::operation.eq(operation),
            uia_sessions::created_ts.eq(now),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Loads a UIA session, locking its row until the transaction ends so two requests
/// cannot complete the same stage at once.
pub async fn get_uia_session_for_update(
    mut conn: &AsyncPgConnection,
    session_id: &str,
) -> QueryResult<Option<UiaSessionRow>> {
    uia_sessions::table
        .find(session_id)
        .select(UiaSessionRow::as_select())
        .for_update()
        .first(&mut conn)
        .await
        .optional()
}

/// Records a completed stage (and the token it validated, if any).
pub async fn update_uia_session(
    mut conn: &AsyncPgConnection,
    session_id: &str,
    completed_stages: &Value,
    registration_token: Option<&str>,
) -> QueryResult<()> {
    diesel::update(uia_sessions::table.find(session_id))
        .set((
            uia_sessions::completed_stages.eq(completed_stages),
            uia_sessions::registration_token.eq(registration_token),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Deletes a finished UIA session.
pub async fn delete_uia_session(mut conn: &AsyncPgConnection, session_id: &str) -> QueryResult<()> {
    diesel::delete(uia_sessions::table.find(session_id))
        .execute(&mut conn)
        .await
        .map(drop)
}
