//! Account data (global and per room) and stored filters.

use diesel_async::AsyncConnection;
use ruma::{api::client::filter::FilterDefinition, RoomId, UserId};
use serde_json::Value;

use crate::{
    error::{Error, Result},
    storage::{account_data as store, Db},
};

/// Account-data types that have their own API and may not be set through account data.
const RESERVED_TYPES: &[&str] = &["m.fully_read", "m.push_rules"];

/// Account data and filters.
pub struct AccountData {
    db: Db,
}

impl AccountData {
    /// Creates the service.
    pub fn new(db: Db) -> Self {
        AccountData { db }
    }

    /// Reads an entry (`room_id` `None` for global); `M_NOT_FOUND` when unset.
    pub async fn get(
        &self,
        user_id: &UserId,
        room_id: Option<&RoomId>,
        data_type: &str,
    ) -> Result<Value> {
        let conn = self.db.conn().await?;
        let room = room_id.map_or(store::GLOBAL, |r| r.as_str());
        store::get_account_data(&conn, user_id.as_str(), room, data_type)
            .await?
            .ok_or_else(|| Error::not_found("Account data not found"))
    }

    /// Writes an entry; the content must be a JSON object and the type not server-managed.
    pub async fn set(
        &self,
        user_id: &UserId,
        room_id: Option<&RoomId>,
        data_type: &str,
        content: &Value,
    ) -> Result<()> {
        if RESERVED_TYPES.contains(&data_type) {
            return Err(Error::matrix(
                actix_web::http::StatusCode::METHOD_NOT_ALLOWED,
                "M_BAD_JSON",
                format!("Cannot set {data_type} through this API"),
            ));
        }
        if !content.is_object() {
            return Err(Error::bad_json(
                "Account data content must be a JSON object",
            ));
        }
        let mut conn = self.db.conn().await?;
        let room = room_id.map_or(store::GLOBAL, |r| r.as_str());
        conn.transaction::<_, Error, _>(async |conn| {
            store::set_account_data(conn, user_id.as_str(), room, data_type, content).await?;
            crate::storage::rooms::notify(
                conn,
                crate::service::notifier::USER_CHANNEL,
                user_id.as_str(),
            )
            .await?;
            Ok(())
        })
        .await
    }

    /// Validates and stores a filter, returning its ID.
    pub async fn create_filter(&self, user_id: &UserId, filter: &Value) -> Result<String> {
        validate_filter(filter)?;
        let conn = self.db.conn().await?;
        Ok(store::insert_filter(&conn, user_id.as_str(), filter)
            .await?
            .to_string())
    }

    /// Loads a stored filter; `M_NOT_FOUND` for unknown or malformed IDs.
    pub async fn get_filter(&self, user_id: &UserId, filter_id: &str) -> Result<Value> {
        let not_found = || Error::not_found("No such filter");
        let id: i64 = filter_id.parse().map_err(|_| not_found())?;
        let conn = self.db.conn().await?;
        store::get_filter(&conn, user_id.as_str(), id)
            .await?
            .ok_or_else(not_found)
    }
}

/// Checks a filter's shape against the spec's schema (via ruma's types) and its limits.
pub fn validate_filter(filter: &Value) -> Result<FilterDefinition> {
    if !filter.is_object() {
        return Err(Error::bad_json("Filter must be a JSON object"));
    }
    let parsed: FilterDefinition = serde_json::from_value(filter.clone())
        .map_err(|e| Error::bad_json(format!("Invalid filter: {e}")))?;
    let room = &parsed.room;
    for limit in [
        room.timeline.limit,
        room.state.limit,
        room.ephemeral.limit,
        room.account_data.limit,
    ] {
        if limit.is_some_and(|l| l == ruma::UInt::from(0u32)) {
            return Err(Error::invalid_param("Filter limit must be positive"));
        }
    }
    Ok(parsed)
}

/// Users the given user ignores (`m.ignored_user_list`): their events and invites are hidden
/// from them on `/sync` and `/messages`.
pub async fn ignored_users(
    conn: &diesel_async::AsyncPgConnection,
    user_id: &str,
) -> Result<std::collections::HashSet<String>> {
    let content =
        store::get_account_data(conn, user_id, store::GLOBAL, "m.ignored_user_list").await?;
    Ok(content
        .as_ref()
        .and_then(|c| c.get("ignored_users"))
        .and_then(Value::as_object)
        .map(|users| users.keys().cloned().collect())
        .unwrap_or_default())
}
