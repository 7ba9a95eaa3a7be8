//! The room DAG underneath the timeline: `prev_events` chains, forward extremities as a set,
//! history in topological order `(depth, stream)`, and events clients never see (outliers,
//! rejected and soft-failed events).
//!
//! No federation path creates forks, backfilled, rejected, soft-failed or outlier events yet,
//! so the tests store them directly in the database, with the columns a federation writer
//! would set.

use diesel::sql_types::{Array, BigInt, Bool, Nullable, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use serde_json::{json, Value};

use crate::support::{client::enc, Client, TestServer};

#[derive(diesel::QueryableByName)]
struct Stored {
    #[diesel(sql_type = Text)]
    event_id: String,
    #[diesel(sql_type = BigInt)]
    depth: i64,
    #[diesel(sql_type = BigInt)]
    stream_ordering: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    state_group: Option<i64>,
    #[diesel(sql_type = Text)]
    prev_events: String,
    #[diesel(sql_type = Text)]
    auth_events: String,
}

/// A stored event's row.
async fn stored(conn: &mut AsyncPgConnection, event_id: &str) -> Stored {
    diesel::sql_query(
        "SELECT event_id, depth, stream_ordering, state_group, \
                (pdu->'prev_events')::text AS prev_events, \
                (pdu->'auth_events')::text AS auth_events \
         FROM events WHERE event_id = $1",
    )
    .bind::<Text, _>(event_id)
    .get_result(conn)
    .await
    .unwrap()
}

/// A room's events in stream order.
async fn room_events(conn: &mut AsyncPgConnection, room: &str) -> Vec<Stored> {
    diesel::sql_query(
        "SELECT event_id, depth, stream_ordering, state_group, \
                (pdu->'prev_events')::text AS prev_events, \
                (pdu->'auth_events')::text AS auth_events \
         FROM events WHERE room_id = $1 ORDER BY stream_ordering",
    )
    .bind::<Text, _>(room)
    .load(conn)
    .await
    .unwrap()
}

#[derive(diesel::QueryableByName)]
struct Ids {
    #[diesel(sql_type = Array<Text>)]
    ids: Vec<String>,
}

/// The IDs a query returns as one sorted array named `ids`.
async fn ids(conn: &mut AsyncPgConnection, sql: &str, event_id: &str) -> Vec<String> {
    let row: Ids = diesel::sql_query(sql)
        .bind::<Text, _>(event_id)
        .get_result(conn)
        .await
        .unwrap();
    row.ids
}

#[derive(diesel::QueryableByName)]
struct Tip {
    #[diesel(sql_type = Array<Text>)]
    forward_extremities: Vec<String>,
    #[diesel(sql_type = BigInt)]
    tip_depth: i64,
    #[diesel(sql_type = BigInt)]
    current_state_group: i64,
}

async fn tip(conn: &mut AsyncPgConnection, room: &str) -> Tip {
    diesel::sql_query(
        "SELECT forward_extremities, tip_depth, current_state_group FROM rooms WHERE room_id = $1",
    )
    .bind::<Text, _>(room)
    .get_result(conn)
    .await
    .unwrap()
}

#[derive(diesel::QueryableByName)]
struct Position {
    #[diesel(sql_type = BigInt)]
    position: i64,
}

/// A stream position for an event stored by hand: the next one of the event stream, taken
/// the way the writer takes it, inside the transaction that stores the event (readers stay
/// below it until that commits).
async fn next_stream_position(conn: &mut AsyncPgConnection) -> i64 {
    let taken: Position =
        diesel::sql_query("SELECT (myelin_take_positions('events', 1))[1] AS position")
            .get_result(conn)
            .await
            .unwrap();
    taken.position
}

/// A backfilled event's position, from the sequence `storage::dag::next_backfill_position`
/// takes it from.
async fn next_backfill_position(conn: &mut AsyncPgConnection) -> i64 {
    let taken: Position = diesel::sql_query("SELECT nextval('backfill_position_seq') AS position")
        .get_result(conn)
        .await
        .unwrap();
    taken.position
}

/// An event stored the way a federation writer would store it.
struct Foreign<'a> {
    event_id: &'a str,
    room: &'a str,
    sender: String,
    kind: &'a str,
    content: Value,
    depth: i64,
    prev_events: Vec<String>,
    /// `None`: the next position of the event stream.
    stream: Option<i64>,
    /// `None`: an outlier.
    state_group: Option<i64>,
    rejected_reason: Option<&'a str>,
    soft_failed: bool,
}

