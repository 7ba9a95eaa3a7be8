//! Scenarios 1, 2 and 4: one user's messages one after another, and many senders at once with
//! every message checked by long-polling receivers (lost, duplicated or reordered).

use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

use serde_json::{json, Value};

use crate::{
    client::{next_batch, timeline_events, Failure, User},
    stats::{round, Samples},
    Bench, Counts,
};

/// Scenario 1: one user sends messages one after another.
pub(crate) async fn sequential_sends(bench: &Bench, n: usize) -> Result<Value, Failure> {
    let user = bench.users("seq", 1).await?.remove(0);
    let room = user
        .create_room(json!({ "preset": "private_chat" }))
        .await?;
    let mut samples = Samples::default();
    let started = Instant::now();
    for i in 0..n {
        let t = Instant::now();
        user.send(&room, &format!("s{i}"), &format!("message {i}"))
            .await?;
        samples.push(t.elapsed());
    }
    let mut summary = samples.summary();
    summary["messages_per_s"] = json!(round(n as f64 / started.elapsed().as_secs_f64()));
    Ok(summary)
}

/// A receiver's view of the rooms it follows: event IDs per room, in the order received,
/// with gaps (a `limited` timeline) filled from `/messages`; and how many of them its first
/// sync had.
async fn follow(
    receiver: User,
    expected: usize,
    deadline: Instant,
) -> Result<(HashMap<String, Vec<String>>, usize), Failure> {
    let filter = json!({ "room": { "timeline": { "limit": 100 } } }).to_string();
    let mut sync = receiver.sync(None, Duration::ZERO, Some(&filter)).await?;
    let mut seen: HashMap<String, Vec<String>> = HashMap::new();
    // The first sync's timelines count too: under load it may answer after the first sends.
    add_loaded_events(&mut seen, &sync);
    let in_first_sync = seen.values().map(Vec::len).sum();
    let mut since = next_batch(&sync);
    while seen.values().map(Vec::len).sum::<usize>() < expected && Instant::now() < deadline {
        sync = receiver
            .sync(Some(&since), Duration::from_secs(5), Some(&filter))
            .await?;
        since = next_batch(&sync);
        for (room_id, room) in sync["rooms"]["join"].as_object().into_iter().flatten() {
            let events = seen.entry(room_id.clone()).or_default();
            if room["timeline"]["limited"] == true {
                let gap = fill_gap(&receiver, room_id, room, events.last().cloned()).await?;
                events.extend(gap);
            }
        }
        add_loaded_events(&mut seen, &sync);
    }
    Ok((seen, in_first_sync))
}

/// Appends a sync response's load messages to what a receiver has seen, per room.
fn add_loaded_events(seen: &mut HashMap<String, Vec<String>>, sync: &Value) {
    for (room_id, event_id, body) in timeline_events(sync) {
        if body.starts_with("load ") {
            seen.entry(room_id).or_default().push(event_id);
        }
    }
}

/// The events between the last one seen and a limited timeline's start, oldest first.
async fn fill_gap(
    receiver: &User,
    room_id: &str,
    room: &Value,
    last_seen: Option<String>,
) -> Result<Vec<String>, Failure> {
    match room["timeline"]["prev_batch"].as_str() {
        Some(token) => loaded_events_back_to(receiver, room_id, Some(token), last_seen).await,
        None => Ok(Vec::new()),
    }
}

/// The benchmark's load messages of a room from `from` (the room's end when `None`) back to
/// `last_seen` (the room's start when `None`), oldest first.
async fn loaded_events_back_to(
    reader: &User,
    room_id: &str,
    from: Option<&str>,
    last_seen: Option<String>,
) -> Result<Vec<String>, Failure> {
    let mut from = from.map(str::to_owned);
    let mut events = Vec::new();
    'paging: loop {
        let page = reader.messages(room_id, from.as_deref(), 100).await?;
        for event in page["chunk"].as_array().into_iter().flatten() {
            let id = event["event_id"].as_str().unwrap_or_default().to_owned();
            if Some(&id) == last_seen.as_ref() {
                break 'paging;
            }
            if event["type"] == "m.room.message"
                && event["content"]["body"]
                    .as_str()
                    .is_some_and(|b| b.starts_with("load "))
            {
                events.push(id);
            }
        }
        match page["end"].as_str() {
            Some(end) => from = Some(end.to_owned()),
            None => break,
        }
    }
    events.reverse();
    Ok(events)
}

