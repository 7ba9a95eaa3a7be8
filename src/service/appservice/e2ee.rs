//! What an appservice that encrypts for its users is sent (MSC3202, `org.matrix.msc3202: true`
//! in its registration), as Synapse sends it:
//! - `org.matrix.msc3202.device_lists`: `changed`, the users whose devices changed who are its
//!   users or are joined to a room that interests it; `left`, the users the transaction's
//!   leaves and bans leave with no such room (Synapse leaves it empty). Read from the
//!   device-list stream with a durable cursor, like the events.
//! - `org.matrix.msc3202.device_one_time_keys_count` (and the older
//!   `device_one_time_key_counts`) and `org.matrix.msc3202.device_unused_fallback_key_types`:
//!   for every device of its sender, of its users joined to the rooms the transaction's
//!   events are in, of the recipients of its to-device messages, and of its users whose
//!   devices changed. Counted when the transaction is built: a change of counts alone sends
//!   nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use diesel_async::AsyncPgConnection;
use serde_json::{json, Map, Value};

use super::{interest::RoomInterest, Registration};
use crate::{
    error::Result,
    storage::{appservice as store, memberships as membership_store, rooms::EventRow},
};

/// Device-list changes read per pass.
const SCAN: i64 = 500;

/// The device-list part of one transaction.
pub struct DeviceLists {
    /// Users whose devices changed.
    pub changed: BTreeSet<String>,
    /// Users it need not follow any more.
    pub left: BTreeSet<String>,
    /// The stream position the cursor moves to.
    pub reached: i64,
}

impl DeviceLists {
    /// Nothing to send; the cursor moves to `reached`.
    pub fn none(reached: i64) -> Self {
        DeviceLists {
            changed: BTreeSet::new(),
            left: BTreeSet::new(),
            reached,
        }
    }

    /// Whether there is nothing to send.
    pub fn is_empty(&self) -> bool {
        self.changed.is_empty() && self.left.is_empty()
    }
}

/// Whether `user_id` is one of the appservice's users or is joined to a room that interests it
/// (Synapse's test for device-list updates).
async fn follows(
    conn: &AsyncPgConnection,
    interest: &mut RoomInterest<'_>,
    registration: &Registration,
    user_id: &str,
) -> Result<bool> {
    if registration.is_interested_in_user(user_id) {
        return Ok(true);
    }
    for room_id in membership_store::get_rooms_for_user(conn, user_id, "join").await? {
        if interest.room(conn, &room_id).await? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The device-list changes in `(after, up_to]` that interest the appservice, and the users
/// the member events in `events` make it stop following.
pub async fn collect(
    conn: &AsyncPgConnection,
    registration: &Registration,
    interest: &mut RoomInterest<'_>,
    events: &[EventRow],
    after: i64,
    up_to: i64,
) -> Result<DeviceLists> {
    let mut lists = DeviceLists::none(after.max(up_to));
    if up_to > after {
        let rows = store::get_device_list_changes_between(conn, after, up_to, SCAN).await?;
        if rows.len() == SCAN as usize {
            lists.reached = rows.last().map_or(up_to, |(position, _)| *position);
        }
        let mut seen = HashMap::new();
        for (_, user_id) in rows {
            if seen.contains_key(&user_id) {
                continue;
            }
            let followed = follows(conn, interest, registration, &user_id).await?;
            seen.insert(user_id.clone(), followed);
            if followed {
                lists.changed.insert(user_id);
            }
        }
    }
    for event in events.iter().filter(|e| e.event_type == "m.room.member") {
        let Some(target) = event.state_key.as_deref() else {
            continue;
        };
        let membership = event.pdu["content"]["membership"].as_str();
        if matches!(membership, Some("leave" | "ban"))
            && !follows(conn, interest, registration, target).await?
        {
            lists.changed.remove(target);
            lists.left.insert(target.to_owned());
        }
    }
    Ok(lists)
}

/// Adds the MSC3202 keys to a transaction `body`: `lists` when not empty, and the key counts
/// of the devices of the sender, of its users joined to `rooms` or in `lists`, and of
/// `recipients`.
pub async fn add_to_body(
    conn: &AsyncPgConnection,
    registration: &Registration,
    body: &mut Value,
    lists: &DeviceLists,
    rooms: &BTreeSet<String>,
    recipients: &BTreeSet<String>,
) -> Result<()> {
    let mut users: BTreeSet<String> = recipients.clone();
    users.insert(registration.sender.to_string());
    // Its users whose devices changed (keys uploaded) too: their counts changed with them.
    users.extend(
        lists
            .changed
            .iter()
            .filter(|user| registration.is_interested_in_user(user))
            .cloned(),
    );
    for room_id in rooms {
        let members = membership_store::get_room_members_in(conn, room_id, &["join"]).await?;
        users.extend(
            members
                .into_iter()
                .filter(|user| registration.is_interested_in_user(user)),
        );
    }
    let users: Vec<String> = users.into_iter().collect();
    let (counts, fallback) = key_counts(conn, &users).await?;
    if !counts.is_empty() {
        let counts = Value::Object(counts);
        body["org.matrix.msc3202.device_one_time_key_counts"] = counts.clone();
        body["org.matrix.msc3202.device_one_time_keys_count"] = counts;
    }
    if !fallback.is_empty() {
        body["org.matrix.msc3202.device_unused_fallback_key_types"] = Value::Object(fallback);
    }
    if !lists.is_empty() {
        body["org.matrix.msc3202.device_lists"] = json!({
            "changed": lists.changed,
            "left": lists.left,
        });
    }
    Ok(())
}

/// user -> device -> algorithm -> count of one-time keys left, and user -> device -> the
/// algorithms of unused fallback keys, for every device of `users` (empty for a device with
/// none, as Synapse sends them).
async fn key_counts(
    conn: &AsyncPgConnection,
    users: &[String],
) -> Result<(Map<String, Value>, Map<String, Value>)> {
    let mut counts: BTreeMap<String, BTreeMap<String, Map<String, Value>>> = BTreeMap::new();
    let mut fallback: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    for (user_id, device_id) in store::get_devices_of(conn, users).await? {
        counts
            .entry(user_id.clone())
            .or_default()
            .insert(device_id.clone(), Map::new());
        fallback
            .entry(user_id)
            .or_default()
            .insert(device_id, Vec::new());
    }
    for (user_id, device_id, algorithm, count) in store::count_one_time_keys_of(conn, users).await?
    {
        if let Some(device) = counts
            .get_mut(&user_id)
            .and_then(|devices| devices.get_mut(&device_id))
        {
            device.insert(algorithm, Value::from(count));
        }
    }
    for (user_id, device_id, algorithm) in store::get_unused_fallback_keys_of(conn, users).await? {
        if let Some(device) = fallback
            .get_mut(&user_id)
            .and_then(|devices| devices.get_mut(&device_id))
        {
            device.push(algorithm);
        }
    }
    let counts = counts
        .into_iter()
        .map(|(user, devices)| (user, json!(devices)))
        .collect();
    let fallback = fallback
        .into_iter()
        .map(|(user, devices)| (user, json!(devices)))
        .collect();
    Ok((counts, fallback))
}
