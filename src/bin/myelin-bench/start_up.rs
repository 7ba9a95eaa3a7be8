//! Scenario 14: a start with a big database (100,000 rooms and 10,000,000 events at full
//! scale): after each restart, the time until the server answers, until a user's first sync
//! answers, and the server's memory at both points.
//!
//! The rooms are made through the API, each by one of an application service's users
//! (`--appservice-token`, a hundred rooms each) with one message in it; the rest of each
//! room's history is copies of that message, real PDUs built and signed here as the server
//! builds its own (`copies.rs`), loaded through SQL (so `--database-url` and Myelin's schema).
//! Another server is measured on the same events loaded into its database (`saved.rs`,
//! `tests/bench/loaded.sh start_up`). The restarts are the caller's: `--restart-command` is run
//! with `sh -c`, stops the server, starts it again in the background and prints the new
//! process's ID. Without it only the load is reported.

use std::time::{Duration, Instant};

use futures_util::{StreamExt, TryStreamExt};
use ruma::signatures::Ed25519KeyPair;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::{
    client::{first_sync_filter, sync_path, Failure, User},
    copies::{self, Template},
    long_history::myelin_loader,
    rss_kib,
    saved::{SetUpFiles, LOADED},
    stats::{round, Samples},
    Bench, SET_UP_IN_FLIGHT,
};

/// Rooms each user makes.
const ROOMS_PER_USER: usize = 100;
/// Rooms whose history one SQL transaction loads.
const ROOMS_PER_LOAD: usize = 1_000;
/// Restarts measured.
const RESTARTS: usize = 3;

/// What the set-up made: the user whose first sync is measured and how many copies each room's
/// history has.
#[derive(Serialize, Deserialize)]
struct SetUp {
    user: String,
    rooms: usize,
    copies: usize,
    report: Value,
}

pub async fn start_up(
    bench: &Bench,
    appservice_token: Option<&str>,
    rooms: usize,
    events: usize,
    restart_command: Option<&str>,
    files: SetUpFiles<'_>,
) -> Result<Value, Failure> {
    let Some(as_token) = appservice_token else {
        return Ok(json!({ "skipped": "needs --appservice-token to register the rooms' users" }));
    };
    let set_up = match files.load::<SetUp>()? {
        Some(mut set_up) => {
            set_up.report = json!({ "how": LOADED });
            set_up
        }
        None => match set_up_through_api_and_sql(bench, as_token, rooms, events).await? {
            Ok(set_up) => set_up,
            Err(skipped) => return Ok(skipped),
        },
    };
    files.store(&set_up)?;
    bench.analyze().await;
    let user = User::acting_as(&bench.http, &bench.url, as_token, &set_up.user);
    let mut report = set_up.report;
    report["rooms"] = json!(set_up.rooms);
    if let Some(url) = &bench.loader_url {
        let (events, bytes) = database_counts(url).await?;
        report["events"] = json!(events);
        report["database_bytes"] = json!(bytes);
    }
    let Some(restart_command) = restart_command else {
        report["restarts"] = json!({ "skipped": "needs --restart-command to restart the server" });
        return Ok(report);
    };

    // After each restart: the server answering, then the first user's first sync (its hundred
    // rooms, each read from the database for the first time since the start).
    let (copies, rooms) = (set_up.copies, set_up.rooms);
    let (mut serving, mut first_sync) = (Samples::default(), Samples::default());
    let (mut rss_serving, mut rss_synced) = (Vec::new(), Vec::new());
    for i in 0..RESTARTS {
        let pid = restart(restart_command)?;
        let started = Instant::now();
        wait_until_serving(bench).await?;
        serving.push(started.elapsed());
        rss_serving.push(rss_kib(Some(pid), "VmRSS:").unwrap_or(0));
        let filter = first_sync_filter(1, true, &format!("{}start{i}", bench.prefix));
        let (sync, elapsed) = user
            .get_timed(&sync_path(None, Duration::ZERO, Some(&filter)))
            .await?;
        first_sync.push(started.elapsed());
        rss_synced.push(rss_kib(Some(pid), "VmRSS:").unwrap_or(0));
        let joined = sync["rooms"]["join"].as_object();
        let synced = joined.map_or(0, |r| r.len());
        if synced != ROOMS_PER_USER.min(rooms) {
            return Err(format!("the first sync after a restart has {synced} rooms"));
        }
        // Each room's timeline ends with the last loaded copy.
        let last_body = format!("loaded {copies}");
        for (room_id, room) in joined.into_iter().flatten() {
            let events = room["timeline"]["events"].as_array();
            let last = events.and_then(|e| e.last());
            if last.map(|e| &e["content"]["body"]) != Some(&json!(last_body)) {
                return Err(format!("{room_id} does not end with its loaded history"));
            }
        }
        eprintln!(
            "  restart {i}: serving, then a first sync of {} ms",
            elapsed.as_millis()
        );
    }
    let median_mib = |mut kib: Vec<u64>| {
        kib.sort_unstable();
        round(kib[kib.len() / 2] as f64 / 1024.0)
    };
    report["until_serving"] = serving.summary();
    report["until_first_sync_answered"] = first_sync.summary();
    report["rss_serving_mib"] = json!(median_mib(rss_serving));
    report["rss_after_first_sync_mib"] = json!(median_mib(rss_synced));
    Ok(report)
}