/// Scenarios 2 and 4: users send concurrently, each into their own room, while receivers in
/// every room check that every message arrives exactly once, in one order for all. With no
/// receivers (sends alone, nothing woken), each sender reads its room's history back instead.
pub(crate) async fn concurrent_sends(
    bench: &Bench,
    counts: &Counts,
) -> Result<(Value, Value, bool), Failure> {
    // Over a scale-out's processes: sender i on process i, receiver j on process j + 1.
    let senders = bench
        .users_on_processes("conc", counts.concurrent_users, 0)
        .await?;
    let receivers = bench
        .users_on_processes("recv", counts.receivers, 1)
        .await?;
    let mut rooms = Vec::new();
    for sender in &senders {
        let room = sender
            .create_room(json!({ "preset": "public_chat" }))
            .await?;
        for receiver in &receivers {
            receiver.join(&room).await?;
        }
        rooms.push(room);
    }
    bench.analyze().await;
    let expected = counts.concurrent_users * counts.concurrent_messages;
    // Generous enough for a server sending 5 messages a second: receivers stop early once
    // everything arrived, so only a slow server waits this long (a 20/s allowance cut
    // Synapse's receivers off before its last sends at 12.6 msg/s).
    let deadline = Instant::now() + Duration::from_secs(120 + expected as u64 / 5);
    let followers: Vec<_> = receivers
        .iter()
        .cloned()
        .map(|r| tokio::spawn(follow(r, expected, deadline)))
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;

    let started = Instant::now();
    let sends = senders.iter().zip(&rooms).map(|(sender, room)| {
        let (sender, room) = (sender.clone(), room.clone());
        let n = counts.concurrent_messages;
        tokio::spawn(async move {
            let mut samples = Samples::default();
            let mut ids = Vec::new();
            for i in 0..n {
                let t = Instant::now();
                ids.push(
                    sender
                        .send(&room, &format!("c{i}"), &format!("load {i}"))
                        .await?,
                );
                samples.push(t.elapsed());
            }
            Ok::<_, Failure>((room, ids, samples))
        })
    });
    let mut samples = Samples::default();
    let mut sent: HashMap<String, Vec<String>> = HashMap::new();
    for result in futures_util::future::join_all(sends).await {
        let (room, ids, part) = result.map_err(|e| e.to_string())??;
        samples.0.extend(part.0);
        sent.insert(room, ids);
    }
    let elapsed = started.elapsed();
    let mut send_summary = samples.summary();
    send_summary["messages_per_s"] = json!(round(expected as f64 / elapsed.as_secs_f64()));

    // Who read what: each receiver's deliveries, or the rooms' histories read back.
    let mut readings = Vec::new();
    let mut in_first_syncs = 0;
    for (j, follower) in followers.into_iter().enumerate() {
        let (seen, in_first_sync) = follower.await.map_err(|e| e.to_string())??;
        in_first_syncs += in_first_sync;
        readings.push((format!("receiver {j}"), seen));
    }
    if receivers.is_empty() {
        let mut history = HashMap::new();
        for (sender, room) in senders.iter().zip(&rooms) {
            history.insert(
                room.clone(),
                loaded_events_back_to(sender, room, None, None).await?,
            );
        }
        readings.push(("the rooms' histories".to_owned(), history));
    }
    let mut delivered_ok = 0usize;
    let mut problems = Vec::new();
    for (reader, seen) in readings {
        for (room, ids) in &sent {
            let got = seen.get(room).cloned().unwrap_or_default();
            let unique: HashSet<&String> = got.iter().collect();
            if got == *ids {
                delivered_ok += ids.len();
            } else {
                delivered_ok += ids.iter().filter(|id| unique.contains(id)).count();
                let missing: Vec<String> = ids
                    .iter()
                    .enumerate()
                    .filter(|(_, id)| !unique.contains(id))
                    .map(|(n, id)| format!("message {n} {id}"))
                    .collect();
                problems.push(format!(
                    "{reader} in {room}: sent {}, received {} ({} distinct), same order: {}, \
                     missing: {}",
                    ids.len(),
                    got.len(),
                    unique.len(),
                    got == *ids,
                    missing.join(", ")
                ));
            }
        }
    }
    let total = expected * counts.receivers.max(1);
    let complete = problems.is_empty();
    let completeness = json!({
        "receivers": counts.receivers,
        "expected_deliveries": total,
        "correct_deliveries": delivered_ok,
        "delivered_by_first_syncs": in_first_syncs,
        "completeness_percent": round(100.0 * delivered_ok as f64 / total.max(1) as f64),
        "problems": problems,
    });
    Ok((send_summary, completeness, complete))
}