impl<'a> Foreign<'a> {
    /// A message at `depth` after `prev_events`, with the room's current state.
    async fn message(
        conn: &mut AsyncPgConnection,
        event_id: &'a str,
        room: &'a str,
        body: &str,
        depth: i64,
        prev_events: Vec<String>,
    ) -> Self {
        Foreign {
            event_id,
            room,
            sender: "@mallory:elsewhere.example".to_owned(),
            kind: "m.room.message",
            content: json!({ "msgtype": "m.text", "body": body }),
            depth,
            prev_events,
            stream: None,
            state_group: Some(tip(conn, room).await.current_state_group),
            rejected_reason: None,
            soft_failed: false,
        }
    }

    async fn store(self, conn: &mut AsyncPgConnection) -> i64 {
        conn.batch_execute("BEGIN").await.unwrap();
        let stream = match self.stream {
            Some(stream) => stream,
            None => next_stream_position(conn).await,
        };
        let pdu = json!({
            "type": self.kind,
            "room_id": self.room,
            "sender": self.sender,
            "content": self.content,
            "origin_server_ts": 1_700_000_000_000_i64,
            "depth": self.depth,
            "prev_events": self.prev_events,
            "auth_events": [],
            "hashes": { "sha256": "x" },
            "signatures": {},
        });
        diesel::sql_query(
            "INSERT INTO events (event_id, room_id, stream_ordering, depth, sender, event_type, \
                 origin_server_ts, pdu, state_group, outlier, rejected_reason, soft_failed) \
             VALUES ($1, $2, $3, $4, $5, $6, 1700000000000, $7, $8, $9, $10, $11)",
        )
        .bind::<Text, _>(self.event_id)
        .bind::<Text, _>(self.room)
        .bind::<BigInt, _>(stream)
        .bind::<BigInt, _>(self.depth)
        .bind::<Text, _>(&self.sender)
        .bind::<Text, _>(self.kind)
        .bind::<diesel::sql_types::Jsonb, _>(&pdu)
        .bind::<Nullable<BigInt>, _>(self.state_group)
        .bind::<Bool, _>(self.state_group.is_none())
        .bind::<Nullable<Text>, _>(self.rejected_reason)
        .bind::<Bool, _>(self.soft_failed)
        .execute(conn)
        .await
        .unwrap();
        conn.batch_execute("COMMIT").await.unwrap();
        stream
    }
}

/// Records a relation row for a stored event, as the writer does for one it serves (the worst
/// case for the read paths: a row they must ignore).
async fn store_relation(
    conn: &mut AsyncPgConnection,
    event_id: &str,
    relates_to: &str,
    rel_type: &str,
    room: &str,
    stream: i64,
) {
    diesel::sql_query(
        "INSERT INTO event_relations (event_id, relates_to, rel_type, room_id, sender, \
             event_type, stream_ordering) \
         VALUES ($1, $2, $3, $4, '@mallory:elsewhere.example', 'm.room.message', $5)",
    )
    .bind::<Text, _>(event_id)
    .bind::<Text, _>(relates_to)
    .bind::<Text, _>(rel_type)
    .bind::<Text, _>(room)
    .bind::<BigInt, _>(stream)
    .execute(conn)
    .await
    .unwrap();
}

async fn send(client: &Client, room: &str, txn: &str, content: Value) -> String {
    let path = format!(
        "/_matrix/client/v3/rooms/{}/send/m.room.message/{}",
        enc(room),
        enc(txn)
    );
    client.put(&path, content).await.ok()["event_id"]
        .as_str()
        .expect("event_id")
        .to_owned()
}

async fn say(client: &Client, room: &str, txn: &str) -> String {
    send(
        client,
        room,
        txn,
        json!({ "msgtype": "m.text", "body": txn }),
    )
    .await
}

fn event_ids(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| e["event_id"].as_str().map(str::to_owned))
        .collect()
}

