//! The metrics listener: the exposition format, counters that move with sends, replays and
//! syncs, labels that carry no IDs, the shipped Grafana dashboard's names, and the
//! consistency sampler's counter.

use std::{collections::BTreeSet, time::Duration};

use serde_json::json;

use crate::support::{wait_until, ServerOptions, TestServer};

/// One sample line: `name{labels} value`.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

/// A scraped page: its samples and the family names its `# TYPE` lines declare.
pub(crate) struct Scrape {
    samples: Vec<Sample>,
    families: Vec<(String, String)>,
}

/// Parses label pairs `a="x",b="y"` (values here never hold quotes or commas).
fn parse_labels(text: &str) -> Vec<(String, String)> {
    text.split("\",")
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once("=\"").expect("label=\"value\"");
            (key.to_owned(), value.trim_end_matches('"').to_owned())
        })
        .collect()
}

/// Parses the OpenMetrics text strictly enough to catch a malformed page: every line is a
/// comment of a known kind or `name{labels} number`, and the page ends with `# EOF`.
fn parse(text: &str) -> Scrape {
    let mut samples = Vec::new();
    let mut families = Vec::new();
    assert_eq!(text.lines().last(), Some("# EOF"), "no # EOF: {text}");
    for line in text.lines() {
        if let Some(comment) = line.strip_prefix("# ") {
            let mut words = comment.split(' ');
            match words.next() {
                Some("TYPE") => families.push((
                    words.next().expect("a family").to_owned(),
                    words.next().expect("a type").to_owned(),
                )),
                Some("HELP" | "UNIT" | "EOF") => {}
                other => panic!("unknown comment {other:?}: {line}"),
            }
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("name value");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value in {line}")),
        };
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, parse_labels(rest.strip_suffix('}').expect("}"))),
            None => (series, Vec::new()),
        };
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "bad name in {line}"
        );
        samples.push(Sample {
            name: name.to_owned(),
            labels,
            value,
        });
    }
    Scrape { samples, families }
}

impl Scrape {
    /// The sum of a sample over the series whose labels include `labels`.
    pub(crate) fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                labels
                    .iter()
                    .all(|(k, v)| s.labels.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|s| s.value)
            .sum()
    }

    /// Whether a sample of this name exists.
    fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|s| s.name == name)
    }

    /// Every name a query may use: sample names, and each declared family's series names
    /// (a labelled family shows no sample until it has a child).
    fn servable_names(&self) -> BTreeSet<String> {
        let mut names: BTreeSet<String> = self.samples.iter().map(|s| s.name.clone()).collect();
        for (family, kind) in &self.families {
            let suffixes: &[&str] = match kind.as_str() {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                _ => &[""],
            };
            for suffix in suffixes {
                names.insert(format!("{family}{suffix}"));
            }
        }
        names
    }
}

pub(crate) async fn scrape(server: &TestServer) -> Scrape {
    let url = format!(
        "{}/metrics",
        server.metrics_url.as_deref().expect("a metrics listener")
    );
    let response = reqwest::get(&url).await.expect("scrape");
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    parse(&response.text().await.unwrap())
}

async fn metrics_server(options: ServerOptions) -> TestServer {
    TestServer::start_with(options.env("MYELIN_METRICS_LISTEN", "127.0.0.1:0")).await
}

