//! `myelin-bench`: load and latency measurements that speak only the Client-Server API, so the
//! same run works against Myelin, Synapse or any homeserver with open registration.
//!
//! Scenarios (counts by `--scale`): sequential sends, concurrent sends with completeness
//! checked by receivers, end-to-end delivery to a long-polling receiver, initial and
//! incremental sync, history paging, fan-out to many long-pollers, the server's footprint, and
//! simplified sliding sync for a user in many rooms, many idle long-polling connections, a
//! room with a long history (loaded through SQL, so Myelin only, with `--database-url`), and
//! a room with many members and an account in many rooms (an application service's users, with
//! `--appservice-token`).
//! Writes a JSON report and a table; exits non-zero when any message was lost, duplicated or
//! reordered.

mod big_account;
mod big_room;
mod client;
mod copies;
mod long_history;
mod parked;
mod saved;
mod sliding;
mod start_up;
mod stats;

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    process::ExitCode,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use clap::{Parser, ValueEnum};
use client::{next_batch, register, timeline_events, Failure, User};
use futures_util::{StreamExt, TryStreamExt};
use serde_json::{json, Map, Value};
use stats::{cdf_svg, round, Samples};

#[derive(Clone, Copy, ValueEnum)]
enum Scale {
    /// Small counts for CI: checks the tool and the server work, measures little.
    Smoke,
    /// The counts the benchmark issue specifies.
    Full,
}

/// Measure a homeserver from the outside.
#[derive(Parser)]
#[command(name = "myelin-bench")]
struct Cli {
    /// Base URL of the homeserver.
    #[arg(long, default_value = "http://127.0.0.1:8008")]
    url: String,
    /// Its server name (for reporting).
    #[arg(long, default_value = "localhost")]
    server_name: String,
    /// How big a run.
    #[arg(long, value_enum, default_value = "smoke")]
    scale: Scale,
    /// The server's process ID, to read its memory from /proc.
    #[arg(long)]
    pid: Option<u32>,
    /// The server's database, to measure its growth.
    #[arg(long)]
    database_url: Option<String>,
    /// Where to write the JSON report.
    #[arg(long, default_value = "bench.json")]
    out: PathBuf,
    /// Where to write the delivery-latency plot (SVG).
    #[arg(long, default_value = "bench-delivery.svg")]
    plot: PathBuf,
    /// A label for this run (e.g. the server's name).
    #[arg(long, default_value = "server")]
    label: String,
    /// Run only these scenarios (comma-separated: send, concurrent, delivery, sync, history,
    /// fanout, sliding, parked, long_history, big_room, big_account, start_up), for profiling one of them; the
    /// default runs all.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Leave planner statistics as the server keeps them: no `VACUUM ANALYZE` after each
    /// scenario's set-up (what a server just filled sees, before any autovacuum).
    #[arg(long)]
    no_analyze: bool,
    /// The `as_token` of an application service whose users namespace (non-exclusive) holds
    /// `@{prefix}{tag}big{n}` (`tests/bench/bench-registration.sh`): scenarios 11 to 14
    /// register their users through it.
    #[arg(long)]
    appservice_token: Option<String>,
    /// Other processes of the same server (a scale-out on one database), comma-separated:
    /// scenarios 2 to 4 spread their senders and receivers over these and `--url`, and 3, 4
    /// and 10 deliver each message through another process than the one that wrote it.
    #[arg(long, value_delimiter = ',')]
    process_urls: Vec<String>,
    /// Scenario 2's long-polling receivers, instead of the scale's count; 0 measures the
    /// concurrent sends alone, with no sync woken by them.
    #[arg(long)]
    receivers: Option<usize>,
    /// Scenario 13's members per room, instead of the scale's count: a smaller shape for a
    /// server whose set-up through the API would take hours at full scale.
    #[arg(long)]
    big_account_members: Option<usize>,
    /// Scenario 11, 12 or 13 (the one `--only` names): write what its set-up made to this
    /// file, for another server loaded with the same data.
    #[arg(long, alias = "big-account-save")]
    set_up_save: Option<PathBuf>,
    /// Scenario 11, 12 or 13 (the one `--only` names): measure a server that already holds the
    /// set-up saved in this file (with `--set-up-save`), instead of setting one up through the
    /// API.
    #[arg(long, alias = "big-account-from")]
    set_up_from: Option<PathBuf>,
    /// Scenario 12's members, instead of the scale's count: a smaller room for a server whose
    /// joins through the API would take hours at full scale.
    #[arg(long)]
    big_room_members: Option<usize>,
    /// Scenario 12's long-polling members, instead of the scale's count.
    #[arg(long)]
    big_room_pollers: Option<usize>,
    /// Scenario 14: a shell command that stops the server, starts it again in the background
    /// and prints the new process's ID (run with `sh -c` after the big database is loaded).
    #[arg(long)]
    restart_command: Option<String>,
}