fn timeline_ids(sync: &Value, room: &str) -> Vec<String> {
    event_ids(
        sync["rooms"]["join"][room]["timeline"]["events"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default(),
    )
}

/// One `/messages` page.
async fn messages(client: &Client, room: &str, query: &str) -> Value {
    client
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/messages?{query}",
            enc(room)
        ))
        .await
        .ok()
}

const FULL_TIMELINE: &str = r#"{"room":{"timeline":{"limit":100}}}"#;

#[tokio::test]
async fn sent_events_form_one_chain_and_leave_one_forward_extremity() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    let bob = server.register("bob").await;
    bob.join(&room).await.ok();
    for n in 0..3 {
        say(&alice, &room, &format!("m{n}")).await;
        say(&bob, &room, &format!("b{n}")).await;
    }
    let mut conn = server.db().await;
    let events = assert_one_chain(&mut conn, &room).await;
    let last = events.last().unwrap();
    let tip = tip(&mut conn, &room).await;
    assert_eq!(tip.forward_extremities, vec![last.event_id.clone()]);
    assert_eq!(tip.tip_depth, last.depth);
}

/// Checks that a room's events, in stream order, each follow the one before (their only prev
/// event, one deeper) and name only earlier events as auth events; returns them.
async fn assert_one_chain(conn: &mut AsyncPgConnection, room: &str) -> Vec<Stored> {
    let events = room_events(conn, room).await;
    assert!(events.len() > 5, "createRoom's events and the messages");
    for (n, event) in events.iter().enumerate() {
        let prev: Vec<String> = serde_json::from_str(&event.prev_events).unwrap();
        let auth: Vec<String> = serde_json::from_str(&event.auth_events).unwrap();
        let earlier = &events[..n];
        match earlier.last() {
            None => assert!(prev.is_empty(), "the create event has no prev events"),
            Some(before) => {
                assert_eq!(
                    prev,
                    std::slice::from_ref(&before.event_id),
                    "{}",
                    event.event_id
                );
                assert_eq!(event.depth, before.depth + 1, "{}", event.event_id);
            }
        }
        for id in &auth {
            assert!(
                earlier.iter().any(|e| &e.event_id == id),
                "auth event {id} of {}",
                event.event_id
            );
        }
    }
    events
}

#[tokio::test]
async fn reverting_the_edge_tables_removal_gives_stored_events_their_edges_from_their_pdus() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    for n in 0..3 {
        say(&alice, &room, &format!("m{n}")).await;
    }
    let mut conn = server.db().await;
    conn.batch_execute(include_str!(
        "../../migrations/2026-12-05-000039_drop_event_edges/down.sql"
    ))
    .await
    .expect("down.sql over stored events");
    let events = room_events(&mut conn, &room).await;
    for event in &events {
        let mut prev: Vec<String> = serde_json::from_str(&event.prev_events).unwrap();
        let mut auth: Vec<String> = serde_json::from_str(&event.auth_events).unwrap();
        prev.sort();
        auth.sort();
        let prev_edges = ids(
            &mut conn,
            "SELECT COALESCE(array_agg(prev_event_id ORDER BY prev_event_id), '{}') AS ids \
             FROM event_edges WHERE event_id = $1",
            &event.event_id,
        )
        .await;
        let auth_edges = ids(
            &mut conn,
            "SELECT COALESCE(array_agg(auth_event_id ORDER BY auth_event_id), '{}') AS ids \
             FROM event_auth_edges WHERE event_id = $1",
            &event.event_id,
        )
        .await;
        assert_eq!(prev_edges, prev, "prev edges of {}", event.event_id);
        assert_eq!(auth_edges, auth, "auth edges of {}", event.event_id);
    }
    conn.batch_execute(include_str!(
        "../../migrations/2026-12-05-000039_drop_event_edges/up.sql"
    ))
    .await
    .expect("up.sql");
}

