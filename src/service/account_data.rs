//! Account data (global and per room) and stored filters.

use diesel_async::AsyncPgConnection;
use ruma::{api::client::filter::FilterDefinition, RoomId, UserId};
use serde_json::{json, Map, Value};

use crate::{
    error::{Error, Result},
    service::notifier::USER_CHANNEL,
    storage::{account_data as store, rooms::notify, Db},
};

/// Account-data types that have their own API and may not be set through account data.
const RESERVED_TYPES: &[&str] = &["m.fully_read", "m.push_rules"];
/// The room account-data type that holds a room's tags (`{"tags": {tag: {"order": n}}}`).
const TAGS_TYPE: &str = "m.tag";
/// The global account-data type that lists a user's direct chats.
const DIRECT_TYPE: &str = "m.direct";
/// The longest tag name, in characters (Synapse's limit).
const MAX_TAG_LENGTH: usize = 255;

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
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            write(conn, user_id, room, data_type, content).await
        })
        .await
    }

    /// A room's tags for the user (the `tags` of `m.tag`; empty when there are none).
    pub async fn get_tags(&self, user_id: &UserId, room_id: &RoomId) -> Result<Map<String, Value>> {
        let conn = self.db.conn().await?;
        let content =
            store::get_account_data(&conn, user_id.as_str(), room_id.as_str(), TAGS_TYPE).await?;
        Ok(tags_of(content))
    }

    /// Adds or replaces a tag: at most 255 characters, `order` (when given) in `[0, 1]`.
    pub async fn set_tag(
        &self,
        user_id: &UserId,
        room_id: &RoomId,
        tag: &str,
        order: Option<f64>,
    ) -> Result<()> {
        if tag.is_empty() || tag.chars().count() > MAX_TAG_LENGTH {
            return Err(Error::invalid_param(format!(
                "A tag must have 1 to {MAX_TAG_LENGTH} characters"
            )));
        }
        if order.is_some_and(|order| !(0.0..=1.0).contains(&order)) {
            return Err(Error::invalid_param(
                "A tag's order must be a number from 0 to 1",
            ));
        }
        let info = match order {
            Some(order) => json!({ "order": order }),
            None => json!({}),
        };
        self.update_tags(user_id, room_id, |tags| {
            tags.insert(tag.to_owned(), info);
            true
        })
        .await
    }

    /// Removes a tag (removing one the room does not have is not an error).
    pub async fn delete_tag(&self, user_id: &UserId, room_id: &RoomId, tag: &str) -> Result<()> {
        self.update_tags(user_id, room_id, |tags| tags.remove(tag).is_some())
            .await
    }

    /// Changes a room's tags in one transaction (a concurrent change waits, so none is lost);
    /// `change` says whether it changed anything, and only a change is stored and synced.
    async fn update_tags(
        &self,
        user_id: &UserId,
        room_id: &RoomId,
        change: impl FnOnce(&mut Map<String, Value>) -> bool + Send,
    ) -> Result<()> {
        let (user, room) = (user_id.as_str(), room_id.as_str());
        let mut conn = self.db.conn().await?;
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            store::lock_account_data_row(conn, user, room, TAGS_TYPE).await?;
            let mut tags = tags_of(store::get_account_data(conn, user, room, TAGS_TYPE).await?);
            if change(&mut tags) {
                write(conn, user_id, room, TAGS_TYPE, &json!({ "tags": tags })).await?;
            }
            Ok(())
        })
        .await
    }

    /// Records a direct chat in the user's `m.direct` (`{user: [room, ...]}`): `room_id` is
    /// added under `other` unless it is there already. Done in one transaction with the row
    /// locked, so a client's own concurrent write of `m.direct` is not lost; the change
    /// reaches `/sync` like any account data.
    pub async fn add_direct_room(
        &self,
        user_id: &UserId,
        other: &UserId,
        room_id: &RoomId,
    ) -> Result<()> {
        let user = user_id.as_str();
        let mut conn = self.db.conn().await?;
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            store::lock_account_data_row(conn, user, store::GLOBAL, DIRECT_TYPE).await?;
            let mut direct =
                match store::get_account_data(conn, user, store::GLOBAL, DIRECT_TYPE).await? {
                    Some(Value::Object(map)) => map,
                    _ => Map::new(),
                };
            let rooms = direct
                .entry(other.as_str().to_owned())
                .or_insert_with(|| Value::Array(Vec::new()));
            if !rooms.is_array() {
                *rooms = Value::Array(Vec::new());
            }
            let Value::Array(rooms) = rooms else {
                return Ok(());
            };
            if rooms.iter().any(|r| r.as_str() == Some(room_id.as_str())) {
                return Ok(());
            }
            rooms.push(Value::String(room_id.as_str().to_owned()));
            write(
                conn,
                user_id,
                store::GLOBAL,
                DIRECT_TYPE,
                &Value::Object(direct),
            )
            .await
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

/// Stores an account-data entry and wakes the user's syncs (inside the caller's transaction).
async fn write(
    conn: &AsyncPgConnection,
    user_id: &UserId,
    room: &str,
    data_type: &str,
    content: &Value,
) -> Result<()> {
    store::set_account_data(conn, user_id.as_str(), room, data_type, content).await?;
    notify(conn, USER_CHANNEL, user_id.as_str()).await?;
    Ok(())
}

/// The `tags` object of stored `m.tag` content (empty when absent or not an object).
fn tags_of(content: Option<Value>) -> Map<String, Value> {
    match content {
        Some(Value::Object(mut content)) => match content.remove("tags") {
            Some(Value::Object(tags)) => tags,
            _ => Map::new(),
        },
        _ => Map::new(),
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
