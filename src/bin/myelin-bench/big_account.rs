//! Scenario 13: a big account's initial sync, the shape of the published benchmark: one user
//! in 300 rooms of 300 members each (at full scale), every room ending with a message from
//! another member. The account's initial sync with timeline limit 1 is measured twice over:
//! with lazy-loaded members (Element's way) and with every member's state event. Each answer
//! is checked for every room, its last message and the members it must carry; the server's
//! peak memory during each kind of sync is read from `/proc` (its high-water mark reset
//! first), with `--pid`.
//!
//! The members are an application service's users (`--appservice-token`), registered without
//! a password, from a pool of ten times a room's size, so rooms share some members but not
//! all, as a real account's rooms do. The joins go through the API and are reported as
//! set-up. Without a token the scenario says it was skipped.
//!
//! A server whose API would take hours for the set-up measures one made elsewhere
//! (`saved.rs`): the saved set-up is the account and each room's last message.

use std::{collections::HashMap, time::Instant};

use futures_util::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::{
    client::{first_sync_filter, sync_path, Failure, User},
    rss_kib,
    saved::{SetUpFiles, LOADED},
    stats::{round, Samples},
    Bench, SET_UP_IN_FLIGHT,
};

/// Samples of the lazy-members initial sync; the full-members one is slower and takes fewer.
const LAZY_SAMPLES: usize = 5;
const FULL_SAMPLES: usize = 3;

/// What the set-up made and the checks expect of every sync.
#[derive(Serialize, Deserialize)]
struct SetUp {
    /// The account whose syncs are measured (an application service's user).
    account: String,
    members_per_room: usize,
    /// Each room with its last message and that message's sender.
    rooms: Vec<RoomEnd>,
    /// How it was set up, for the report.
    report: Value,
}

#[derive(Serialize, Deserialize)]
struct RoomEnd {
    room_id: String,
    last_event: String,
    sender: String,
}

pub async fn big_account(
    bench: &Bench,
    appservice_token: Option<&str>,
    rooms: usize,
    members_per_room: usize,
    pid: Option<u32>,
    files: SetUpFiles<'_>,
) -> Result<Value, Failure> {
    let Some(as_token) = appservice_token else {
        return Ok(json!({ "skipped": "needs --appservice-token to register the members" }));
    };
    let set_up = match files.load::<SetUp>()? {
        Some(mut set_up) => {
            set_up.report = json!({
                "rooms": set_up.rooms.len(),
                "members_per_room": set_up.members_per_room,
                "how": LOADED,
            });
            set_up
        }
        None => set_up_through_api(bench, as_token, rooms, members_per_room).await?,
    };
    files.store(&set_up)?;
    bench.analyze().await;
    let account = User::acting_as(&bench.http, &bench.url, as_token, &set_up.account);
    let mut report = measure(bench, &account, &set_up, pid).await?;
    report.insert("set_up".into(), set_up.report);
    Ok(Value::Object(report))
}

/// The account, its rooms, their members and last messages, through the client API.
async fn set_up_through_api(
    bench: &Bench,
    as_token: &str,
    rooms: usize,
    members_per_room: usize,
) -> Result<SetUp, Failure> {
    let others = members_per_room.saturating_sub(1).max(1);
    let pool = others * 10;
    let started = Instant::now();
    let mut users = bench.appservice_users(as_token, "a", pool + 1).await?;
    let account = users.remove(0);
    let room_ids: Vec<String> = futures_util::stream::iter(0..rooms)
        .map(|r| {
            account.create_room(json!({ "preset": "public_chat", "name": format!("room {r}") }))
        })
        .buffered(SET_UP_IN_FLIGHT)
        .try_collect()
        .await?;
    // Room r's members are `others` consecutive users of the pool from r * 97. Joins go
    // round the rooms, so those in flight are in different rooms.
    let member = |r: usize, j: usize| &users[(r * 97 + j) % pool];
    let joins: Vec<(usize, usize)> = (0..others)
        .flat_map(|j| (0..rooms).map(move |r| (r, j)))
        .collect();
    futures_util::stream::iter(&joins)
        .map(|&(r, j)| member(r, j).join(&room_ids[r]))
        .buffer_unordered(SET_UP_IN_FLIGHT)
        .try_collect::<()>()
        .await?;
    // Each room's last event: a message from a member, whose member event a lazy-loading
    // sync must then carry.
    let room_ids = &room_ids;
    let ends: Vec<RoomEnd> = futures_util::stream::iter(0..rooms)
        .map(|r| async move {
            let sender = member(r, r % others);
            let last_event = sender
                .send(&room_ids[r], &format!("last{r}"), &format!("last {r}"))
                .await?;
            let sender_id = sender
                .appservice_user_id()
                .ok_or("the account's members act through the application service")?;
            Ok::<_, Failure>(RoomEnd {
                room_id: room_ids[r].clone(),
                last_event,
                sender: sender_id.to_owned(),
            })
        })
        .buffered(SET_UP_IN_FLIGHT)
        .try_collect()
        .await?;
    let account = account
        .appservice_user_id()
        .ok_or("the account acts through the application service")?
        .to_owned();
    Ok(SetUp {
        account,
        members_per_room,
        rooms: ends,
        report: json!({
            "rooms": rooms,
            "members_per_room": members_per_room,
            "joins": joins.len(),
            "seconds": round(started.elapsed().as_secs_f64()),
            "how": "registration through the application service, rooms, joins and messages through the client API",
        }),
    })
}