/// The rooms, each with a message, through the API, and their histories through SQL; or why
/// not (a server without Myelin's schema or `--database-url`).
async fn set_up_through_api_and_sql(
    bench: &Bench,
    as_token: &str,
    rooms: usize,
    events: usize,
) -> Result<Result<SetUp, Value>, Failure> {
    let mut db = match myelin_loader(bench).await? {
        Ok(db) => db,
        Err(skipped) => return Ok(Err(skipped)),
    };
    let started = Instant::now();
    let users: Vec<User> = bench
        .appservice_users(as_token, "c", rooms.div_ceil(ROOMS_PER_USER))
        .await?;
    let users = &users;
    // Each room with one message through the API: the template of its loaded history.
    let templates: Vec<String> = futures_util::stream::iter(0..rooms)
        .map(|r| async move {
            let owner = &users[r / ROOMS_PER_USER];
            let room = owner
                .create_room(json!({ "preset": "private_chat", "name": format!("room {r}") }))
                .await?;
            owner
                .send(&room, &format!("first{r}"), &format!("first in {r}"))
                .await
        })
        .buffered(SET_UP_IN_FLIGHT)
        .try_collect()
        .await?;
    let through_api = started.elapsed();

    let copies = events / rooms.max(1);
    let started = Instant::now();
    load_histories(&mut db, &templates, copies).await?;
    let through_sql = started.elapsed();
    let user = users[0]
        .appservice_user_id()
        .ok_or("an application service's user without its ID")?
        .to_owned();
    Ok(Ok(SetUp {
        user,
        rooms,
        copies,
        report: json!({
            "load": {
                "api_seconds": round(through_api.as_secs_f64()),
                "sql_seconds": round(through_sql.as_secs_f64()),
                "how": format!("{users} application-service users make up to {ROOMS_PER_USER} rooms each, with a message, through the API; {copies} copies of each room's message, signed PDUs, through SQL", users = users.len()),
            },
        }),
    }))
}

/// The events and the size of the database at `url` (either server's schema has `events`).
async fn database_counts(url: &str) -> Result<(i64, i64), Failure> {
    let row = crate::connect(url)
        .await?
        .query_one(
            "SELECT (SELECT count(*) FROM events), pg_database_size(current_database())",
            &[],
        )
        .await
        .map_err(|e| e.to_string())?;
    Ok((row.get(0), row.get(1)))
}

/// Runs the restart command and reads the new server's process ID from what it prints.
fn restart(command: &str) -> Result<u32, Failure> {
    let output = std::process::Command::new("sh")
        .args(["-c", command])
        .output()
        .map_err(|e| format!("restart command: {e}"))?;
    let printed = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!("restart command failed: {}", output.status));
    }
    printed
        .trim()
        .parse()
        .map_err(|_| format!("the restart command printed no process ID: {printed:?}"))
}