#[tokio::test]
async fn metrics_count_sends_replays_and_syncs_without_ids_in_labels() {
    let server = metrics_server(ServerOptions::default()).await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({})).await;
    let before = scrape(&server).await;
    let created = [("kind", "message"), ("outcome", "created")];
    let replayed = [("kind", "message"), ("outcome", "replayed")];
    let base_created = before.sum("myelin_send_requests_total", &created);
    for txn in ["m1", "m2", "m3"] {
        alice.send_text(&room, txn, "hello").await.ok();
    }
    // A retry of a transaction returns the first event and creates nothing.
    alice.send_text(&room, "m1", "hello").await.ok();
    let initial = alice.sync(None, 0, None).await;
    let token = initial["next_batch"].as_str().unwrap();
    alice.sync(Some(token), 0, None).await;
    alice.sync(Some(token), 50, None).await;
    let next = alice.sync(Some(token), 50, None).await;
    alice.sync(next["next_batch"].as_str(), 100, None).await;

    let after = scrape(&server).await;
    assert_eq!(
        after.sum("myelin_send_requests_total", &created) - base_created,
        3.0
    );
    assert_eq!(after.sum("myelin_send_requests_total", &replayed), 1.0);
    assert_eq!(
        after.sum("myelin_send_ack_seconds_count", &[("kind", "message")]),
        3.0
    );
    let send_route = "/_matrix/client/v3/rooms/{room_id}/send/{event_type}/{txn_id}";
    assert_eq!(
        after.sum(
            "myelin_http_requests_total",
            &[("method", "PUT"), ("route", send_route), ("status", "200")]
        ),
        4.0
    );
    for kind in ["initial", "incremental", "long_poll"] {
        let labels = [("api", "v3"), ("kind", kind)];
        assert!(
            after.sum("myelin_sync_requests_total", &labels) >= 1.0,
            "no {kind} sync counted"
        );
        assert!(after.sum("myelin_sync_build_seconds_count", &labels) >= 1.0);
    }
    assert!(after.sum("myelin_sync_wait_seconds_count", &[("api", "v3")]) >= 1.0);
    assert!(after.sum("myelin_sync_response_bytes_sum", &[("api", "v3")]) > 100.0);
    assert!(after.sum("myelin_sync_rooms_sum", &[("api", "v3")]) >= 1.0);
    assert_eq!(after.sum("myelin_sync_long_polls", &[]), 0.0);
    // Events written are persisted: nothing in flight once the sends are answered.
    let events = [("stream", "events")];
    assert!(after.sum("myelin_stream_persisted_upto", &events) > 0.0);
    assert_eq!(
        after.sum("myelin_stream_position", &events),
        after.sum("myelin_stream_persisted_upto", &events)
    );
    assert!(after.sum("myelin_db_pool_max_connections", &[]) >= 2.0);
    assert!(after.sum("myelin_db_pool_wait_seconds_count", &[]) > 0.0);
    assert!(
        after.sum(
            "myelin_cache_requests_total",
            &[("cache", "access_tokens"), ("result", "hit")]
        ) > 0.0
    );
    assert!(after.sum("process_resident_memory_bytes", &[]) > 1e6);
    assert!(after.sum("process_open_fds", &[]) > 3.0);
    assert!(after.has("process_cpu_seconds_total"));
    let started = after.sum("process_start_time_seconds", &[]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        (now - 600.0..=now + 5.0).contains(&started),
        "{started} vs {now}"
    );

    // No label carries a user, room or event ID (or a server name).
    for sample in &after.samples {
        for (key, value) in &sample.labels {
            assert!(
                !value.contains(['@', '!', '$', ':']),
                "{}{{{key}={value}}} leaks an ID",
                sample.name
            );
        }
    }
}

#[tokio::test]
async fn every_metric_in_the_grafana_dashboard_is_served() {
    let dashboard = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docker/grafana/myelin-dashboard.json"
    ))
    .unwrap();
    let parsed: serde_json::Value = serde_json::from_str(&dashboard).unwrap();
    assert_eq!(parsed["title"], "Myelin");
    // Every identifier that names one of our series: myelin_* or process_*.
    let mut used = BTreeSet::new();
    let bytes = dashboard.as_bytes();
    for prefix in ["myelin_", "process_"] {
        let mut from = 0;
        while let Some(at) = dashboard[from..].find(prefix) {
            let start = from + at;
            let end = dashboard[start..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(dashboard.len(), |n| start + n);
            // Not the tail of a longer identifier.
            if start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_')
            {
                used.insert(dashboard[start..end].to_owned());
            }
            from = end;
        }
    }
    assert!(used.len() >= 25, "{used:?}");

    let server = metrics_server(ServerOptions::default()).await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({})).await;
    alice.send_text(&room, "t1", "hi").await.ok();
    alice.sync(None, 0, None).await;
    let served = scrape(&server).await.servable_names();
    let missing: Vec<_> = used.difference(&served).collect();
    assert!(
        missing.is_empty(),
        "the dashboard uses unserved names: {missing:?}"
    );
}

#[tokio::test]
async fn the_metrics_listener_is_off_by_default_and_apart_from_the_client_api() {
    let server = TestServer::start().await;
    assert!(server.metrics_url.is_none());
    let response = server.client().get("/metrics").await;
    response.assert_error(404, "M_UNRECOGNIZED");
}

