//! Scenario 11: a room with a long history (a million events at full scale): a `/messages`
//! page at the newest end, in the middle (from a `/context` token) and at the oldest end,
//! `/context` itself, `timestamp_to_event`, and search for a rare and a common word (best
//! matches first, and for the common word also newest first).
//!
//! The history is loaded through SQL, not the API (sending a million events would take the
//! run's whole time): the room and one message are made through the API, then copies of that
//! message, each a child of the one before, are inserted into Myelin's tables in one
//! statement per table. So this scenario needs `--database-url` and Myelin's schema; against
//! another server it reports that it was skipped.

use std::time::Instant;

use serde_json::{json, Value};

use crate::{
    client::{enc, Failure},
    stats::Samples,
    Bench,
};

/// The word in a handful of events (one in every `RARE_EVERY`).
const RARE_WORD: &str = "quokka";
const RARE_EVERY: usize = 100_000;
/// The word in every loaded event.
const COMMON_WORD: &str = "lorem";
/// Events per page, as clients ask.
const PAGE: usize = 20;
/// Samples per measurement.
const SAMPLES: usize = 20;

/// A connection to the server's database for loading events through SQL, or why there is
/// none: no `--database-url`, or a schema other than Myelin's.
pub async fn myelin_loader(
    bench: &Bench,
) -> Result<Result<tokio_postgres::Client, Value>, Failure> {
    let Some(url) = &bench.loader_url else {
        return Ok(Err(
            json!({ "skipped": "needs --database-url to load events" }),
        ));
    };
    let (db, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(|e| format!("database: {e}"))?;
    tokio::spawn(connection);
    let myelin_schema = db
        .query_one(
            "SELECT count(*) FROM information_schema.columns \
             WHERE table_name = 'events' AND column_name = 'pdu'",
            &[],
        )
        .await
        .map_err(|e| e.to_string())?
        .get::<_, i64>(0)
        > 0;
    if !myelin_schema {
        return Ok(Err(
            json!({ "skipped": "the event loader knows only Myelin's schema" }),
        ));
    }
    Ok(Ok(db))
}

pub async fn long_history(bench: &Bench, events: usize) -> Result<Value, Failure> {
    let db = match myelin_loader(bench).await? {
        Ok(db) => db,
        Err(skipped) => return Ok(skipped),
    };

    let user = bench.users("long", 1).await?.remove(0);
    let room = user
        .create_room(json!({ "preset": "private_chat", "name": "long history" }))
        .await?;
    let template = user.send(&room, "template", "template").await?;
    let started = Instant::now();
    load(&db, &room, &template, events).await?;
    let load_seconds = started.elapsed().as_secs_f64();
    // One message through the API on top: the server must take the loaded events as the
    // room's tip.
    user.send(&room, "newest", "newest").await?;
    bench.analyze().await;

    let mut report = serde_json::Map::new();
    report.insert("events".into(), json!(events));
    report.insert(
        "load_seconds".into(),
        json!(crate::stats::round(load_seconds)),
    );

    // The newest page: the message on top, then the loaded ones from the last down.
    let mut newest_page = Samples::default();
    for _ in 0..SAMPLES {
        let t = Instant::now();
        let page = user.messages(&room, None, PAGE as u32).await?;
        newest_page.push(t.elapsed());
        let bodies = bodies(&page);
        if bodies.first().map(String::as_str) != Some("newest")
            || numbers(&bodies[1..]) != descending_from(events, PAGE - 1)
        {
            return Err(format!(
                "the newest page is not the newest events: {bodies:?}"
            ));
        }
    }
    report.insert("newest_page".into(), newest_page.summary());

    // The middle: `/context` of the middle event, then a page back from its start.
    let middle = events / 2;
    let middle_id = loaded_id(&room, middle);
    let (mut context, mut middle_page) = (Samples::default(), Samples::default());
    for _ in 0..SAMPLES {
        let t = Instant::now();
        let around = user
            .get(&format!(
                "/_matrix/client/v3/rooms/{}/context/{}?limit=0",
                enc(&room),
                enc(&middle_id)
            ))
            .await?;
        context.push(t.elapsed());
        let start = around["start"]
            .as_str()
            .ok_or_else(|| format!("a /context without start: {around}"))?;
        let t = Instant::now();
        let page = user.messages(&room, Some(start), PAGE as u32).await?;
        middle_page.push(t.elapsed());
        let got = numbers(&bodies(&page));
        if got != descending_from(middle - 1, PAGE) {
            return Err(format!(
                "the middle page is not the events before {middle}: {got:?}"
            ));
        }
    }
    report.insert("context".into(), context.summary());
    report.insert("middle_page".into(), middle_page.summary());

    // The oldest end: forwards from the room's beginning, past its creation to the loaded
    // events.
    let mut oldest_page = Samples::default();
    for _ in 0..SAMPLES {
        let t = Instant::now();
        let page = user
            .get(&format!(
                "/_matrix/client/v3/rooms/{}/messages?dir=f&limit={PAGE}",
                enc(&room)
            ))
            .await?;
        oldest_page.push(t.elapsed());
        let chunk = page["chunk"].as_array().map_or(0, Vec::len);
        if chunk != PAGE || page["chunk"][0]["type"] != "m.room.create" {
            return Err(format!(
                "the oldest page does not start at the creation: {page}"
            ));
        }
    }
    report.insert("oldest_page".into(), oldest_page.summary());

    // The event at a time in the middle of the history (loaded events are 1 ms apart, the
    // last at the template's time).
    let middle_ts = db
        .query_one(
            "SELECT origin_server_ts FROM events WHERE event_id = $1",
            &[&middle_id],
        )
        .await
        .map_err(|e| e.to_string())?
        .get::<_, i64>(0);
    let mut timestamp = Samples::default();
    for _ in 0..SAMPLES {
        let t = Instant::now();
        let found = user
            .get(&format!(
                "/_matrix/client/v1/rooms/{}/timestamp_to_event?ts={middle_ts}&dir=f",
                enc(&room)
            ))
            .await?;
        timestamp.push(t.elapsed());
        if found["event_id"] != middle_id.as_str() {
            return Err(format!("timestamp_to_event found another event: {found}"));
        }
    }
    report.insert("timestamp_to_event".into(), timestamp.summary());

    let rare_hits = events.div_ceil(RARE_EVERY);
    // Best matches first (the spec's default), and newest first (what Element asks for).
    for (key, word, order, expected) in [
        ("search_rare", RARE_WORD, "rank", Some(rare_hits)),
        ("search_common", COMMON_WORD, "rank", None),
        ("search_common_recent", COMMON_WORD, "recent", None),
    ] {
        let mut search = Samples::default();
        for _ in 0..SAMPLES.min(5) {
            let t = Instant::now();
            let found = user
                .post(
                    "/_matrix/client/v3/search",
                    &json!({ "search_categories": { "room_events": {
                        "search_term": word,
                        "order_by": order,
                        "filter": { "rooms": [room], "limit": 10 },
                    } } }),
                )
                .await?;
            search.push(t.elapsed());
            let results = &found["search_categories"]["room_events"];
            let first_page = results["results"].as_array().map_or(0, Vec::len);
            if first_page == 0 || expected.is_some_and(|n| first_page != n.min(10)) {
                return Err(format!("search for {word} found {first_page}: {results}"));
            }
        }
        report.insert(key.into(), search.summary());
    }
    Ok(Value::Object(report))
}

/// The event ID of loaded event `n` (1-based) in `room`; the loader's SQL builds the same.
fn loaded_id(room: &str, n: usize) -> String {
    format!("$long{n}{}", id_suffix(room))
}

/// What follows the number in a loaded event's ID: event IDs are opaque, and a room-derived
/// suffix keeps them unique across runs.
fn id_suffix(room: &str) -> String {
    let room: String = room.chars().filter(char::is_ascii_alphanumeric).collect();
    format!("_{room}")
}

/// Inserts `n` copies of the template message after it, in one transaction: the events, each
/// one's edge to the one before, and the room's new tip. Positions come from the event stream's
/// sequence, so readers see them as committed the moment the transaction is.
async fn load(
    db: &tokio_postgres::Client,
    room: &str,
    template: &str,
    n: usize,
) -> Result<(), Failure> {
    // Server-made IDs; checked all the same, as they go into the SQL text.
    if [room, template].iter().any(|id| {
        !id.chars()
            .all(|c| c.is_ascii_alphanumeric() || "!$:._-".contains(c))
    }) {
        return Err(format!("unexpected characters in {room} or {template}"));
    }
    let suffix = id_suffix(room);
    let sql = format!(
        "BEGIN;
         CREATE TEMP TABLE long_template ON COMMIT DROP AS
             SELECT * FROM events WHERE event_id = '{template}';
         INSERT INTO events (event_id, room_id, stream_ordering, depth, sender, event_type,
                             state_key, origin_server_ts, pdu, state_group, outlier, soft_failed)
         SELECT '$long' || g || '{suffix}', t.room_id, nextval('stream_events_seq'),
                t.depth + g, t.sender, t.event_type, NULL, t.origin_server_ts - {n} + g,
                jsonb_set(jsonb_set(jsonb_set(jsonb_set(t.pdu,
                    '{{content,body}}',
                    to_jsonb('loaded ' || g || ' {COMMON_WORD}'
                             || CASE WHEN g % {RARE_EVERY} = 1 THEN ' {RARE_WORD}' ELSE '' END)),
                    '{{depth}}', to_jsonb(t.depth + g)),
                    '{{origin_server_ts}}', to_jsonb(t.origin_server_ts - {n} + g)),
                    '{{prev_events}}',
                    jsonb_build_array(CASE WHEN g = 1 THEN t.event_id
                                           ELSE '$long' || (g - 1) || '{suffix}' END)),
                t.state_group, false, false
         FROM long_template t, generate_series(1, {n}) g
         ORDER BY g;
         INSERT INTO event_edges (event_id, prev_event_id, room_id)
         SELECT '$long' || g || '{suffix}',
                CASE WHEN g = 1 THEN t.event_id ELSE '$long' || (g - 1) || '{suffix}' END,
                t.room_id
         FROM long_template t, generate_series(1, {n}) g;
         UPDATE rooms SET forward_extremities = ARRAY['$long{n}{suffix}'],
                          tip_depth = (SELECT depth FROM long_template) + {n}
         WHERE room_id = '{room}';
         COMMIT;"
    );
    db.batch_execute(&sql)
        .await
        .map_err(|e| format!("loading the history: {e}"))
}

fn bodies(page: &Value) -> Vec<String> {
    page["chunk"]
        .as_array()
        .map(|chunk| {
            chunk
                .iter()
                .map(|e| e["content"]["body"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The numbers of loaded events' bodies (`loaded N ...`), in page order.
fn numbers(bodies: &[String]) -> Vec<usize> {
    bodies
        .iter()
        .filter_map(|b| b.strip_prefix("loaded ")?.split(' ').next()?.parse().ok())
        .collect()
}

/// `count` numbers counting down from `from`.
fn descending_from(from: usize, count: usize) -> Vec<usize> {
    (0..count).map(|i| from - i).collect()
}