struct Counts {
    sequential: usize,
    concurrent_users: usize,
    concurrent_messages: usize,
    receivers: usize,
    delivery: usize,
    sync_rooms: usize,
    sync_messages: usize,
    sync_members: usize,
    history: usize,
    fanout_members: usize,
    fanout_pollers: usize,
    sliding_rooms: usize,
    parked_connections: usize,
    parked_users: usize,
    /// Events in the room of scenario 11.
    long_history: usize,
    /// Members of the room of scenario 12, and how many of them long-poll.
    big_room_members: usize,
    big_room_pollers: usize,
    /// Rooms of scenario 13's account, and members in each.
    big_account_rooms: usize,
    big_account_members: usize,
    /// Rooms and events of scenario 14's database.
    start_up_rooms: usize,
    start_up_events: usize,
}

impl Counts {
    fn of(scale: Scale) -> Counts {
        match scale {
            Scale::Smoke => Counts {
                sequential: 50,
                concurrent_users: 5,
                concurrent_messages: 10,
                receivers: 3,
                delivery: 20,
                sync_rooms: 5,
                sync_messages: 5,
                sync_members: 3,
                history: 300,
                fanout_members: 20,
                fanout_pollers: 5,
                sliding_rooms: 30,
                parked_connections: 50,
                parked_users: 5,
                long_history: 2_000,
                big_room_members: 100,
                big_room_pollers: 20,
                big_account_rooms: 4,
                big_account_members: 5,
                start_up_rooms: 20,
                start_up_events: 200,
            },
            Scale::Full => Counts {
                sequential: 1000,
                concurrent_users: 50,
                concurrent_messages: 100,
                receivers: 10,
                delivery: 500,
                sync_rooms: 500,
                sync_messages: 20,
                sync_members: 20,
                history: 5000,
                fanout_members: 2000,
                fanout_pollers: 200,
                sliding_rooms: 1000,
                parked_connections: 10_000,
                parked_users: 100,
                long_history: 1_000_000,
                big_room_members: 20_000,
                big_room_pollers: 1_000,
                big_account_rooms: 300,
                big_account_members: 300,
                start_up_rooms: 100_000,
                start_up_events: 10_000_000,
            },
        }
    }
}

/// Requests in flight while a big scenario is set up through the API (registrations, rooms,
/// joins): enough to keep a 2-core server busy without a queue of waiting requests.
const SET_UP_IN_FLIGHT: usize = 8;

/// Shared run state: the HTTP client, a unique prefix for names, the base URL.
struct Bench {
    http: reqwest::Client,
    url: String,
    prefix: String,
    /// The server's database, when given and statistics are to be refreshed after set-ups.
    database_url: Option<String>,
    /// The server's database, when given: scenario 11 loads its history through it.
    loader_url: Option<String>,
    /// Every process of the server: `--url` first, then `--process-urls`.
    processes: Vec<String>,
}

impl Bench {
    /// Vacuums the server's database and refreshes its planner statistics after a scenario's
    /// set-up, as autovacuum would on a default PostgreSQL, which since version 13 also
    /// vacuums tables that only grew. A machine with autovacuum off would otherwise measure
    /// plans made for empty tables, and index-only scans that visit every row's table page
    /// (no page is marked all-visible until a vacuum). Does nothing without `--database-url`
    /// or with `--no-analyze`.
    async fn analyze(&self) {
        let Some(url) = &self.database_url else {
            return;
        };
        let Ok(client) = connect(url).await else {
            return;
        };
        if let Err(err) = client.batch_execute("VACUUM ANALYZE").await {
            eprintln!("myelin-bench: VACUUM ANALYZE failed: {err}");
        }
    }

