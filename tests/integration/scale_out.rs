//! Scale-out: two server processes, A and B, on one database and one data directory, as a
//! deployment behind a load balancer runs them. What a client does through one process must be
//! seen, promptly, by clients served by the other. (Other two-process tests: write_path,
//! accounts, delayed_events, appservices, federation_sender, sliding_sync_extensions;
//! tokens, admin rights, media, rate limits and a start on an empty database across processes
//! are in scale_out_accounts.)

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::pushers::{Behaviour, Gateway};
use crate::sliding_sync::{list, sss};
use crate::support::{
    client::{enc, timeline},
    wait_until, Client, ExtraProcess, ServerOptions, TestServer,
};

/// A long-poll that is not woken parks this long: far beyond every "promptly" below.
const LONG_POLL_MS: u64 = 30_000;
/// What "promptly" means for a wake-up that crosses processes (NOTIFY is delivered at commit).
const PROMPTLY: Duration = Duration::from_secs(5);

/// The same client (same token and device) talking to another process.
pub(crate) fn via(client: &Client, process: &ExtraProcess) -> Client {
    let mut moved = client.clone();
    moved.base = process.base_url.clone();
    moved
}

/// The same client talking to the first process.
fn on_a(client: &Client, a: &TestServer) -> Client {
    let mut moved = client.clone();
    moved.base = a.base_url.clone();
    moved
}

/// Long-polls from `since` until `found` holds for a response, failing unless that happens
/// within [`PROMPTLY`]: a wake-up that does not cross processes leaves the poll parked for
/// [`LONG_POLL_MS`]. Returns the matching response.
async fn sync_until(
    client: &Client,
    since: &str,
    what: &str,
    found: impl Fn(&Value) -> bool,
) -> Value {
    let started = Instant::now();
    let mut since = since.to_owned();
    loop {
        let response = client.sync(Some(&since), LONG_POLL_MS, None).await;
        assert!(
            started.elapsed() < PROMPTLY,
            "{what}: not seen within {PROMPTLY:?} (last response: {response})"
        );
        if found(&response) {
            return response;
        }
        since = response["next_batch"].as_str().unwrap().to_owned();
    }
}