#[tokio::test]
async fn the_consistency_sampler_counts_a_corrupted_unread_count() {
    // 0.01 minutes: a run every 0.6 s.
    let server =
        metrics_server(ServerOptions::default().env("MYELIN_CONSISTENCY_SAMPLE_MINUTES", "0.01"))
            .await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    bob.join(&room).await.ok();
    alice.send_text(&room, "t1", "hello bob").await.ok();
    // An incremental sync asks the room-change index about bob's room: it holds it from now
    // on (it holds only the rooms asked about), so the sampler checks it.
    let first = bob.sync(None, 0, None).await;
    bob.sync(first["next_batch"].as_str(), 0, None).await;
    let unread_ok = [("check", "unread_counts"), ("result", "ok")];
    let unread_bad = [("check", "unread_counts"), ("result", "mismatch")];
    let index_ok = [("check", "room_index"), ("result", "ok")];
    // Sampled rooms of a run are counted together: wait for a run after the writes.
    wait_until(
        "the sampler checked the rooms",
        Duration::from_secs(20),
        || async {
            let scraped = scrape(&server).await;
            scraped.sum("myelin_consistency_checks_total", &unread_ok) >= 4.0
                && scraped.sum("myelin_consistency_checks_total", &index_ok) >= 1.0
        },
    )
    .await;
    let scraped = scrape(&server).await;
    assert_eq!(
        scraped.sum("myelin_consistency_checks_total", &unread_bad),
        0.0,
        "a mismatch before anything was corrupted"
    );
    assert_eq!(
        scraped.sum(
            "myelin_consistency_checks_total",
            &[("check", "room_index"), ("result", "mismatch")]
        ),
        0.0
    );

    // Bob's stored unread count is wrong from now on: his push action says "highlight".
    let corrupted = server
        .count(&format!(
            "WITH c AS (UPDATE event_push_actions SET highlight = NOT highlight \
             WHERE user_nid = (SELECT nid FROM users WHERE user_id = '{}') RETURNING 1) \
             SELECT count(*) AS n FROM c",
            bob.user_id
        ))
        .await;
    assert!(corrupted >= 1, "bob had no push action to corrupt");
    wait_until(
        "the sampler found the mismatch",
        Duration::from_secs(20),
        || async {
            scrape(&server)
                .await
                .sum("myelin_consistency_checks_total", &unread_bad)
                >= 1.0
        },
    )
    .await;

    // The room's newest event no longer counts as served: the in-memory room-change index,
    // which saw it, now disagrees with the events table.
    let hidden = server
        .count(&format!(
            "WITH c AS (UPDATE events SET soft_failed = true WHERE stream_ordering = \
             (SELECT max(stream_ordering) FROM events WHERE room_id = '{room}') \
             RETURNING 1) SELECT count(*) AS n FROM c"
        ))
        .await;
    assert_eq!(hidden, 1);
    let index_bad = [("check", "room_index"), ("result", "mismatch")];
    wait_until(
        "the sampler found the index mismatch",
        Duration::from_secs(20),
        || async {
            scrape(&server)
                .await
                .sum("myelin_consistency_checks_total", &index_bad)
                >= 1.0
        },
    )
    .await;
}

#[tokio::test]
async fn persisted_events_are_counted_once_each_by_origin() {
    let server = metrics_server(ServerOptions::default()).await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let client = [("origin", "client")];
    let by_server = [("origin", "server")];
    let persisted = "myelin_events_persisted_total";

    // One request, several events: each is counted.
    let before = scrape(&server).await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    let state = alice
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/state",
            crate::support::client::enc(&room)
        ))
        .await
        .ok();
    let created = state.as_array().unwrap().len() as f64;
    assert!(created >= 5.0, "{state}");
    let after_create = scrape(&server).await;
    assert_eq!(
        after_create.sum(persisted, &client) - before.sum(persisted, &client),
        created
    );

    // A send, its replay, and a refused send (bob is not in the room): one event.
    alice.send_text(&room, "t1", "hello").await.ok();
    alice.send_text(&room, "t1", "hello").await.ok();
    bob.send_text(&room, "t2", "let me in")
        .await
        .assert_error(403, "M_FORBIDDEN");
    let after_sends = scrape(&server).await;
    assert_eq!(
        after_sends.sum(persisted, &client) - after_create.sum(persisted, &client),
        1.0
    );

    // A deactivation's leave is written by the server on bob's behalf.
    bob.join(&room).await.ok();
    let joined = scrape(&server).await;
    assert_eq!(
        joined.sum(persisted, &client) - after_sends.sum(persisted, &client),
        1.0
    );
    bob.post(
        "/_matrix/client/v3/account/deactivate",
        json!({ "auth": bob.password_auth("password", None) }),
    )
    .await
    .ok();
    let deactivated = scrape(&server).await;
    assert_eq!(
        deactivated.sum(persisted, &by_server) - joined.sum(persisted, &by_server),
        1.0
    );
    assert_eq!(
        deactivated.sum(persisted, &client),
        joined.sum(persisted, &client)
    );
    assert_eq!(deactivated.sum(persisted, &[("origin", "federation")]), 0.0);
}