    /// `n` new users, user i making its requests to the server's process `first + i` (counted
    /// round the processes of a scale-out; all to `--url` without `--process-urls`).
    async fn users_on_processes(
        &self,
        role: &str,
        n: usize,
        first: usize,
    ) -> Result<Vec<User>, Failure> {
        let processes = &self.processes;
        Ok((self.users(role, n).await?)
            .into_iter()
            .enumerate()
            .map(|(i, user)| user.on_process(&processes[(first + i) % processes.len()]))
            .collect())
    }

    /// Two new users, a sender and a receiver, both in a public room the sender made: the
    /// sender on the first process, the receiver on the next.
    async fn pair_in_room(&self, role: &str) -> Result<(User, User, String), Failure> {
        let mut users = self.users_on_processes(role, 2, 0).await?;
        let (sender, receiver) = (users.remove(0), users.remove(0));
        let room = sender
            .create_room(json!({ "preset": "public_chat" }))
            .await?;
        receiver.join(&room).await?;
        Ok((sender, receiver, room))
    }

    /// Registers `count` users through the bench registration's application service (no
    /// passwords to hash), a few at a time: `@{prefix}{tag}big{i}`, where `tag` (hex digits
    /// or nothing) keeps one scenario's users apart from another's.
    async fn appservice_users(
        &self,
        as_token: &str,
        tag: &str,
        count: usize,
    ) -> Result<Vec<User>, Failure> {
        futures_util::stream::iter(0..count)
            .map(|i| {
                let name = format!("{}{tag}big{i}", self.prefix);
                async move {
                    client::register_as_appservice(&self.http, &self.url, as_token, &name).await
                }
            })
            .buffered(SET_UP_IN_FLIGHT)
            .try_collect()
            .await
    }

    async fn users(&self, role: &str, n: usize) -> Result<Vec<User>, Failure> {
        let mut users = Vec::with_capacity(n);
        // Registration hashes passwords: a few at a time keeps setup quick without starving
        // a 2-core machine.
        for chunk in (0..n).collect::<Vec<_>>().chunks(4) {
            let batch = chunk.iter().map(|i| {
                let name = format!("{}{role}{i}", self.prefix);
                async move { register(&self.http, &self.url, &name).await }
            });
            for user in futures_util::future::join_all(batch).await {
                users.push(user?);
            }
        }
        Ok(users)
    }
}

fn rss_kib(pid: Option<u32>, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid?)).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// A connection to the server's database at `url`, driven in the background.
async fn connect(url: &str) -> Result<tokio_postgres::Client, Failure> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(|e| format!("database: {e}"))?;
    tokio::spawn(connection);
    Ok(client)
}

async fn database_size(url: Option<&str>) -> Option<i64> {
    let client = connect(url?).await.ok()?;
    let row = client
        .query_one("SELECT pg_database_size(current_database())", &[])
        .await
        .ok()?;
    row.try_get(0).ok()
}

