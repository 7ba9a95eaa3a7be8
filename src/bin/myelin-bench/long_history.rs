//! Scenario 11: a room with a long history (a million events at full scale): a `/messages`
//! page at the newest end, in the middle (from a `/context` token) and at the oldest end,
//! `/context` itself, `timestamp_to_event`, and search for a rare and a common word (best
//! matches first, and for the common word also newest first).
//!
//! The history is loaded through SQL, not the API (sending a million events would take the
//! run's whole time): the room and one message are made through the API, then copies of that
//! message, each a child of the one before, are inserted into Myelin's tables. Each copy is a
//! real PDU: its content hash, signature (the server's key, read from its database) and event
//! ID (the reference hash) are computed here as the server computes them, so another server
//! can be loaded with the same events (`saved.rs`, `tests/bench/loaded.sh long_history`).
//! So the set-up needs `--database-url` and Myelin's schema; against another server without a
//! saved set-up it reports that it was skipped.

use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::{
    client::{enc, Failure, User},
    copies,
    saved::{SetUpFiles, LOADED},
    stats::{round, Samples},
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
/// Loaded events sent to the database per statement.
const LOAD_BATCH: usize = 10_000;

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
    let db = crate::connect(url).await?;
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

/// What the set-up made: the room, whose history it is, and the event the middle measures
/// start from.
#[derive(Serialize, Deserialize)]
struct SetUp {
    room_id: String,
    /// The member who made the room and reads it (an application service's user when
    /// `--appservice-token` is given, as a loaded server needs).
    user: String,
    /// Loaded events, between the template message and the newest one.
    events: usize,
    /// The loaded event in the middle, and its timestamp.
    middle_id: String,
    middle_ts: i64,
    report: Value,
}

pub async fn long_history(
    bench: &Bench,
    appservice_token: Option<&str>,
    events: usize,
    files: SetUpFiles<'_>,
) -> Result<Value, Failure> {
    let (set_up, user) = match files.load::<SetUp>()? {
        Some(mut set_up) => {
            let as_token =
                appservice_token.ok_or("a saved set-up is measured through --appservice-token")?;
            let user = User::acting_as(&bench.http, &bench.url, as_token, &set_up.user);
            set_up.report = json!({ "events": set_up.events, "how": LOADED });
            (set_up, user)
        }
        None => match set_up_through_sql(bench, appservice_token, events).await? {
            Ok(made) => made,
            Err(skipped) => return Ok(skipped),
        },
    };
    files.store(&set_up)?;
    bench.analyze().await;
    let mut report = measure(&user, &set_up).await?;
    if let (Value::Object(report), Value::Object(set_up)) = (&mut report, set_up.report) {
        report.extend(set_up);
    }
    Ok(report)
}

/// The room, its first and last messages through the API, and the history between them
/// through SQL.
async fn set_up_through_sql(
    bench: &Bench,
    appservice_token: Option<&str>,
    events: usize,
) -> Result<Result<(SetUp, User), Value>, Failure> {
    let db = match myelin_loader(bench).await? {
        Ok(db) => db,
        Err(skipped) => return Ok(Err(skipped)),
    };
    let user = match appservice_token {
        Some(as_token) => bench.appservice_users(as_token, "long", 1).await?,
        None => bench.users("long", 1).await?,
    }
    .remove(0);
    let user_id = match user.appservice_user_id() {
        Some(user_id) => user_id.to_owned(),
        None => user.get("/_matrix/client/v3/account/whoami").await?["user_id"]
            .as_str()
            .ok_or("whoami without a user_id")?
            .to_owned(),
    };
    let room = user
        .create_room(json!({ "preset": "private_chat", "name": "long history" }))
        .await?;
    let template = user.send(&room, "template", "template").await?;
    let started = Instant::now();
    let middle = events / 2;
    let (middle_id, middle_ts) = load(&db, &room, &template, events, middle).await?;
    let load_seconds = started.elapsed().as_secs_f64();
    // One message through the API on top: the server must take the loaded events as the
    // room's tip.
    user.send(&room, "newest", "newest").await?;
    let set_up = SetUp {
        room_id: room,
        user: user_id,
        events,
        middle_id,
        middle_ts,
        report: json!({ "events": events, "load_seconds": round(load_seconds) }),
    };
    Ok(Ok((set_up, user)))
}

/// The pages, `/context`, `timestamp_to_event` and searches, each answer checked.
async fn measure(user: &User, set_up: &SetUp) -> Result<Value, Failure> {
    let (room, events) = (&set_up.room_id, set_up.events);
    let mut report = serde_json::Map::new();

    // The newest page: the message on top, then the loaded ones from the last down.
    let mut newest_page = Samples::default();
    for _ in 0..SAMPLES {
        let t = Instant::now();
        let page = user.messages(room, None, PAGE as u32).await?;
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
    let middle_id = &set_up.middle_id;
    let (mut context, mut middle_page) = (Samples::default(), Samples::default());
    for _ in 0..SAMPLES {
        let t = Instant::now();
        let around = user
            .get(&format!(
                "/_matrix/client/v3/rooms/{}/context/{}?limit=0",
                enc(room),
                enc(middle_id)
            ))
            .await?;
        context.push(t.elapsed());
        let start = around["start"]
            .as_str()
            .ok_or_else(|| format!("a /context without start: {around}"))?;
        let t = Instant::now();
        let page = user.messages(room, Some(start), PAGE as u32).await?;
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
                enc(room)
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
    let middle_ts = set_up.middle_ts;
    let mut timestamp = Samples::default();
    for _ in 0..SAMPLES {
        let t = Instant::now();
        let found = user
            .get(&format!(
                "/_matrix/client/v1/rooms/{}/timestamp_to_event?ts={middle_ts}&dir=f",
                enc(room)
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

/// Inserts `n` copies of the template message after it, in one transaction: the events, each
/// one's edge to the one before, and the room's new tip. Positions come from the event
/// stream's sequence, so readers see them as committed the moment the transaction is. Returns
/// the ID and timestamp of copy number `middle`.
async fn load(
    db: &tokio_postgres::Client,
    room: &str,
    template: &str,
    n: usize,
    middle: usize,
) -> Result<(String, i64), Failure> {
    let sql_error = |e: tokio_postgres::Error| format!("loading the history: {e}");
    let template = copies::read_templates(db, &[template.to_owned()])
        .await?
        .remove(0);
    let ts = template.origin_server_ts();
    let key = copies::server_key(db).await?;
    db.batch_execute(
        "BEGIN;
         CREATE TEMP TABLE long_loaded (g bigint, event_id text, pdu text) ON COMMIT DROP;",
    )
    .await
    .map_err(sql_error)?;
    let mut prev = template.event_id.clone();
    let template_id = template.event_id.as_str();
    let mut middle_event = None;
    for first in (1..=n).step_by(LOAD_BATCH) {
        let batch = first..=(first + LOAD_BATCH - 1).min(n);
        let (mut numbers, mut ids, mut pdus) = (vec![], vec![], vec![]);
        for g in batch {
            let mut body = format!("loaded {g} {COMMON_WORD}");
            if g % RARE_EVERY == 1 {
                body.push_str(&format!(" {RARE_WORD}"));
            }
            let g = g as i64;
            let origin_server_ts = ts - n as i64 + g;
            let copy = template.copy(&key, g, &body, origin_server_ts, &prev)?;
            if g as usize == middle {
                middle_event = Some((copy.event_id.to_string(), origin_server_ts));
            }
            numbers.push(g);
            ids.push(copy.event_id.to_string());
            pdus.push(copy.pdu);
            prev = copy.event_id;
        }
        db.execute(
            "INSERT INTO long_loaded SELECT * FROM unnest($1::int8[], $2::text[], $3::text[])",
            &[&numbers, &ids, &pdus],
        )
        .await
        .map_err(sql_error)?;
    }
    let sql = format!(
        "CREATE TEMP TABLE long_template ON COMMIT DROP AS
             SELECT * FROM events WHERE event_id = '{template_id}';
         INSERT INTO events (event_id, room_id, stream_ordering, depth, sender, event_type,
                             state_key, origin_server_ts, pdu, state_group, outlier, soft_failed)
         SELECT l.event_id, t.room_id, nextval('stream_events_seq'), t.depth + l.g, t.sender,
                t.event_type, NULL, t.origin_server_ts - {n} + l.g, l.pdu::jsonb,
                t.state_group, false, false
         FROM long_template t, long_loaded l
         ORDER BY l.g;
         UPDATE rooms SET forward_extremities = ARRAY['{prev}'],
                          tip_depth = (SELECT depth FROM long_template) + {n}
         WHERE room_id = '{room}';
         COMMIT;"
    );
    // Server-made IDs; checked all the same, as they go into the SQL text.
    if ![room, template_id, prev.as_str()]
        .into_iter()
        .all(copies::plain_id)
    {
        return Err(format!(
            "unexpected characters in {room}, {template_id} or {prev}"
        ));
    }
    db.batch_execute(&sql).await.map_err(sql_error)?;
    middle_event.ok_or_else(|| format!("no event {middle} among {n} loaded"))
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