/// Polls `path` until it is refused with `status` and `errcode`, failing unless that happens
/// within 2 s: well under the access-token cache's 10 s lifetime, so the change that refuses
/// it must have been announced to this process, not waited out.
pub(crate) async fn refused_soon(
    client: &Client,
    path: &str,
    (status, errcode): (u16, &str),
    what: &str,
) {
    let started = Instant::now();
    loop {
        let response = client.get(path).await;
        if response.status == status {
            response.assert_error(status, errcode);
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(2), "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn next_batch(sync: &Value) -> String {
    sync["next_batch"].as_str().expect("next_batch").to_owned()
}

fn bodies(events: &[&Value]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["type"] == "m.room.message")
        .map(|e| e["content"]["body"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Alice (served by A) and Bob (served by B) in one room alice created on A.
struct TwoProcesses {
    a: TestServer,
    b: ExtraProcess,
    alice: Client,
    bob_on_b: Client,
    room: String,
}

async fn two_processes(options: ServerOptions) -> TwoProcesses {
    let a = TestServer::start_with(options).await;
    let b = a.second_process().await;
    let alice = a.register("alice").await;
    let bob_on_b = via(&a.register("bob").await, &b);
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    bob_on_b.join(&room).await.ok();
    TwoProcesses {
        a,
        b,
        alice,
        bob_on_b,
        room,
    }
}

#[tokio::test]
async fn a_long_poll_parked_on_one_process_wakes_for_a_send_on_the_other_and_tokens_cross() {
    let TwoProcesses {
        a,
        b,
        alice,
        bob_on_b,
        room,
    } = two_processes(ServerOptions::default()).await;
    let initial = next_batch(&bob_on_b.sync(None, 0, None).await);
    // A token from which a long-poll on B is seen to have read its positions (parked).
    let since = a.long_poll_token(&bob_on_b, &initial).await;
    let parked = {
        let (bob, since) = (bob_on_b.clone(), since.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let response = bob.sync(Some(&since), LONG_POLL_MS, None).await;
            (response, started.elapsed())
        })
    };
    a.wait_until_long_polls_started(&[&bob_on_b]).await;
    alice.send_text(&room, "m1", "from A").await.ok();
    let (woken, waited) = parked.await.unwrap();
    assert!(
        waited < PROMPTLY,
        "the long-poll on B waited {waited:?} for a send on A"
    );
    assert_eq!(bodies(&timeline(&woken, &room)), ["from A"], "{woken}");

    // B's token used on A, and A's on B: nothing lost, nothing repeated.
    let alice_on_b = via(&alice, &b);
    let bob_on_a = on_a(&bob_on_b, &a);
    for (n, sender) in [&alice, &alice_on_b, &alice, &alice_on_b]
        .iter()
        .enumerate()
    {
        sender
            .send_text(&room, &format!("x{n}"), &format!("x{n}"))
            .await
            .ok();
    }
    let on_a = bob_on_a.sync(Some(&next_batch(&woken)), 0, None).await;
    assert_eq!(
        bodies(&timeline(&on_a, &room)),
        ["x0", "x1", "x2", "x3"],
        "B's next_batch on A: {on_a}"
    );
    alice_on_b.send_text(&room, "y", "y").await.ok();
    let on_b = bob_on_b.sync(Some(&next_batch(&on_a)), 0, None).await;
    assert_eq!(
        bodies(&timeline(&on_b, &room)),
        ["y"],
        "A's next_batch on B: {on_b}"
    );
    // And a long-poll on A from B's token wakes for a send on B.
    let parked = {
        let (bob, since) = (bob_on_a.clone(), next_batch(&on_b));
        let room = room.clone();
        tokio::spawn(async move {
            sync_until(&bob, &since, "a send on B, on A", |s| {
                !timeline(s, &room).is_empty()
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    alice_on_b.send_text(&room, "z", "z").await.ok();
    let woken = parked.await.unwrap();
    assert_eq!(bodies(&timeline(&woken, &room)), ["z"], "{woken}");
}

/// Each process keeps users' membership lists between syncs. A change written through the
/// other process must show in the very next sync here: a join, a kick, and forgetting a room
/// (which writes no event at all).
#[tokio::test]
async fn membership_lists_kept_by_one_process_follow_changes_made_through_the_other() {
    let TwoProcesses {
        a,
        b: _b,
        alice,
        bob_on_b,
        room,
    } = two_processes(ServerOptions::default()).await;
    let bob_on_a = on_a(&bob_on_b, &a);
    // Bob's room list on B, each time from a fresh connection.
    let listed_on_b = || async {
        let response = sss(&bob_on_b, None, 0, list(99, 0, json!([]))).await.ok();
        let mut ids: Vec<String> = response["lists"]["all"]["ops"][0]["room_ids"]
            .as_array()
            .map(|ids| {
                ids.iter()
                    .map(|id| id.as_str().unwrap().to_owned())
                    .collect()
            })
            .unwrap_or_default();
        ids.sort();
        ids
    };
    assert_eq!(listed_on_b().await, [room.as_str()]);

    let second = alice.create_room(json!({ "preset": "public_chat" })).await;
    bob_on_a.join(&second).await.ok();
    let mut both = vec![room.clone(), second.clone()];
    both.sort();
    assert_eq!(listed_on_b().await, both, "joined through A");

    // Kicked: still listed.
    alice
        .room_action(&room, "kick", json!({ "user_id": bob_on_b.user_id }))
        .await
        .ok();
    assert_eq!(listed_on_b().await, both, "kicked through A");

    // Forgotten: gone, although no event was written.
    bob_on_a.room_action(&room, "forget", json!({})).await.ok();
    assert_eq!(listed_on_b().await, [second], "forgotten through A");
}

/// Each process keeps state events in memory for initial syncs, as their client JSON but for
/// the age. Served from memory, a sync's state is what the database gave, the ages going on; a
/// state event redacted through the other process must be served redacted by the very next
/// initial sync here, a member event and another kind alike.
#[tokio::test]
async fn state_kept_in_memory_by_one_process_is_served_redacted_after_a_redaction_on_the_other() {
    let TwoProcesses {
        a: _a,
        b,
        alice,
        bob_on_b,
        room,
    } = two_processes(ServerOptions::default()).await;
    let alice_on_b = via(&alice, &b);
    let secret = alice
        .put_state(
            &room,
            "org.example.secret",
            "",
            json!({ "word": "swordfish" }),
        )
        .await
        .ok()["event_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let renamed = bob_on_b
        .put_state(
            &room,
            "m.room.member",
            &bob_on_b.user_id,
            json!({ "membership": "join", "displayname": "Bob Secret" }),
        )
        .await
        .ok()["event_id"]
        .as_str()
        .unwrap()
        .to_owned();
    alice.send_text(&room, "t1", "after the state").await.ok();
    // Alice's initial syncs on A: timeline limit 1, so both events come as state.
    let filter = json!({ "room": { "timeline": { "limit": 1 } } }).to_string();
    let state_on_a = || async {
        let sync = alice.sync(None, 0, Some(&filter)).await;
        let state = sync["rooms"]["join"][&room]["state"]["events"].clone();
        let content = |event_id: &str| {
            state
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["event_id"] == event_id)
                .map(|e| e["content"].clone())
                .unwrap_or_else(|| panic!("{event_id} not in the state: {sync}"))
        };
        (content(&secret), content(&renamed))
    };
    // Served from what the first kept (the first initial sync on A reads the state from the
    // database and serves what it keeps; the unit tests hold that to the rendering from parts),
    // the second sync's state is the first's, in the same order, but for the ages, which go on.
    let without_ages = |sync: &Value| {
        let mut events = sync["rooms"]["join"][&room]["state"]["events"].clone();
        let ages: Vec<i64> = events
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .map(|e| {
                e["unsigned"]
                    .as_object_mut()
                    .unwrap()
                    .remove("age")
                    .unwrap()
            })
            .map(|age| age.as_i64().unwrap())
            .collect();
        (events, ages)
    };
    let (first, first_ages) = without_ages(&alice.sync(None, 0, Some(&filter)).await);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (second, second_ages) = without_ages(&alice.sync(None, 0, Some(&filter)).await);
    assert_eq!(first, second);
    assert!(first.as_array().unwrap().len() >= 6, "{first}");
    assert!(
        first_ages
            .iter()
            .zip(&second_ages)
            .all(|(a, b)| b >= &(a + 20)),
        "{first_ages:?} {second_ages:?}"
    );
    for _ in 0..2 {
        let (secret_content, member_content) = state_on_a().await;
        assert_eq!(secret_content, json!({ "word": "swordfish" }));
        assert_eq!(member_content["displayname"], "Bob Secret");
    }

    for (event_id, txn) in [(&secret, "r1"), (&renamed, "r2")] {
        let path = format!(
            "/_matrix/client/v3/rooms/{}/redact/{}/{txn}",
            enc(&room),
            enc(event_id)
        );
        alice_on_b.put(&path, json!({})).await.ok();
        alice_on_b
            .send_text(&room, txn, "after the redaction")
            .await
            .ok();
        let (secret_content, member_content) = state_on_a().await;
        assert_eq!(secret_content, json!({}), "after {txn}");
        assert_eq!(
            member_content,
            if txn == "r2" {
                json!({ "membership": "join" })
            } else {
                json!({ "membership": "join", "displayname": "Bob Secret" })
            },
            "after {txn}"
        );
    }
}

#[tokio::test]
async fn typing_receipts_to_device_account_data_and_presence_set_on_one_process_reach_the_other() {
    let TwoProcesses {
        a,
        b: _b,
        alice,
        bob_on_b,
        room,
    } = two_processes(ServerOptions::default()).await;
    let bob_on_a = on_a(&bob_on_b, &a);
    let mut since = next_batch(&bob_on_b.sync(None, 0, None).await);

    // Typing, held in memory by each process, set on A.
    alice
        .put(
            &format!(
                "/_matrix/client/v3/rooms/{}/typing/{}",
                enc(&room),
                enc(&alice.user_id)
            ),
            json!({ "typing": true, "timeout": 30_000 }),
        )
        .await
        .ok();
    let seen = sync_until(&bob_on_b, &since, "alice typing (set on A) on B", |s| {
        s["rooms"]["join"][&room]["ephemeral"]["events"]
            .as_array()
            .is_some_and(|events| {
                events.iter().any(|e| {
                    e["type"] == "m.typing"
                        && e["content"]["user_ids"] == json!([alice.user_id.clone()])
                })
            })
    })
    .await;
    since = next_batch(&seen);

    // Two messages from alice make two unread notifications for bob, on B.
    let mut last = String::new();
    for n in 0..2 {
        last = alice.send_text(&room, &format!("u{n}"), "ping").await.ok()["event_id"]
            .as_str()
            .unwrap()
            .to_owned();
    }
    let seen = sync_until(&bob_on_b, &since, "two unread messages on B", |s| {
        s["rooms"]["join"][&room]["unread_notifications"]["notification_count"] == 2
    })
    .await;
    since = next_batch(&seen);
    // Bob reads them on A (another of his clients behind the balancer): B's counts drop.
    bob_on_a
        .post(
            &format!(
                "/_matrix/client/v3/rooms/{}/receipt/m.read/{}",
                enc(&room),
                enc(&last)
            ),
            json!({}),
        )
        .await
        .ok();
    let seen = sync_until(&bob_on_b, &since, "the receipt sent on A on B", |s| {
        let joined = &s["rooms"]["join"][&room];
        joined["unread_notifications"]["notification_count"] == 0
            && joined["ephemeral"]["events"]
                .as_array()
                .is_some_and(|events| events.iter().any(|e| e["type"] == "m.receipt"))
    })
    .await;
    let receipt = seen["rooms"]["join"][&room]["ephemeral"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "m.receipt")
        .unwrap();
    assert!(
        receipt["content"][&last]["m.read"][&bob_on_b.user_id].is_object(),
        "{receipt}"
    );
    since = next_batch(&seen);

    // A to-device message sent on A reaches bob's device, which syncs on B.
    alice
        .put(
            "/_matrix/client/v3/sendToDevice/m.scale.test/t1",
            json!({ "messages": { &bob_on_b.user_id: { &bob_on_b.device_id: { "n": 1 } } } }),
        )
        .await
        .ok();
    let seen = sync_until(&bob_on_b, &since, "alice's to-device message on B", |s| {
        s["to_device"]["events"]
            .as_array()
            .is_some_and(|events| events.iter().any(|e| e["type"] == "m.scale.test"))
    })
    .await;
    let message = seen["to_device"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "m.scale.test")
        .unwrap();
    assert_eq!(message["sender"], alice.user_id.as_str());
    assert_eq!(message["content"]["n"], 1);
    since = next_batch(&seen);

    // Account data bob sets through A appears in his sync on B.
    bob_on_a
        .put(
            &format!(
                "/_matrix/client/v3/user/{}/account_data/org.example.scale",
                enc(&bob_on_a.user_id)
            ),
            json!({ "set": "on A" }),
        )
        .await
        .ok();
    let seen = sync_until(&bob_on_b, &since, "account data set on A on B", |s| {
        s["account_data"]["events"]
            .as_array()
            .is_some_and(|events| {
                events
                    .iter()
                    .any(|e| e["type"] == "org.example.scale" && e["content"]["set"] == "on A")
            })
    })
    .await;
    since = next_batch(&seen);

    // Presence alice sets on A (kept in PostgreSQL) reaches bob on B.
    alice
        .put(
            &format!("/_matrix/client/v3/presence/{}/status", enc(&alice.user_id)),
            json!({ "presence": "unavailable", "status_msg": "away on A" }),
        )
        .await
        .ok();
    sync_until(&bob_on_b, &since, "alice's presence set on A on B", |s| {
        s["presence"]["events"].as_array().is_some_and(|events| {
            events.iter().any(|e| {
                e["sender"] == alice.user_id.as_str()
                    && e["content"]["presence"] == "unavailable"
                    && e["content"]["status_msg"] == "away on A"
            })
        })
    })
    .await;
}

#[tokio::test]
async fn a_push_gateway_gets_each_notification_once_with_both_processes_running() {
    let TwoProcesses {
        a: _a,
        b,
        alice,
        bob_on_b,
        room,
    } = two_processes(ServerOptions::default().env("MYELIN_OUTBOUND_ALLOW", "127.0.0.1/32")).await;
    // Accepts every notification from the start, and records it.
    let gateway = Gateway::start(Behaviour::FailFirst(0)).await;
    let (url, received) = (gateway.url.clone(), gateway.received.clone());
    // The pusher is set through B; alice sends through both.
    bob_on_b
        .post(
            "/_matrix/client/v3/pushers/set",
            json!({
                "pushkey": "key-1",
                "kind": "http",
                "app_id": "org.example.app",
                "app_display_name": "Example",
                "device_display_name": "Phone",
                "lang": "en",
                "data": { "url": url },
            }),
        )
        .await
        .ok();
    let alice_on_b = via(&alice, &b);
    let mut sent = Vec::new();
    for n in 0..10 {
        let sender = if n % 2 == 0 { &alice } else { &alice_on_b };
        let event = sender
            .send_text(&room, &format!("p{n}"), &format!("push {n}"))
            .await
            .ok()["event_id"]
            .as_str()
            .unwrap()
            .to_owned();
        sent.push(event);
    }
    wait_until(
        "the gateway got a notification per message",
        Duration::from_secs(20),
        || async { received.lock().unwrap().len() >= sent.len() },
    )
    .await;
    // Both processes had time to push (again) if both were pushing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut pushed: Vec<String> = received
        .lock()
        .unwrap()
        .iter()
        .map(|n| {
            n["notification"]["event_id"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    pushed.sort();
    let mut expected = sent.clone();
    expected.sort();
    assert_eq!(pushed, expected, "each event pushed exactly once");
}

#[tokio::test]
async fn a_room_created_on_one_process_and_written_on_both_reads_in_one_order_on_either() {
    let a = TestServer::start().await;
    let b = a.second_process().await;
    let alice = a.register("alice").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    let bob_on_b = via(&a.register("bob").await, &b);
    bob_on_b.join(&room).await.ok();
    let alice_on_b = via(&alice, &b);
    let bob_on_a = on_a(&bob_on_b, &a);
    // Interleaved and concurrent sends through both processes.
    let mut tasks = Vec::new();
    for (name, client) in [
        ("alice-a", alice.clone()),
        ("alice-b", alice_on_b.clone()),
        ("bob-a", bob_on_a.clone()),
        ("bob-b", bob_on_b.clone()),
    ] {
        let room = room.clone();
        tasks.push(tokio::spawn(async move {
            for n in 0..8 {
                client
                    .send_text(&room, &format!("{name}-{n}"), &format!("{name}-{n}"))
                    .await
                    .ok();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let ids = |events: Vec<Value>| -> Vec<String> {
        events
            .iter()
            .map(|e| e["event_id"].as_str().unwrap().to_owned())
            .collect()
    };
    let on_a = ids(alice.page_back(&room, None, None, 7).await);
    let on_b = ids(bob_on_b.page_back(&room, None, None, 5).await);
    assert_eq!(on_a, on_b, "/messages differs between the processes");
    let messages = alice
        .page_back(&room, None, None, 100)
        .await
        .into_iter()
        .filter(|e| e["type"] == "m.room.message")
        .count();
    assert_eq!(messages, 32);
    // A sync on B shows the same order as /messages on A.
    let synced = bob_on_b
        .sync(None, 0, Some(r#"{"room":{"timeline":{"limit":100}}}"#))
        .await;
    let synced: Vec<String> = timeline(&synced, &room)
        .iter()
        .map(|e| e["event_id"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        synced.len() >= 32 && on_a.ends_with(&synced),
        "the sync timeline on B is not /messages' order on A: {synced:?} vs {on_a:?}"
    );
}
