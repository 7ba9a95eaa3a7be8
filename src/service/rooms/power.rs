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
    listed_level(levels, "users", user_id.as_str(), "users_default", 0)
}

/// A level as a power-levels content lists it: `levels[map][key]` when a number, else
/// `levels[default_field]` when a number, else `fallback` (the spec's default).
pub fn listed_level(
    levels: &Value,
    map: &str,
    key: &str,
    default_field: &str,
    fallback: i64,
) -> i64 {
    levels
        .get(map)
        .and_then(|entries| entries.get(key))
        .and_then(Value::as_i64)
        .unwrap_or_else(|| {
            levels
                .get(default_field)
                .and_then(Value::as_i64)
                .unwrap_or(fallback)
        })
}
