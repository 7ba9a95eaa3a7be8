//! Scenario 9: simplified sliding sync (MSC4186) for a user in many rooms, with the request
//! Element X's room list sends: the first response for a window of 20, the window growing by
//! 100 at a time, the whole list at once, incremental responses with nothing and with one
//! room changed, and a long-poll's wake-up after a message.

use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use crate::{
    client::{Failure, User},
    stats::Samples,
    Bench,
};

/// The room list's request for the rooms `0..=last` on connection `conn_id`.
fn room_list(conn_id: &str, last: usize) -> Value {
    json!({
        "conn_id": conn_id,
        "lists": { "all_rooms": {
            "ranges": [[0, last]],
            "timeline_limit": 1,
            "required_state": [
                ["m.room.encryption", ""], ["m.room.member", "$LAZY"], ["m.room.member", "$ME"],
                ["m.room.name", ""], ["m.room.avatar", ""], ["m.room.canonical_alias", ""],
                ["m.room.power_levels", ""], ["m.room.join_rules", ""], ["m.room.topic", ""],
                ["m.room.create", ""], ["m.room.history_visibility", ""],
            ],
            "filters": { "not_room_types": ["m.space"] },
        } },
        "extensions": {
            "account_data": { "enabled": true },
            "receipts": { "enabled": true, "rooms": ["*"] },
            "typing": { "enabled": true },
        },
    })
}

fn pos_of(response: &Value) -> Result<String, Failure> {
    response["pos"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("a sliding sync response without pos: {response}"))
}

fn count_of(response: &Value) -> u64 {
    response["lists"]["all_rooms"]["count"]
        .as_u64()
        .unwrap_or_default()
}

pub async fn sliding_sync(bench: &Bench, rooms: usize) -> Result<Value, Failure> {
    let mut users = bench.users("ss", 2).await?;
    let (user, other) = (users.remove(0), users.remove(0));
    let mut room_ids = Vec::with_capacity(rooms);
    for chunk in (0..rooms).collect::<Vec<_>>().chunks(4) {
        let batch = chunk.iter().map(|n| {
            user.create_room(json!({ "preset": "public_chat", "name": format!("bench room {n}") }))
        });
        for room in futures_util::future::join_all(batch).await {
            room_ids.push(room?);
        }
    }
    // The other user is in a few rooms, to change them.
    let active = &room_ids[..room_ids.len().min(20)];
    for room in active {
        other.join(room).await?;
    }
    bench.analyze().await;
    let mut results = Map::new();
    let connection = |name: &str| format!("{}{name}", bench.prefix);

    let mut first = Samples::default();
    for i in 0..5 {
        let t = Instant::now();
        let response = user
            .sliding_sync(
                None,
                Duration::ZERO,
                &room_list(&connection(&format!("first{i}")), 19),
            )
            .await?;
        first.push(t.elapsed());
        if count_of(&response) < rooms as u64 {
            return Err(format!(
                "the list counts {} rooms of {rooms}",
                count_of(&response)
            ));
        }
    }
    results.insert("first_window_of_20".into(), first.summary());

    // One connection whose window grows 100 rooms at a time, as a room list scrolls.
    let conn = connection("growing");
    let mut pos = pos_of(
        &user
            .sliding_sync(None, Duration::ZERO, &room_list(&conn, 19))
            .await?,
    )?;
    let mut steps = Samples::default();
    let mut step_ms = Vec::new();
    let mut last = 99;
    while last < rooms + 99 {
        let t = Instant::now();
        let response = user
            .sliding_sync(
                Some(&pos),
                Duration::ZERO,
                &room_list(&conn, last.min(rooms - 1)),
            )
            .await?;
        let elapsed = t.elapsed();
        steps.push(elapsed);
        step_ms.push(crate::stats::round(elapsed.as_secs_f64() * 1000.0));
        pos = pos_of(&response)?;
        last += 100;
    }
    let mut growing = steps.summary();
    growing["steps_ms"] = json!(step_ms);
    results.insert("growing_by_100".into(), growing);

    let mut whole = Samples::default();
    for i in 0..3 {
        let t = Instant::now();
        user.sliding_sync(
            None,
            Duration::ZERO,
            &room_list(&connection(&format!("whole{i}")), rooms - 1),
        )
        .await?;
        whole.push(t.elapsed());
    }
    results.insert("whole_list".into(), whole.summary());

    let full = room_list(&conn, rooms - 1);
    let mut nothing = Samples::default();
    for _ in 0..20 {
        let t = Instant::now();
        let response = user.sliding_sync(Some(&pos), Duration::ZERO, &full).await?;
        nothing.push(t.elapsed());
        pos = pos_of(&response)?;
    }
    results.insert("incremental_nothing_changed".into(), nothing.summary());

    let mut one = Samples::default();
    for i in 0..20 {
        let room = &active[i % active.len()];
        other.send(room, &format!("ss{i}"), "news").await?;
        let t = Instant::now();
        let response = user.sliding_sync(Some(&pos), Duration::ZERO, &full).await?;
        one.push(t.elapsed());
        if response["rooms"].get(room.as_str()).is_none() {
            return Err(format!(
                "the changed room {room} is not in the response: {response}"
            ));
        }
        pos = pos_of(&response)?;
    }
    results.insert("incremental_one_room_changed".into(), one.summary());

    // Wake-up: from the sender's answer to the parked request's; delivery: from the start of
    // the send.
    let (mut wake, mut delivery) = (Samples::default(), Samples::default());
    for i in 0..20 {
        let room = active[i % active.len()].clone();
        let poller = {
            let user: User = user.clone();
            let (pos, full) = (pos.clone(), full.clone());
            tokio::spawn(async move {
                let response = user
                    .sliding_sync(Some(&pos), Duration::from_secs(30), &full)
                    .await;
                (response, Instant::now())
            })
        };
        // Parked before the message is sent.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let sent = Instant::now();
        other.send(&room, &format!("wake{i}"), "wake up").await?;
        let answered = Instant::now();
        let (response, arrived) = poller.await.map_err(|e| e.to_string())?;
        let response = response?;
        if response["rooms"].get(room.as_str()).is_none() {
            return Err(format!(
                "the long-poll woke without room {room}: {response}"
            ));
        }
        wake.push(arrived.saturating_duration_since(answered));
        delivery.push(arrived.duration_since(sent));
        pos = pos_of(&response)?;
    }
    results.insert("long_poll_wake_up".into(), wake.summary());
    results.insert("long_poll_delivery".into(), delivery.summary());
    results.insert("rooms".into(), json!(rooms));
    Ok(Value::Object(results))
}