#[tokio::test]
async fn rejected_soft_failed_and_outlier_events_reach_no_client_read_path() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    let root = send(
        &alice,
        &room,
        "root",
        json!({ "msgtype": "m.text", "body": "the fruit bowl" }),
    )
    .await;
    let first = alice.sync(None, 0, Some(FULL_TIMELINE)).await;
    let since = first["next_batch"].as_str().unwrap().to_owned();

    let mut conn = server.db().await;
    let depth = stored(&mut conn, &root).await.depth;
    let hidden = ["$rejected", "$softfailed", "$outlier"];
    for (n, event_id) in hidden.into_iter().enumerate() {
        let mut event = Foreign::message(
            &mut conn,
            event_id,
            &room,
            "forbidden fruit",
            depth + 1,
            vec![root.clone()],
        )
        .await;
        event.content["m.relates_to"] = json!({ "rel_type": "m.reference", "event_id": root });
        match n {
            0 => event.rejected_reason = Some("auth_error"),
            1 => event.soft_failed = true,
            _ => event.state_group = None,
        }
        let stream = event.store(&mut conn).await;
        store_relation(&mut conn, event_id, &root, "m.reference", &room, stream).await;
    }
    let reference = send(
        &alice,
        &room,
        "ref",
        json!({
            "msgtype": "m.text",
            "body": "more fruit",
            "m.relates_to": { "rel_type": "m.reference", "event_id": root },
        }),
    )
    .await;
    let after = say(&alice, &room, "after").await;
    let hidden_in = |seen: &[String]| hidden.iter().any(|id| seen.iter().any(|s| s == id));

    // /sync, initial and incremental.
    let full = alice.sync(None, 0, Some(FULL_TIMELINE)).await;
    let incremental = alice.sync(Some(&since), 0, Some(FULL_TIMELINE)).await;
    for sync in [&full, &incremental] {
        let timeline = timeline_ids(sync, &room);
        assert!(timeline.contains(&after), "{timeline:?}");
        assert!(!hidden_in(&timeline), "{timeline:?}");
    }
    assert_eq!(
        timeline_ids(&incremental, &room),
        vec![reference.clone(), after.clone()]
    );

    // /messages, both ways.
    let history = event_ids(&alice.page_back(&room, None, None, 2).await);
    assert!(history.contains(&root) && history.contains(&after));
    assert!(!hidden_in(&history), "{history:?}");
    let forwards = messages(&alice, &room, "dir=f&limit=100").await;
    let forwards = event_ids(forwards["chunk"].as_array().unwrap());
    assert_eq!(forwards.len(), history.len());
    assert!(!hidden_in(&forwards), "{forwards:?}");

    // /context around the event after them, and of each of them.
    let context = alice
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/context/{}?limit=10",
            enc(&room),
            enc(&after)
        ))
        .await
        .ok();
    let before = event_ids(context["events_before"].as_array().unwrap());
    assert!(before.contains(&root), "{before:?}");
    assert!(!hidden_in(&before), "{before:?}");
    for event_id in hidden {
        alice
            .get(&format!(
                "/_matrix/client/v3/rooms/{}/context/{}",
                enc(&room),
                enc(event_id)
            ))
            .await
            .assert_error(404, "M_NOT_FOUND");
        // /event, and a receipt on it.
        alice
            .get_event(&room, event_id)
            .await
            .assert_error(404, "M_NOT_FOUND");
        alice
            .post(
                &format!(
                    "/_matrix/client/v3/rooms/{}/receipt/m.read/{}",
                    enc(&room),
                    enc(event_id)
                ),
                json!({}),
            )
            .await
            .assert_error(404, "M_NOT_FOUND");
    }

    // /relations, and the references bundled with the root.
    let relations = alice
        .get(&format!(
            "/_matrix/client/v1/rooms/{}/relations/{}",
            enc(&room),
            enc(&root)
        ))
        .await
        .ok();
    assert_eq!(
        event_ids(relations["chunk"].as_array().unwrap()),
        vec![reference.clone()]
    );
    let bundled = alice.get_event(&room, &root).await.ok();
    assert_eq!(
        bundled["unsigned"]["m.relations"]["m.reference"]["chunk"],
        json!([{ "event_id": reference }])
    );

    // /search.
    let results = alice
        .post(
            "/_matrix/client/v3/search",
            json!({ "search_categories": { "room_events": { "search_term": "fruit" } } }),
        )
        .await
        .ok();
    let found: Vec<String> = results["search_categories"]["room_events"]["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["result"]["event_id"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found.contains(&root) && found.contains(&reference));
    assert_eq!(
        results["search_categories"]["room_events"]["count"],
        json!(2)
    );
}