/// The account's initial syncs, lazy-loaded members then every member, each answer checked.
async fn measure(
    bench: &Bench,
    account: &User,
    set_up: &SetUp,
    pid: Option<u32>,
) -> Result<Map<String, Value>, Failure> {
    let expected: HashMap<&str, (&str, &str)> = set_up
        .rooms
        .iter()
        .map(|end| {
            let ends = (end.last_event.as_str(), end.sender.as_str());
            (end.room_id.as_str(), ends)
        })
        .collect();
    let mut report = Map::new();
    for (name, lazy, samples) in [
        ("initial_sync_lazy", true, LAZY_SAMPLES),
        ("initial_sync_full_members", false, FULL_SAMPLES),
    ] {
        reset_peak_rss(pid);
        let mut times = Samples::default();
        let mut bytes = 0;
        for i in 0..samples {
            let filter = first_sync_filter(1, lazy, &format!("{}{name}{i}", bench.prefix));
            let (sync, elapsed) = account
                .get_timed(&sync_path(None, std::time::Duration::ZERO, Some(&filter)))
                .await?;
            times.push(elapsed);
            bytes = sync.to_string().len();
            check_sync(&sync, &expected, (!lazy).then_some(set_up.members_per_room))
                .map_err(|e| format!("{name}: {e}"))?;
        }
        let mut summary = times.summary();
        summary["response_bytes"] = json!(bytes);
        summary["peak_rss_mib"] = json!(rss_kib(pid, "VmHWM:").map(|k| round(k as f64 / 1024.0)));
        report.insert(name.into(), summary);
    }
    Ok(report)
}

/// Every room is there, ends with its last message and carries that message's sender's member
/// event; with `all_members`, every room carries that many joined members' events.
fn check_sync(
    sync: &Value,
    expected: &HashMap<&str, (&str, &str)>,
    all_members: Option<usize>,
) -> Result<(), Failure> {
    let joined = sync["rooms"]["join"].as_object();
    let synced = joined.map_or(0, Map::len);
    if synced != expected.len() {
        return Err(format!("{synced} rooms synced of {}", expected.len()));
    }
    for (room_id, (last_event, sender)) in expected {
        let room = &sync["rooms"]["join"][*room_id];
        let timeline = room["timeline"]["events"].as_array();
        let last = timeline.and_then(|events| events.last());
        if last.map(|e| &e["event_id"]) != Some(&json!(last_event)) {
            return Err(format!("{room_id} does not end with its last message"));
        }
        let member_events: Vec<&Value> = ["state", "timeline"]
            .iter()
            .flat_map(|part| room[*part]["events"].as_array().into_iter().flatten())
            .filter(|e| e["type"] == "m.room.member")
            .collect();
        if !member_events.iter().any(|e| e["state_key"] == *sender) {
            return Err(format!("{room_id} lacks its last sender's member event"));
        }
        if let Some(wanted) = all_members {
            let joined = member_events
                .iter()
                .filter(|e| e["content"]["membership"] == "join")
                .count();
            if joined != wanted {
                return Err(format!(
                    "{room_id} carries {joined} joined members of {wanted}"
                ));
            }
        }
    }
    Ok(())
}

/// Resets the server's peak resident memory (`VmHWM`) to its current size, so the next read
/// is the peak since now (Linux: `clear_refs` with 5). Needs the right to write the process's
/// `/proc` files.
fn reset_peak_rss(pid: Option<u32>) {
    if let Some(pid) = pid {
        if let Err(err) = std::fs::write(format!("/proc/{pid}/clear_refs"), "5") {
            eprintln!("myelin-bench: cannot reset the server's peak memory: {err}");
        }
    }
}