/// Polls `/versions` until the server answers it (at most two minutes).
async fn wait_until_serving(bench: &Bench) -> Result<(), Failure> {
    let url = format!("{}/_matrix/client/versions", bench.url);
    let give_up = Instant::now() + Duration::from_secs(120);
    while Instant::now() < give_up {
        if let Ok(response) = bench.http.get(&url).send().await {
            if response.status().is_success() {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Err("the server did not answer within two minutes of a restart".into())
}

/// Loads `copies` copies of each template message after it, [`ROOMS_PER_LOAD`] rooms per
/// transaction; the next rooms' copies are built while the last ones are written.
async fn load_histories(
    db: &mut tokio_postgres::Client,
    templates: &[String],
    copies: usize,
) -> Result<(), Failure> {
    let key = copies::server_key(db).await?;
    let mut pending = None;
    for chunk in templates.chunks(ROOMS_PER_LOAD) {
        let read = copies::read_templates(db, chunk).await?;
        let key = key.clone();
        let next = tokio::task::spawn_blocking(move || build_copies(&key, &read, copies));
        if let Some(built) = pending.replace(next) {
            insert_copies(db, built.await.map_err(|e| e.to_string())??, copies).await?;
        }
    }
    if let Some(built) = pending {
        insert_copies(db, built.await.map_err(|e| e.to_string())??, copies).await?;
    }
    Ok(())
}

/// The copies of some rooms' templates, as columns: template `n` (its index), the template's
/// ID, the copy's number, ID and PDU.
#[derive(Default)]
struct Built {
    n: Vec<i64>,
    template_ids: Vec<String>,
    g: Vec<i64>,
    event_ids: Vec<String>,
    pdus: Vec<String>,
}

/// Copy `g` of each template is `loaded {g}`, a millisecond after the one before, a child of
/// it (the first of the template).
fn build_copies(
    key: &Ed25519KeyPair,
    templates: &[Template],
    copies: usize,
) -> Result<Built, Failure> {
    let mut built = Built::default();
    for (n, template) in templates.iter().enumerate() {
        let mut prev = template.event_id.clone();
        for g in 1..=copies as i64 {
            let ts = template.origin_server_ts() + g;
            let copy = template.copy(key, g, &format!("loaded {g}"), ts, &prev)?;
            built.n.push(n as i64);
            built.template_ids.push(template.event_id.to_string());
            built.g.push(g);
            built.event_ids.push(copy.event_id.to_string());
            built.pdus.push(copy.pdu);
            prev = copy.event_id;
        }
    }
    Ok(built)
}

/// Writes built copies in one transaction: the events in each room's order, each one's edge
/// to the one before, and each room's new tip.
async fn insert_copies(
    db: &mut tokio_postgres::Client,
    built: Built,
    copies: usize,
) -> Result<(), Failure> {
    let sql_error = |e: tokio_postgres::Error| format!("loading rooms' histories: {e}");
    let transaction = db.transaction().await.map_err(sql_error)?;
    transaction
        .batch_execute(
            "CREATE TEMP TABLE start_loaded (n bigint, template_id text, g bigint,
                                             event_id text, pdu text) ON COMMIT DROP",
        )
        .await
        .map_err(sql_error)?;
    transaction
        .execute(
            "INSERT INTO start_loaded
             SELECT * FROM unnest($1::int8[], $2::text[], $3::int8[], $4::text[], $5::text[])",
            &[
                &built.n,
                &built.template_ids,
                &built.g,
                &built.event_ids,
                &built.pdus,
            ],
        )
        .await
        .map_err(sql_error)?;
    transaction
        .batch_execute(&format!(
            "INSERT INTO events (event_id, room_id, stream_ordering, depth, sender, event_type,
                                 state_key, origin_server_ts, pdu, state_group, outlier,
                                 soft_failed)
             SELECT l.event_id, t.room_id, nextval('stream_events_seq'), t.depth + l.g,
                    t.sender, t.event_type, NULL, t.origin_server_ts + l.g, l.pdu::jsonb,
                    t.state_group, false, false
             FROM start_loaded l JOIN events t ON t.event_id = l.template_id
             ORDER BY l.n, l.g;
             UPDATE rooms r SET forward_extremities = ARRAY[l.event_id], tip_depth = t.depth + l.g
             FROM start_loaded l JOIN events t ON t.event_id = l.template_id
             WHERE l.g = {copies} AND r.room_id = t.room_id;"
        ))
        .await
        .map_err(sql_error)?;
    transaction.commit().await.map_err(sql_error)
}
