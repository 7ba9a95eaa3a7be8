//! Who may do what in a room, as its create and power-levels contents say, for the checks the
//! endpoints make before the auth rules do.

use ruma::UserId;
use serde_json::Value;

/// Whether a user created the room: its create event's sender or one of its
/// `additional_creators` (room versions that privilege creators put them above everyone).
pub fn is_room_creator(create_sender: &str, create_content: &Value, user_id: &UserId) -> bool {
    create_sender == user_id.as_str()
        || create_content
            .get("additional_creators")
            .and_then(Value::as_array)
            .is_some_and(|creators| creators.iter().any(|c| c == user_id.as_str()))
}

/// A user's power level as a power-levels content lists it (`users`, else `users_default`).
pub fn listed_power_level(levels: &Value, user_id: &UserId) -> i64 {
    levels
        .get("users")
        .and_then(|users| users.get(user_id.as_str()))
        .and_then(Value::as_i64)
        .unwrap_or_else(|| {
            levels
                .get("users_default")
                .and_then(Value::as_i64)
                .unwrap_or(0)
        })
}