#[tokio::test]
async fn a_backfilled_event_sits_at_its_depth_in_history_and_is_never_new() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    // Shared history: a member who left sees what happened while they were joined.
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    let bob = server.register("bob").await;
    bob.join(&room).await.ok();
    let from_bob = say(&bob, &room, "bob was here").await;
    bob.room_action(&room, "leave", json!({})).await.ok();
    let m2 = say(&alice, &room, "m2").await;
    let m3 = say(&alice, &room, "m3").await;
    let m4 = say(&alice, &room, "m4").await;
    let since = alice.next_batch().await;

    // An old event between m2 and m3, fetched later by backfill: at m3's depth (ties go by
    // stream position, and backfilled positions are below every live one), with the state
    // after m2, where bob has left.
    let mut conn = server.db().await;
    let (at_m2, at_m3) = (stored(&mut conn, &m2).await, stored(&mut conn, &m3).await);
    let position = next_backfill_position(&mut conn).await;
    assert!(position < 0);
    let mut old = Foreign::message(
        &mut conn,
        "$backfilled",
        &room,
        "from the past",
        at_m3.depth,
        vec![m2.clone()],
    )
    .await;
    old.stream = Some(position);
    old.state_group = at_m2.state_group;
    old.store(&mut conn).await;
    let m5 = say(&alice, &room, "m5").await;

    let history = event_ids(&alice.page_back(&room, None, None, 3).await);
    let tail: Vec<&str> = history[history.len() - 5..]
        .iter()
        .map(String::as_str)
        .collect();
    assert_eq!(tail, [&m2, "$backfilled", &m3, &m4, &m5]);
    let forwards = messages(&alice, &room, "dir=f&limit=100").await;
    let forwards = event_ids(forwards["chunk"].as_array().unwrap());
    assert_eq!(forwards, history);

    // Never new to /sync: the incremental sync has m5 only.
    let incremental = alice.sync(Some(&since), 0, Some(FULL_TIMELINE)).await;
    assert_eq!(timeline_ids(&incremental, &room), vec![m5.clone()]);
    let full = alice.sync(None, 0, Some(FULL_TIMELINE)).await;
    assert!(!timeline_ids(&full, &room).contains(&"$backfilled".to_owned()));

    // Visibility is judged on its place in history: bob, who left before it, joined before it
    // by stream position but not after it in history, so he does not see it.
    let bobs = event_ids(&bob.page_back(&room, None, None, 10).await);
    assert!(bobs.contains(&from_bob), "{bobs:?}");
    assert!(!bobs.contains(&"$backfilled".to_owned()), "{bobs:?}");
    assert!(!bobs.contains(&m2), "{bobs:?}");
    bob.get_event(&room, "$backfilled")
        .await
        .assert_error(404, "M_NOT_FOUND");
    let event = alice.get_event(&room, "$backfilled").await.ok();
    assert_eq!(event["content"]["body"], "from the past");
}