#[tokio::test]
async fn events_from_other_servers_are_counted_when_stored_and_not_when_rejected() {
    use crate::federation_rooms::{auth_for, join_through_handshake, now_ms};
    use crate::support::federation::{federated_options, free_port, state_ids, FakeServer};

    let options = federated_options(free_port()).env("MYELIN_METRICS_LISTEN", "127.0.0.1:0");
    let server = TestServer::start_with(options).await;
    let fake = FakeServer::start().await;
    let alice = server.register("alice").await;
    let eve = fake.user_id("eve");
    let room = alice
        .create_room(json!({ "preset": "public_chat", "room_version": "11" }))
        .await;
    let (join_id, depth) = join_through_handshake(&fake, &server, &room, &eve, "11").await;
    let state = state_ids(&alice, &room).await;
    let auth = auth_for(&state, "11", &eve);
    let pdu = |content: serde_json::Value, kind: &str, state_key: Option<&str>, prev: &str, n| {
        let mut pdu = json!({
            "room_id": room, "sender": eve, "type": kind, "content": content,
            "origin_server_ts": now_ms(), "depth": depth + n,
            "prev_events": [prev], "auth_events": auth,
        });
        if let Some(key) = state_key {
            pdu["state_key"] = json!(key);
        }
        fake.sign_pdu(pdu, "11")
    };
    let text = |body: &str| json!({ "msgtype": "m.text", "body": body });
    let (first, m1) = pdu(text("m1"), "m.room.message", None, &join_id, 1);
    let (second, m2) = pdu(text("m2"), "m.room.message", None, &first, 2);
    // Eve may not raise herself to admin: rejected, not stored among the room's events.
    let (rejected, raise) = pdu(
        json!({ "users": { eve.as_str(): 100 } }),
        "m.room.power_levels",
        Some(""),
        &second,
        3,
    );

    let federation = [("origin", "federation")];
    let before = scrape(&server).await;
    let answers =
        crate::federation_pdus::send_pdus(&fake, &server, "metrics", vec![m1, m2, raise]).await;
    assert_eq!(answers[&first], json!({}), "{answers}");
    assert_eq!(answers[&second], json!({}), "{answers}");
    assert!(
        answers[&rejected]["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("Rejected")),
        "{answers}"
    );
    let after = scrape(&server).await;
    assert_eq!(
        after.sum("myelin_events_persisted_total", &federation)
            - before.sum("myelin_events_persisted_total", &federation),
        2.0
    );
    assert_eq!(
        after.sum("myelin_events_persisted_total", &[("origin", "client")]),
        before.sum("myelin_events_persisted_total", &[("origin", "client")])
    );
}

#[tokio::test]
async fn delivery_is_timed_in_three_parts() {
    use crate::sliding_sync::{list, pos, sss};

    let server = metrics_server(ServerOptions::default()).await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    bob.join(&room).await.ok();
    let token = bob.next_batch().await;
    let window = list(10, 5, json!([]));
    let sliding = pos(&sss(&bob, None, 0, window.clone()).await.ok());
    let before = scrape(&server).await;

    // Bob parks a /sync and a sliding sync; alice sends once both are parked.
    let (v3, sliding_answer, ()) = tokio::join!(
        // Presence is filtered out: only the message answers this sync.
        bob.sync(
            Some(&token),
            20_000,
            Some(r#"{"presence":{"not_types":["*"]}}"#)
        ),
        sss(&bob, Some(&sliding), 20_000, window),
        async {
            wait_until("both syncs parked", Duration::from_secs(10), || async {
                scrape(&server).await.sum("myelin_sync_long_polls", &[]) >= 2.0
            })
            .await;
            alice.send_text(&room, "d1", "wake up").await.ok();
        }
    );
    let v3_events = crate::support::client::timeline(&v3, &room);
    assert!(
        v3_events.iter().any(|e| e["content"]["body"] == "wake up"),
        "{v3}"
    );
    let sliding_answer = sliding_answer.ok();
    assert!(
        sliding_answer["rooms"][&room]["timeline"]
            .as_array()
            .is_some_and(|t| t.iter().any(|e| e["content"]["body"] == "wake up")),
        "{sliding_answer}"
    );

    let after = scrape(&server).await;
    let grew =
        |name: &str, labels: &[(&str, &str)]| after.sum(name, labels) - before.sum(name, labels);
    // Part 1: the send's transaction committed.
    assert_eq!(grew("myelin_delivery_commit_seconds_count", &[]), 1.0);
    assert!(grew("myelin_delivery_commit_seconds_sum", &[]) > 0.0);
    for api in ["v3", "sliding"] {
        let labels = [("api", api)];
        // Part 2: each parked sync woke for the notification; part 3: and answered.
        assert!(
            grew("myelin_delivery_wake_seconds_count", &labels) >= 1.0,
            "no {api} wake-up timed"
        );
        assert_eq!(
            grew("myelin_delivery_respond_seconds_count", &labels),
            1.0,
            "{api}"
        );
        let respond = grew("myelin_delivery_respond_seconds_sum", &labels);
        assert!(respond > 0.0 && respond < 10.0, "{api}: {respond}");
        let wake = grew("myelin_delivery_wake_seconds_sum", &labels);
        assert!(wake > 0.0 && wake < 10.0, "{api}: {wake}");
    }
    // Syncs answered without parking have no wake-up to time.
    bob.sync(Some(&token), 0, None).await;
    let unparked = scrape(&server).await;
    assert_eq!(
        unparked.sum("myelin_delivery_respond_seconds_count", &[("api", "v3")]),
        after.sum("myelin_delivery_respond_seconds_count", &[("api", "v3")])
    );
}

#[tokio::test]
async fn database_statements_are_timed_by_kind() {
    let server = metrics_server(ServerOptions::default()).await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({})).await;
    let before = scrape(&server).await;
    alice.send_text(&room, "s1", "hello").await.ok();
    alice.sync(None, 0, None).await;
    let after = scrape(&server).await;
    let grew = |labels: &[(&str, &str)]| {
        after.sum("myelin_db_query_seconds_count", labels)
            - before.sum("myelin_db_query_seconds_count", labels)
    };
    // The send inserted in a transaction it began and committed; the sync selected.
    for statement in ["select", "insert", "transaction"] {
        assert!(
            grew(&[("statement", statement)]) >= 1.0,
            "no {statement} timed"
        );
    }
    let select_time = after.sum("myelin_db_query_seconds_sum", &[("statement", "select")])
        - before.sum("myelin_db_query_seconds_sum", &[("statement", "select")]);
    assert!(select_time > 0.0 && select_time < 30.0, "{select_time}");
    // Only the fixed kinds, never SQL text.
    let kinds = [
        "select",
        "insert",
        "update",
        "delete",
        "transaction",
        "other",
    ];
    for sample in after
        .samples
        .iter()
        .filter(|s| s.name == "myelin_db_query_seconds_count")
    {
        assert_eq!(sample.labels.len(), 1, "{sample:?}");
        let (key, kind) = &sample.labels[0];
        assert_eq!(key, "statement");
        assert!(kinds.contains(&kind.as_str()), "{kind}");
    }
}

/// A table filled after its last `ANALYZE` gets fresh planner statistics from the server
/// within seconds, whether or not autovacuum runs (it is off on the CI machine's
/// PostgreSQL), and the refresh is counted; the search index's pending list is merged too.
#[tokio::test]
async fn tables_filled_since_their_last_analyze_get_fresh_statistics() {
    let server = metrics_server(ServerOptions::default()).await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({})).await;
    for i in 0..120 {
        alice
            .send_text(&room, &format!("t{i}"), "filling the events table")
            .await
            .ok();
    }
    // PostgreSQL publishes a session's row counts up to ten seconds after the fact; the
    // server then looks every five. Its last `ANALYZE` may come before the last sends, but
    // not before the table held (126 - 50) / 1.1 rows, or what came after would exceed the
    // threshold: so the planner ends up counting at least 69.
    let planned_rows = "SELECT reltuples::bigint AS n FROM pg_class WHERE relname = 'events'";
    wait_until(
        "the planner counts the events table's rows",
        Duration::from_secs(40),
        || async { server.count(planned_rows).await >= 69 },
    )
    .await;
    assert!(
        scrape(&server)
            .await
            .sum("myelin_statistics_refreshes_total", &[])
            >= 1.0
    );
    // The sends went to the search index's pending list, which every search reads whole and
    // `ANALYZE` leaves alone. Two of the server's rounds later it has been merged: merging it
    // here then finds no page left (with autovacuum off, nothing else would merge it).
    tokio::time::sleep(Duration::from_secs(11)).await;
    let merged_here = "SELECT gin_clean_pending_list('events_body_vector_idx'::regclass) AS n";
    assert_eq!(server.count(merged_here).await, 0);
}
