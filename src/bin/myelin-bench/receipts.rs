//! Scenario 15: read markers as Element sends them while its user reads (`/read_markers` with
//! the fully-read marker and a public read receipt at the same event): one reader marking each
//! message in turn, then many members of the room at once. The most frequent write a client
//! makes after its messages; every reader's last marker and receipt is then checked.

use std::time::Instant;

use futures_util::future::try_join_all;
use serde_json::{json, Value};

use crate::{
    client::{enc, Failure, User},
    stats::{round, Samples},
    Bench,
};

/// Scenario 15: `sequential` markers by one reader, then `readers` readers marking `each`
/// messages each, all at once. Fails if any reader's last receipt or fully-read marker is not
/// where it ended.
pub(crate) async fn read_markers(
    bench: &Bench,
    sequential: usize,
    readers: usize,
    each: usize,
) -> Result<Value, Failure> {
    let mut users = bench.users("rcpt", readers + 2).await?;
    let sender = users.remove(0);
    let room = sender
        .create_room(json!({ "preset": "public_chat" }))
        .await?;
    for user in &users {
        user.join(&room).await?;
    }
    let mut events = Vec::with_capacity(sequential.max(each));
    for i in 0..sequential.max(each) {
        events.push(
            sender
                .send(&room, &format!("r{i}"), &format!("read me {i}"))
                .await?,
        );
    }
    bench.analyze().await;

    let lone = &users[0];
    let mut samples = Samples::default();
    let started = Instant::now();
    for event in &events[..sequential] {
        let t = Instant::now();
        mark_read(lone, &room, event).await?;
        samples.push(t.elapsed());
    }
    let mut sequential_report = samples.summary();
    sequential_report["markers_per_s"] =
        json!(round(sequential as f64 / started.elapsed().as_secs_f64()));

    let together = &users[1..];
    let started = Instant::now();
    let timings = try_join_all(together.iter().map(|reader| async {
        let mut samples = Samples::default();
        for event in &events[..each] {
            let t = Instant::now();
            mark_read(reader, &room, event).await?;
            samples.push(t.elapsed());
        }
        Ok::<_, Failure>(samples)
    }))
    .await?;
    let elapsed = started.elapsed();
    let mut samples = Samples::default();
    for reader in timings {
        samples.0.extend(reader.0);
    }
    let mut concurrent_report = samples.summary();
    concurrent_report["markers_per_s"] =
        json!(round((readers * each) as f64 / elapsed.as_secs_f64()));

    let mut expected = vec![(lone, &events[sequential - 1])];
    expected.extend(together.iter().map(|reader| (reader, &events[each - 1])));
    check_where_each_ended(&sender, &room, &expected).await?;
    Ok(json!({
        "sequential": sequential_report,
        "concurrent": concurrent_report,
        "readers": readers,
        "markers_each": each,
    }))
}

/// `POST /rooms/{room}/read_markers`: the fully-read marker and the public receipt at `event`.
async fn mark_read(reader: &User, room: &str, event: &str) -> Result<(), Failure> {
    let path = format!("/_matrix/client/v3/rooms/{}/read_markers", enc(room));
    reader
        .post(&path, &json!({ "m.fully_read": event, "m.read": event }))
        .await
        .map(drop)
}

/// Checks, for each (reader, event), that the room's public receipts as `observer`'s initial
/// sync shows them, and the reader's own fully-read marker, point at the event.
async fn check_where_each_ended(
    observer: &User,
    room: &str,
    expected: &[(&User, &String)],
) -> Result<(), Failure> {
    let filter = json!({ "room": { "rooms": [room], "timeline": { "limit": 1 } } }).to_string();
    let sync = observer
        .get(&format!("/_matrix/client/v3/sync?filter={}", enc(&filter)))
        .await?;
    let ephemeral = &sync["rooms"]["join"][room]["ephemeral"]["events"];
    let mut read = std::collections::HashMap::new();
    for receipt in ephemeral.as_array().into_iter().flatten() {
        if receipt["type"] != "m.receipt" {
            continue;
        }
        for (event, types) in receipt["content"].as_object().into_iter().flatten() {
            for user in types["m.read"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(u, _)| u)
            {
                read.insert(user.clone(), event.clone());
            }
        }
    }
    for (reader, event) in expected {
        let user_id = reader.get("/_matrix/client/v3/account/whoami").await?["user_id"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if read.get(&user_id) != Some(*event) {
            return Err(format!(
                "{user_id}'s receipt is at {:?}, not at its last marked event {event}",
                read.get(&user_id)
            ));
        }
        let marker = reader
            .get(&format!(
                "/_matrix/client/v3/user/{}/rooms/{}/account_data/m.fully_read",
                enc(&user_id),
                enc(room)
            ))
            .await?;
        if marker["event_id"].as_str() != Some(event.as_str()) {
            return Err(format!(
                "{user_id}'s fully-read marker is {marker}, not its last marked event {event}"
            ));
        }
    }
    Ok(())
}
