//! Scenarios 5, 6 and 16: initial and incremental `/sync` for a user in many rooms, paging
//! back through a room's history, and the syncs of a member far behind.

use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use crate::{
    client::{self, next_batch, Failure},
    stats::Samples,
    Bench, Counts,
};

/// Scenario 5: initial sync for a user in many rooms (lazy-loaded members and full member
/// state), then an incremental sync with one room changed.
pub(crate) async fn syncs(bench: &Bench, counts: &Counts) -> Result<Value, Failure> {
    let mut members = bench.users("mem", counts.sync_members).await?;
    let syncer = members.remove(0);
    let mut rooms = Vec::new();
    for r in 0..counts.sync_rooms {
        let room = syncer
            .create_room(json!({ "preset": "public_chat" }))
            .await?;
        for member in &members {
            member.join(&room).await?;
        }
        for m in 0..counts.sync_messages {
            let author = &members[m % members.len().max(1)];
            author
                .send(&room, &format!("r{r}m{m}"), &format!("history {m}"))
                .await?;
        }
        rooms.push(room);
    }
    bench.analyze().await;
    // Each initial sync is a new client's first one.
    let filter = |lazy: bool, nonce: &str| client::first_sync_filter(10, lazy, nonce);
    let lazy = filter(true, "incremental");
    let mut results = Map::new();
    for (name, lazy_members) in [("initial_lazy", true), ("initial_full_members", false)] {
        let mut samples = Samples::default();
        for i in 0..3 {
            let filter = filter(lazy_members, &format!("{}{name}{i}", bench.prefix));
            let t = Instant::now();
            let sync = syncer.sync(None, Duration::ZERO, Some(&filter)).await?;
            samples.push(t.elapsed());
            let joined = sync["rooms"]["join"].as_object().map_or(0, Map::len);
            if joined < rooms.len() {
                return Err(format!("{name}: {joined} rooms synced of {}", rooms.len()));
            }
        }
        results.insert(name.into(), samples.summary());
    }
    let mut since = next_batch(&syncer.sync(None, Duration::ZERO, Some(&lazy)).await?);
    let mut samples = Samples::default();
    for i in 0..20 {
        members[0]
            .send(&rooms[i % rooms.len()], &format!("inc{i}"), "news")
            .await?;
        let t = Instant::now();
        let sync = syncer
            .sync(Some(&since), Duration::ZERO, Some(&lazy))
            .await?;
        samples.push(t.elapsed());
        since = next_batch(&sync);
    }
    results.insert("incremental_one_room_changed".into(), samples.summary());
    results.insert(
        "rooms".into(),
        json!({ "rooms": counts.sync_rooms, "messages_per_room": counts.sync_messages, "members_per_room": counts.sync_members }),
    );
    Ok(Value::Object(results))
}

/// Scenario 16: a member far behind. Another member sends `behind` messages the member never
/// reads; then, `syncs` times, one more message and the member's incremental sync, timed, its
/// room's notification count checked. What a sync costs a member with that much unread in one
/// room (a public room's lurker, a user back from a holiday).
pub(crate) async fn far_behind(
    bench: &Bench,
    behind: usize,
    syncs: usize,
) -> Result<Value, Failure> {
    let mut users = bench.users("behind", 2).await?;
    let (member, sender) = (users.remove(0), users.remove(0));
    let room = sender
        .create_room(json!({ "preset": "public_chat" }))
        .await?;
    member.join(&room).await?;
    for m in 0..behind {
        sender
            .send(&room, &format!("b{m}"), &format!("unread {m}"))
            .await?;
    }
    bench.analyze().await;
    let filter = client::first_sync_filter(1, true, &format!("{}behind", bench.prefix));
    let mut since = next_batch(&member.sync(None, Duration::ZERO, Some(&filter)).await?);
    let mut samples = Samples::default();
    for i in 0..syncs {
        sender.send(&room, &format!("n{i}"), "news").await?;
        let t = Instant::now();
        let sync = member
            .sync(Some(&since), Duration::ZERO, Some(&filter))
            .await?;
        samples.push(t.elapsed());
        let unread = &sync["rooms"]["join"][&room]["unread_notifications"]["notification_count"];
        if unread.as_u64() != Some((behind + i + 1) as u64) {
            return Err(format!(
                "far behind: {unread} notifications, {} expected",
                behind + i + 1
            ));
        }
        since = next_batch(&sync);
    }
    let mut summary = samples.summary();
    summary["behind"] = json!(behind);
    Ok(summary)
}

/// Scenario 6: paging back through a room's history 100 events at a time.
pub(crate) async fn history(bench: &Bench, n: usize) -> Result<Value, Failure> {
    let user = bench.users("hist", 1).await?.remove(0);
    let room = user
        .create_room(json!({ "preset": "private_chat" }))
        .await?;
    for i in 0..n {
        user.send(&room, &format!("h{i}"), &format!("old {i}"))
            .await?;
    }
    bench.analyze().await;
    let mut samples = Samples::default();
    let mut from: Option<String> = None;
    let mut total = 0;
    loop {
        let t = Instant::now();
        let page = user.messages(&room, from.as_deref(), 100).await?;
        samples.push(t.elapsed());
        total += page["chunk"].as_array().map_or(0, Vec::len);
        match page["end"].as_str() {
            Some(end) if total < n + 10 => from = Some(end.to_owned()),
            _ => break,
        }
    }
    let mut summary = samples.summary();
    summary["events_paged"] = json!(total);
    Ok(summary)
}
