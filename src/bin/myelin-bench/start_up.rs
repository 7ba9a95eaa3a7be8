//! Scenario 14: a start with a big database (100,000 rooms and 10,000,000 events at full
//! scale): after each restart, the time until the server answers, until a user's first sync
//! answers, and the server's memory at both points.
//!
//! The rooms are made through the API, each by one of an application service's users
//! (`--appservice-token`, a hundred rooms each) with one message in it; the rest of each
//! room's history is copies of that message loaded through SQL, as scenario 11 does for one
//! room (so `--database-url` and Myelin's schema). The restarts are the caller's:
//! `--restart-command` is run with `sh -c`, stops the server, starts it again in the
//! background and prints the new process's ID. Without it only the load is reported.

use std::time::{Duration, Instant};

use futures_util::{StreamExt, TryStreamExt};
use serde_json::{json, Value};

use crate::{
    client::{first_sync_filter, sync_path, Failure, User},
    long_history::myelin_loader,
    rss_kib,
    stats::{round, Samples},
    Bench, SET_UP_IN_FLIGHT,
};

/// Rooms each user makes.
const ROOMS_PER_USER: usize = 100;
/// Rooms whose history one SQL transaction loads.
const ROOMS_PER_LOAD: usize = 1_000;
/// Restarts measured.
const RESTARTS: usize = 3;

pub async fn start_up(
    bench: &Bench,
    appservice_token: Option<&str>,
    rooms: usize,
    events: usize,
    restart_command: Option<&str>,
) -> Result<Value, Failure> {
    let Some(as_token) = appservice_token else {
        return Ok(json!({ "skipped": "needs --appservice-token to register the rooms' users" }));
    };
    let mut db = match myelin_loader(bench).await? {
        Ok(db) => db,
        Err(skipped) => return Ok(skipped),
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
    for (batch, chunk) in templates.chunks(ROOMS_PER_LOAD).enumerate() {
        load(
            &mut db,
            &bench.prefix,
            batch * ROOMS_PER_LOAD,
            chunk,
            copies,
        )
        .await?;
    }
    let through_sql = started.elapsed();
    bench.analyze().await;
    let (total_events, database_bytes) = {
        let row = db
            .query_one(
                "SELECT (SELECT count(*) FROM events), pg_database_size(current_database())",
                &[],
            )
            .await
            .map_err(|e| e.to_string())?;
        (row.get::<_, i64>(0), row.get::<_, i64>(1))
    };
    let mut report = json!({
        "rooms": rooms,
        "events": total_events,
        "database_bytes": database_bytes,
        "load": {
            "api_seconds": round(through_api.as_secs_f64()),
            "sql_seconds": round(through_sql.as_secs_f64()),
            "how": format!("{users} application-service users make up to {ROOMS_PER_USER} rooms each, with a message, through the API; {copies} copies of each room's message through SQL", users = users.len()),
        },
    });
    let Some(restart_command) = restart_command else {
        report["restarts"] = json!({ "skipped": "needs --restart-command to restart the server" });
        return Ok(report);
    };

    // After each restart: the server answering, then the first user's first sync (its hundred
    // rooms, each read from the database for the first time since the start).
    let user = &users[0];
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

/// Loads `copies` copies of each template message after it, in one transaction: the events,
/// each one's edge to the one before, and each room's new tip. Loaded event `g` of room `n`
/// is `$load{g}_{n}_{prefix}`.
async fn load(
    db: &mut tokio_postgres::Client,
    prefix: &str,
    first_room: usize,
    templates: &[String],
    copies: usize,
) -> Result<(), Failure> {
    if !prefix.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(format!("unexpected characters in the prefix {prefix}"));
    }
    let id = |g: &str| format!("'$load' || {g} || '_' || t.n || '_{prefix}'");
    let (this, previous, last) = (id("g"), id("(g - 1)"), id(&copies.to_string()));
    let statements = [
        format!(
            "CREATE TEMP TABLE load_templates ON COMMIT DROP AS
             SELECT e.*, t.n + {first_room} AS n
             FROM unnest($1::text[]) WITH ORDINALITY AS t (event_id, n)
             JOIN events e USING (event_id)"
        ),
        format!(
            "INSERT INTO events (event_id, room_id, stream_ordering, depth, sender, event_type,
                                 state_key, origin_server_ts, pdu, state_group, outlier,
                                 soft_failed)
             SELECT {this}, t.room_id, nextval('stream_events_seq'), t.depth + g, t.sender,
                    t.event_type, NULL, t.origin_server_ts + g,
                    jsonb_set(jsonb_set(jsonb_set(jsonb_set(t.pdu,
                        '{{content,body}}', to_jsonb('loaded ' || g)),
                        '{{depth}}', to_jsonb(t.depth + g)),
                        '{{origin_server_ts}}', to_jsonb(t.origin_server_ts + g)),
                        '{{prev_events}}',
                        jsonb_build_array(CASE WHEN g = 1 THEN t.event_id ELSE {previous} END)),
                    t.state_group, false, false
             FROM load_templates t, generate_series(1, {copies}) g
             ORDER BY t.n, g"
        ),
        format!(
            "INSERT INTO event_edges (event_id, prev_event_id, room_id)
             SELECT {this}, CASE WHEN g = 1 THEN t.event_id ELSE {previous} END, t.room_id
             FROM load_templates t, generate_series(1, {copies}) g"
        ),
        format!(
            "UPDATE rooms r SET forward_extremities = ARRAY[{last}], tip_depth = t.depth + {copies}
             FROM load_templates t WHERE r.room_id = t.room_id"
        ),
    ];
    let transaction = db.transaction().await.map_err(|e| e.to_string())?;
    let (create, rest) = statements.split_first().expect("statements");
    transaction
        .execute(create.as_str(), &[&templates])
        .await
        .map_err(|e| format!("loading rooms' histories: {e}"))?;
    for statement in rest {
        transaction
            .execute(statement.as_str(), &[])
            .await
            .map_err(|e| format!("loading rooms' histories: {e}"))?;
    }
    transaction.commit().await.map_err(|e| e.to_string())
}