/// Scenario 1: one user sends messages one after another.
async fn sequential_sends(bench: &Bench, n: usize) -> Result<Value, Failure> {
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
async fn concurrent_sends(bench: &Bench, counts: &Counts) -> Result<(Value, Value, bool), Failure> {
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

/// Scenario 3: time from the start of the sender's PUT until the long-polling receiver has
/// the event.
async fn delivery(bench: &Bench, n: usize) -> Result<(Value, Samples), Failure> {
    let (sender, receiver, room) = bench.pair_in_room("dlv").await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, Instant)>();
    let poller = tokio::spawn(async move {
        let mut since = next_batch(&receiver.sync(None, Duration::ZERO, None).await?);
        loop {
            let sync = receiver
                .sync(Some(&since), Duration::from_secs(30), None)
                .await?;
            let arrived = Instant::now();
            since = next_batch(&sync);
            for (_, _, body) in timeline_events(&sync) {
                if tx.send((body, arrived)).is_err() {
                    return Ok::<_, Failure>(());
                }
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut samples = Samples::default();
    for i in 0..n {
        let body = format!("ping {i}");
        let started = Instant::now();
        sender.send(&room, &format!("d{i}"), &body).await?;
        loop {
            let (got, at) = tokio::time::timeout(Duration::from_secs(30), rx.recv())
                .await
                .map_err(|_| "a message never arrived".to_owned())?
                .ok_or("the receiver stopped")?;
            if got == body {
                samples.push(at.duration_since(started));
                break;
            }
        }
    }
    poller.abort();
    Ok((samples.summary(), samples))
}

/// Scenario 5: initial sync for a user in many rooms (lazy-loaded members and full member
/// state), then an incremental sync with one room changed.
async fn syncs(bench: &Bench, counts: &Counts) -> Result<Value, Failure> {
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

/// Scenario 6: paging back through a room's history 100 events at a time.
async fn history(bench: &Bench, n: usize) -> Result<Value, Failure> {
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

/// Scenario 7: one message into a big room; time until every long-poller has it.
async fn fanout(bench: &Bench, counts: &Counts) -> Result<Value, Failure> {
    let mut members = bench.users("fan", counts.fanout_members).await?;
    let sender = members.remove(0);
    let room = sender
        .create_room(json!({ "preset": "public_chat" }))
        .await?;
    for member in &members {
        member.join(&room).await?;
    }
    bench.analyze().await;
    let pollers: Vec<User> = members.into_iter().take(counts.fanout_pollers).collect();
    let mut summary = reach_pollers(
        pollers,
        None,
        || sender.send(&room, "fan", "fan-out"),
        "fan-out",
    )
    .await?;
    summary["members"] = json!(counts.fanout_members);
    summary["pollers"] = json!(counts.fanout_pollers);
    summary["all_received_ms"] = summary["max_ms"].clone();
    Ok(summary)
}

/// Time from the start of a send until each of `pollers`, long-polling `/sync` (with
/// `filter`, from where an initial sync left them), has the message whose body is `body`.
/// The send waits until every poller's long-poll has been waiting for a while (catching up
/// on the others' first syncs is not the delivery measured), or a minute: the summary's
/// `settled` says which.
async fn reach_pollers<F: std::future::Future<Output = Result<String, Failure>>>(
    pollers: Vec<User>,
    filter: Option<String>,
    send: impl FnOnce() -> F,
    body: &'static str,
) -> Result<Value, Failure> {
    let tokens: Vec<String> = futures_util::stream::iter(&pollers)
        .map(|poller| async {
            Ok::<_, Failure>(next_batch(
                &poller.sync(None, Duration::ZERO, filter.as_deref()).await?,
            ))
        })
        .buffered(8)
        .try_collect()
        .await?;
    let started = Arc::new(tokio::sync::OnceCell::<Instant>::new());
    // When each poller's current long-poll was sent, in milliseconds from `origin` (`MAX`:
    // not sent yet).
    let origin = Instant::now();
    let waiting_since: Arc<Vec<AtomicU64>> =
        Arc::new(pollers.iter().map(|_| AtomicU64::new(u64::MAX)).collect());
    let waits: Vec<_> = pollers
        .into_iter()
        .zip(tokens)
        .enumerate()
        .map(|(i, (poller, mut since))| {
            let (started, filter) = (started.clone(), filter.clone());
            let waiting_since = waiting_since.clone();
            tokio::spawn(async move {
                loop {
                    let now = origin.elapsed().as_millis() as u64;
                    waiting_since[i].store(now, Ordering::Relaxed);
                    let sync = poller
                        .sync(Some(&since), Duration::from_secs(30), filter.as_deref())
                        .await?;
                    since = next_batch(&sync);
                    if timeline_events(&sync).iter().any(|(_, _, b)| b == body) {
                        let start = *started.get().ok_or("arrived before it was sent")?;
                        return Ok::<_, Failure>(start.elapsed());
                    }
                }
            })
        })
        .collect();
    // Every poller parked: each one's long-poll has been waiting for two seconds.
    let quiet = Duration::from_secs(2).as_millis() as u64;
    let settle_by = Instant::now() + Duration::from_secs(60);
    let settled = loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = origin.elapsed().as_millis() as u64;
        let newest_wait = waiting_since
            .iter()
            .map(|at| at.load(Ordering::Relaxed))
            .max();
        if newest_wait.is_some_and(|at| at != u64::MAX && now.saturating_sub(at) >= quiet) {
            break true;
        }
        if Instant::now() >= settle_by {
            break false;
        }
    };
    started.set(Instant::now()).ok();
    send().await?;
    let mut samples = Samples::default();
    for wait in waits {
        let elapsed = tokio::time::timeout(Duration::from_secs(60), wait)
            .await
            .map_err(|_| "a poller never got the message".to_owned())?
            .map_err(|e| e.to_string())??;
        samples.push(elapsed);
    }
    let mut summary = samples.summary();
    summary["settled"] = json!(settled);
    Ok(summary)
}

fn print_table(label: &str, report: &Value) {
    println!("\n{label}");
    let row = |name: &str, v: &Value| {
        println!(
            "  {name:<34} p50 {:>9} ms  p99 {:>9} ms  max {:>9} ms{}",
            v["p50_ms"],
            v["p99_ms"],
            v["max_ms"],
            v.get("messages_per_s")
                .map(|r| format!("  {r} msg/s"))
                .unwrap_or_default()
        );
    };
    row("1 send, sequential", &report["send_sequential"]);
    row("2 send, concurrent", &report["send_concurrent"]);
    println!(
        "  {:<34} {}%",
        "4 completeness", report["completeness"]["completeness_percent"]
    );
    row("3 delivery to a long-poller", &report["delivery"]);
    row(
        "5 initial sync, lazy members",
        &report["sync"]["initial_lazy"],
    );
    row(
        "5 initial sync, full members",
        &report["sync"]["initial_full_members"],
    );
    row(
        "5 incremental sync, 1 room",
        &report["sync"]["incremental_one_room_changed"],
    );
    row("6 /messages page of 100", &report["history"]);
    row("7 fan-out, all pollers", &report["fanout"]);
    println!("  8 footprint: {}", report["footprint"]);
    for (name, key) in [
        ("9 sliding sync, first window of 20", "first_window_of_20"),
        ("9 sliding sync, each +100 step", "growing_by_100"),
        ("9 sliding sync, whole list", "whole_list"),
        (
            "9 sliding sync, nothing changed",
            "incremental_nothing_changed",
        ),
        (
            "9 sliding sync, one room changed",
            "incremental_one_room_changed",
        ),
        ("9 sliding sync, long-poll wake-up", "long_poll_wake_up"),
    ] {
        row(name, &report["sliding"][key]);
    }
    let parked = &report["parked"];
    println!(
        "  10 parked connections: {} open, {} KiB each",
        parked["connections"], parked["kib_per_parked_connection"]
    );
    row("10 delivery, alone", &parked["delivery_alone"]);
    row(
        "10 delivery, while parked",
        &parked["delivery_while_parked"],
    );
    let long = &report["long_history"];
    if let Some(skipped) = long["skipped"].as_str() {
        println!("  11 long history: skipped ({skipped})");
    }
    for (name, key) in [
        ("11 long history, newest page", "newest_page"),
        ("11 long history, /context", "context"),
        ("11 long history, middle page", "middle_page"),
        ("11 long history, oldest page", "oldest_page"),
        ("11 long history, timestamp_to_event", "timestamp_to_event"),
        ("11 long history, search rare word", "search_rare"),
        ("11 long history, search common word", "search_common"),
        (
            "11 long history, search common, recent",
            "search_common_recent",
        ),
    ] {
        row(name, &long[key]);
    }
    let big = &report["big_room"];
    if let Some(skipped) = big["skipped"].as_str() {
        println!("  12 big room: skipped ({skipped})");
    } else if let Some(how) = big["joins"]["how"].as_str() {
        println!("  12 big room: {} members, {how}", big["joins"]["members"]);
    } else if !big.is_null() {
        println!(
            "  12 big room: {} joins in {} s ({}/s), {} bytes of database per member",
            big["joins"]["members"],
            big["joins"]["total_s"],
            big["joins"]["per_s"],
            big["db_bytes_per_member"]
        );
    }
    for (name, key) in [
        ("12 big room, one join", "joins"),
        ("12 big room, last tenth of joins", "last_tenth_of_joins"),
        ("12 big room, send", "send"),
        ("12 big room, fan-out, all pollers", "fan_out"),
        ("12 big room, /members", "members"),
        ("12 big room, /joined_members", "joined_members"),
        ("12 big room, first sync, lazy", "initial_sync_lazy"),
    ] {
        row(name, &big[key]);
    }
    let account = &report["big_account"];
    if let Some(skipped) = account["skipped"].as_str() {
        println!("  13 big account: skipped ({skipped})");
    } else if !account.is_null() {
        println!("  13 big account: set-up {}", account["set_up"]);
    }
    for (name, key) in [
        ("13 big account, initial sync, lazy", "initial_sync_lazy"),
        (
            "13 big account, initial sync, full",
            "initial_sync_full_members",
        ),
    ] {
        row(name, &account[key]);
    }
    let start = &report["start_up"];
    if let Some(skipped) = start["skipped"].as_str() {
        println!("  14 start-up: skipped ({skipped})");
    } else if !start.is_null() {
        println!(
            "  14 start-up: {} rooms, {} events, {} bytes of database, load {}",
            start["rooms"], start["events"], start["database_bytes"], start["load"]
        );
        match start["restarts"]["skipped"].as_str() {
            Some(skipped) => println!("  14 start-up: restarts skipped ({skipped})"),
            None => println!(
                "  14 start-up: RSS {} MiB serving, {} MiB after the first sync",
                start["rss_serving_mib"], start["rss_after_first_sync_mib"]
            ),
        }
    }
    for (name, key) in [
        ("14 start-up, until serving", "until_serving"),
        (
            "14 start-up, until a first sync",
            "until_first_sync_answered",
        ),
    ] {
        row(name, &start[key]);
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut counts = Counts::of(cli.scale);
    counts.receivers = cli.receivers.unwrap_or(counts.receivers);
    counts.big_account_members = cli
        .big_account_members
        .unwrap_or(counts.big_account_members);
    counts.big_room_members = cli.big_room_members.unwrap_or(counts.big_room_members);
    counts.big_room_pollers = cli.big_room_pollers.unwrap_or(counts.big_room_pollers);
    let set_up_files = saved::SetUpFiles {
        from: cli.set_up_from.as_deref(),
        save: cli.set_up_save.as_deref(),
    };
    let saving_scenarios = ["long_history", "big_room", "big_account", "start_up"];
    if (set_up_files.from.is_some() || set_up_files.save.is_some())
        && !(cli.only.len() == 1 && saving_scenarios.contains(&cli.only[0].as_str()))
    {
        eprintln!(
            "myelin-bench: --set-up-save and --set-up-from need --only with one of {saving_scenarios:?}"
        );
        return ExitCode::FAILURE;
    }
    // One socket per parked connection of scenario 10.
    myelin::limits::raise_open_files_limit();
    let bench = Bench {
        http: reqwest::Client::builder()
            // Idle connections for every long-poller of a scenario (the big room's 1,000): a
            // burst of answers beyond the idle pool closes connections, and reopening them
            // against a busy server can wait minutes for its backlog.
            .pool_max_idle_per_host(1_024)
            .build()
            .expect("HTTP client"),
        url: cli.url.trim_end_matches('/').to_owned(),
        prefix: format!("b{:x}", rand::random::<u32>()),
        database_url: cli.database_url.clone().filter(|_| !cli.no_analyze),
        loader_url: cli.database_url.clone(),
        processes: std::iter::once(&cli.url)
            .chain(&cli.process_urls)
            .map(|url| url.trim_end_matches('/').to_owned())
            .collect(),
    };
    let idle_rss = rss_kib(cli.pid, "VmRSS:");
    let db_before = database_size(cli.database_url.as_deref()).await;
    let result = async {
        let mut report = json!({
            "label": cli.label,
            "server_name": cli.server_name,
            "url": bench.url,
            "processes": bench.processes.len(),
        });
        let runs = |name: &str| cli.only.is_empty() || cli.only.iter().any(|o| o == name);
        let mut complete = true;
        let mut messages_so_far = 0;
        let mut db_after = None;
        if runs("send") {
            eprintln!("1: sequential sends");
            report["send_sequential"] = sequential_sends(&bench, counts.sequential).await?;
            messages_so_far += counts.sequential;
        }
        if runs("concurrent") {
            eprintln!("2+4: concurrent sends and completeness");
            let (sends, completeness, all_there) = concurrent_sends(&bench, &counts).await?;
            report["send_concurrent"] = sends;
            report["completeness"] = completeness;
            complete = all_there;
            messages_so_far += counts.concurrent_users * counts.concurrent_messages;
        }
        if messages_so_far > 0 {
            db_after = database_size(cli.database_url.as_deref()).await;
        }
        if runs("delivery") {
            eprintln!("3: delivery latency");
            let (summary, samples) = delivery(&bench, counts.delivery).await?;
            report["delivery"] = summary;
            std::fs::write(&cli.plot, cdf_svg(&format!("{}: send to long-poller delivery", cli.label), &samples))
                .map_err(|e| e.to_string())?;
        }
        if runs("sync") {
            eprintln!("5: sync");
            report["sync"] = syncs(&bench, &counts).await?;
        }
        if runs("history") {
            eprintln!("6: history");
            report["history"] = history(&bench, counts.history).await?;
        }
        if runs("fanout") {
            eprintln!("7: fan-out");
            report["fanout"] = fanout(&bench, &counts).await?;
        }
        if runs("sliding") {
            eprintln!("9: sliding sync");
            report["sliding"] = sliding::sliding_sync(&bench, counts.sliding_rooms).await?;
        }
        if runs("parked") {
            eprintln!("10: parked connections");
            report["parked"] = parked::parked_connections(
                &bench,
                cli.pid,
                counts.parked_connections,
                counts.parked_users,
            )
            .await?;
        }
        if runs("long_history") {
            eprintln!("11: long history");
            report["long_history"] = long_history::long_history(
                &bench,
                cli.appservice_token.as_deref(),
                counts.long_history,
                set_up_files,
            )
            .await?;
        }
        if runs("big_room") {
            eprintln!("12: big room");
            report["big_room"] = big_room::big_room(
                &bench,
                cli.appservice_token.as_deref(),
                counts.big_room_members,
                counts.big_room_pollers,
                set_up_files,
            )
            .await?;
        }
        if runs("big_account") {
            eprintln!("13: big account");
            report["big_account"] = big_account::big_account(
                &bench,
                cli.appservice_token.as_deref(),
                counts.big_account_rooms,
                counts.big_account_members,
                cli.pid,
                set_up_files,
            )
            .await?;
        }
        if runs("start_up") {
            eprintln!("14: start-up with a big database");
            report["start_up"] = start_up::start_up(
                &bench,
                cli.appservice_token.as_deref(),
                counts.start_up_rooms,
                counts.start_up_events,
                cli.restart_command.as_deref(),
                set_up_files,
            )
            .await?;
        }
        report["footprint"] = json!({
            "idle_rss_mib": idle_rss.map(|k| round(k as f64 / 1024.0)),
            "peak_rss_mib": rss_kib(cli.pid, "VmHWM:").map(|k| round(k as f64 / 1024.0)),
            "db_bytes_per_10000_messages": db_before.zip(db_after).map(|(b, a)| (a - b) * 10_000 / messages_so_far.max(1) as i64),
        });
        Ok::<_, Failure>((report, complete))
    }
    .await;
    match result {
        Ok((report, complete)) => {
            print_table(&cli.label, &report);
            let text = serde_json::to_string_pretty(&report).expect("JSON");
            if let Err(err) = std::fs::write(&cli.out, text) {
                eprintln!("myelin-bench: cannot write {}: {err}", cli.out.display());
                return ExitCode::FAILURE;
            }
            if complete {
                ExitCode::SUCCESS
            } else {
                eprintln!(
                    "myelin-bench: messages were lost, duplicated or reordered: {}",
                    report["completeness"]["problems"]
                );
                ExitCode::from(3)
            }
        }
        Err(err) => {
            eprintln!("myelin-bench: {err}");
            ExitCode::FAILURE
        }
    }
}
