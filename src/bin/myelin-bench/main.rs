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
mod delivery;
mod long_history;
mod parked;
mod reads;
mod receipts;
mod saved;
mod sends;
mod sliding;
mod start_up;
mod stats;

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, ValueEnum};
use client::{register, Failure, User};
use futures_util::{StreamExt, TryStreamExt};
use serde_json::{json, Value};
use stats::{cdf_svg, round};

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
    /// fanout, receipts, behind, sliding, parked, long_history, big_room, big_account,
    /// start_up), for profiling one of them; the default runs all.
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
    /// Scenario 12: this many more members join the full room through the API after the
    /// measures, timed with the database's growth. A server whose room was loaded
    /// (`--set-up-from`) then still measures joins of its own at the room's size.
    #[arg(long, default_value_t = 0)]
    big_room_more_joins: usize,
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
    /// Messages each reader of scenario 15 marks read while the others do too.
    read_markers_each: usize,
    /// Scenario 16: messages the member has not read, and the syncs timed after them.
    behind: usize,
    behind_syncs: usize,
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
                read_markers_each: 5,
                behind: 100,
                behind_syncs: 10,
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
                read_markers_each: 20,
                behind: 5_000,
                behind_syncs: 200,
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

fn print_table(label: &str, report: &Value) {
    println!("\n{label}");
    let row = |name: &str, v: &Value| {
        println!(
            "  {name:<34} p50 {:>9} ms  p99 {:>9} ms  max {:>9} ms{}",
            v["p50_ms"],
            v["p99_ms"],
            v["max_ms"],
            v.get("messages_per_s")
                .or(v.get("markers_per_s"))
                .map(|r| format!("  {r}/s"))
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
    row("16 incremental sync, far behind", &report["far_behind"]);
    println!("  8 footprint: {}", report["footprint"]);
    row(
        "15 read markers, sequential",
        &report["read_markers"]["sequential"],
    );
    row(
        "15 read markers, concurrent",
        &report["read_markers"]["concurrent"],
    );
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
        ("12 big room, more joins when full", "more_joins"),
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
            report["send_sequential"] = sends::sequential_sends(&bench, counts.sequential).await?;
            messages_so_far += counts.sequential;
        }
        if runs("concurrent") {
            eprintln!("2+4: concurrent sends and completeness");
            let (sends, completeness, all_there) = sends::concurrent_sends(&bench, &counts).await?;
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
            let (summary, samples) = delivery::delivery(&bench, counts.delivery).await?;
            report["delivery"] = summary;
            std::fs::write(&cli.plot, cdf_svg(&format!("{}: send to long-poller delivery", cli.label), &samples))
                .map_err(|e| e.to_string())?;
        }
        if runs("sync") {
            eprintln!("5: sync");
            report["sync"] = reads::syncs(&bench, &counts).await?;
        }
        if runs("history") {
            eprintln!("6: history");
            report["history"] = reads::history(&bench, counts.history).await?;
        }
        if runs("fanout") {
            eprintln!("7: fan-out");
            report["fanout"] = delivery::fanout(&bench, &counts).await?;
        }
        if runs("receipts") {
            eprintln!("15: read markers");
            report["read_markers"] = receipts::read_markers(
                &bench,
                counts.sequential,
                counts.concurrent_users,
                counts.read_markers_each,
            )
            .await?;
        }
        if runs("behind") {
            eprintln!("16: a member far behind");
            report["far_behind"] =
                reads::far_behind(&bench, counts.behind, counts.behind_syncs).await?;
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
                cli.big_room_more_joins,
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