#[tokio::test]
async fn pagination_tokens_in_both_forms_page_history() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({})).await;
    let mut sent = Vec::new();
    for n in 0..6 {
        sent.push(say(&alice, &room, &format!("m{n}")).await);
    }
    let sync = alice
        .sync(None, 0, Some(r#"{"room":{"timeline":{"limit":2}}}"#))
        .await;
    let timeline = &sync["rooms"]["join"][&room]["timeline"];
    assert_eq!(timeline_ids(&sync, &room), sent[4..].to_vec());
    let prev_batch = timeline["prev_batch"].as_str().unwrap();
    let mut conn = server.db().await;
    let m4 = stored(&mut conn, &sent[4]).await;
    assert_eq!(
        prev_batch,
        format!("t{}_{}", m4.depth, m4.stream_ordering - 1)
    );
    // The new form, from a sync's prev_batch and from /messages' own `end`.
    let page = messages(&alice, &room, &format!("dir=b&limit=2&from={prev_batch}")).await;
    assert_eq!(
        event_ids(page["chunk"].as_array().unwrap()),
        [sent[3].clone(), sent[2].clone()]
    );
    assert_eq!(page["start"], prev_batch);
    let end = page["end"].as_str().unwrap();
    let next = messages(&alice, &room, &format!("dir=b&limit=2&from={}", enc(end))).await;
    assert_eq!(
        event_ids(next["chunk"].as_array().unwrap()),
        [sent[1].clone(), sent[0].clone()]
    );
    let back = messages(&alice, &room, &format!("dir=f&limit=2&from={}", enc(end))).await;
    assert_eq!(
        event_ids(back["chunk"].as_array().unwrap()),
        [sent[2].clone(), sent[3].clone()]
    );

    // The old form, `t{stream}`, that clients may still hold: a point just after the event at
    // that position, backwards and forwards, as a start and as a limit.
    let m2 = stored(&mut conn, &sent[2]).await;
    let old = format!("t{}", m2.stream_ordering);
    let page = messages(&alice, &room, &format!("dir=b&limit=2&from={old}")).await;
    assert_eq!(
        event_ids(page["chunk"].as_array().unwrap()),
        [sent[2].clone(), sent[1].clone()]
    );
    let page = messages(&alice, &room, &format!("dir=f&limit=2&from={old}")).await;
    assert_eq!(
        event_ids(page["chunk"].as_array().unwrap()),
        [sent[3].clone(), sent[4].clone()]
    );
    let m0 = stored(&mut conn, &sent[0]).await;
    let page = messages(
        &alice,
        &room,
        &format!("dir=b&limit=10&from={old}&to=t{}", m0.stream_ordering),
    )
    .await;
    assert_eq!(
        event_ids(page["chunk"].as_array().unwrap()),
        [sent[2].clone(), sent[1].clone()]
    );
    // A sync token is a point in stream order too.
    let next_batch = sync["next_batch"].as_str().unwrap();
    let page = messages(&alice, &room, &format!("dir=b&limit=1&from={next_batch}")).await;
    assert_eq!(
        event_ids(page["chunk"].as_array().unwrap()),
        [sent[5].clone()]
    );

    for bad in ["t1_x", "t-1", "tx", "t1_2_3"] {
        alice
            .get(&format!(
                "/_matrix/client/v3/rooms/{}/messages?dir=b&from={bad}",
                enc(&room)
            ))
            .await
            .assert_error(400, "M_INVALID_PARAM");
    }
}

#[tokio::test]
async fn a_local_event_follows_every_forward_extremity_and_replaces_them() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    let m1 = say(&alice, &room, "m1").await;
    let mut conn = server.db().await;
    let at_m1 = stored(&mut conn, &m1).await;
    let before_m1: Vec<String> = serde_json::from_str(&at_m1.prev_events).unwrap();

    // A remote event beside m1 (both follow the event before m1), deeper than m1: the room's
    // extremities are now both. (The room's tip depth is left as it was: a new event's depth
    // comes from its prev events.)
    let fork = Foreign::message(
        &mut conn,
        "$fork",
        &room,
        "from elsewhere",
        at_m1.depth + 5,
        before_m1,
    )
    .await;
    fork.store(&mut conn).await;
    diesel::sql_query(
        "UPDATE rooms SET forward_extremities = ARRAY[$2, '$fork'] WHERE room_id = $1",
    )
    .bind::<Text, _>(&room)
    .bind::<Text, _>(&m1)
    .execute(&mut conn)
    .await
    .unwrap();

    let m2 = say(&alice, &room, "m2").await;
    let at_m2 = stored(&mut conn, &m2).await;
    let mut prev: Vec<String> = serde_json::from_str(&at_m2.prev_events).unwrap();
    prev.sort();
    let mut expected = vec![m1.clone(), "$fork".to_owned()];
    expected.sort();
    assert_eq!(prev, expected);
    assert_eq!(at_m2.depth, at_m1.depth + 6, "one more than the deepest");
    let tip = tip(&mut conn, &room).await;
    assert_eq!(tip.forward_extremities, vec![m2.clone()]);
    assert_eq!(tip.tip_depth, at_m2.depth);

    // And the room goes on as one chain.
    let m3 = say(&alice, &room, "m3").await;
    let at_m3 = stored(&mut conn, &m3).await;
    assert_eq!(at_m3.prev_events, format!("[\"{m2}\"]"));
    assert_eq!(at_m3.depth, at_m2.depth + 1);
}
