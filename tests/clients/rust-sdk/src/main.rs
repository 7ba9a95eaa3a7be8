//! A real sliding-sync client against Myelin: matrix-sdk's `SyncService` and matrix-sdk-ui's
//! `RoomListService` and `Timeline`, the way Element X drives them. Other users and devices act
//! over plain HTTP; every step is an assertion with a deadline.
//!
//! Usage: myelin-sdk-client http://127.0.0.1:PORT

mod http;

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context, Result};
use eyeball::Subscriber;
use eyeball_im::Vector;
use futures_util::{pin_mut, StreamExt};
use http::{Http, Session};
use matrix_sdk::{
    ruma::{events::room::message::RoomMessageEventContent, OwnedRoomId, RoomId},
    sliding_sync::VersionBuilder,
    Client, RoomState,
};
use matrix_sdk_ui::{
    room_list_service::{filters, RoomListItem, RoomListLoadingState},
    sync_service::SyncService,
    timeline::{RoomExt, Timeline},
};
use serde_json::json;

const PASSWORD: &str = "correct horse battery staple";
/// How long one step may take before it fails.
const STEP: Duration = Duration::from_secs(30);
/// The SDK's long-poll timeout: how long its encryption loop may wait before its next turn.
const LONG_POLL: Duration = Duration::from_secs(30);
/// How long the whole scenario may take.
const WHOLE: Duration = Duration::from_secs(300);
const ROOMS: usize = 50;

#[tokio::main]
async fn main() {
    let url = std::env::args()
        .nth(1)
        .expect("usage: myelin-sdk-client SERVER_URL");
    // MYELIN_SDK_TRACE=matrix_sdk::event_cache=trace,matrix_sdk::sliding_sync=debug (for example)
    // shows what the SDK did, on stderr.
    if let Ok(targets) = std::env::var("MYELIN_SDK_TRACE") {
        use tracing_subscriber::prelude::*;
        let filter: tracing_subscriber::filter::Targets =
            targets.parse().expect("MYELIN_SDK_TRACE: target=level,...");
        tracing_subscriber::registry()
            .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
            .with(filter)
            .init();
    }
    match tokio::time::timeout(WHOLE, scenario(&url)).await {
        Ok(Ok(())) => println!("matrix-rust-sdk scenario passed"),
        Ok(Err(error)) => {
            eprintln!("FAIL: {error:#}");
            std::process::exit(1);
        }
        Err(_) => {
            eprintln!("FAIL: the scenario took longer than {WHOLE:?}");
            std::process::exit(1);
        }
    }
}

/// When the scenario started: each step's line says how far in it passed.
static STARTED: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

fn ok(what: &str) {
    let elapsed = STARTED.get_or_init(Instant::now).elapsed();
    println!("ok - {what} ({:.1} s)", elapsed.as_secs_f64());
}

/// Polls `check` until it passes or the step's deadline; the error names the step and the last
/// reason it did not pass.
async fn eventually(what: &str, mut check: impl FnMut() -> Result<(), String>) -> Result<()> {
    let deadline = Instant::now() + STEP;
    loop {
        match check() {
            Ok(()) => {
                ok(what);
                return Ok(());
            }
            Err(why) if Instant::now() > deadline => bail!("{what}: not within {STEP:?}: {why}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// One room as the SDK shows it in the room list.
#[derive(Debug)]
struct Row {
    id: OwnedRoomId,
    name: String,
    notifications: u64,
    highlights: u64,
    state: RoomState,
}

/// The room list as a UI shows it: the entries of `RoomListService`'s all-rooms list (not left,
/// sorted by the SDK), kept up to date from its stream of diffs.
struct RoomListView {
    entries: Arc<Mutex<Vector<RoomListItem>>>,
    /// Carries the list's `count` from the server (`maximum_number_of_rooms`).
    loading: Subscriber<RoomListLoadingState>,
}

impl RoomListView {
    fn spawn(room_list: matrix_sdk_ui::room_list_service::RoomList) -> Self {
        let entries = Arc::new(Mutex::new(Vector::new()));
        let shared = entries.clone();
        let loading = room_list.loading_state();
        tokio::spawn(async move {
            let (stream, controller) = room_list.entries_with_dynamic_adapters(1000);
            controller.set_filter(Box::new(filters::new_filter_non_left()));
            pin_mut!(stream);
            while let Some(diffs) = stream.next().await {
                let mut entries = shared.lock().unwrap();
                for diff in diffs {
                    diff.apply(&mut entries);
                }
            }
        });
        RoomListView { entries, loading }
    }

    fn rows(&self) -> Vec<Row> {
        self.entries
            .lock()
            .unwrap()
            .iter()
            .map(|room| {
                let counts = room.unread_notification_counts();
                Row {
                    id: room.room_id().to_owned(),
                    name: room
                        .cached_display_name()
                        .map(|name| name.to_string())
                        .unwrap_or_default(),
                    notifications: counts.notification_count,
                    highlights: counts.highlight_count,
                    state: room.state(),
                }
            })
            .collect()
    }

    fn row(&self, room_id: &str) -> Option<Row> {
        self.rows()
            .into_iter()
            .find(|row| row.id.as_str() == room_id)
    }
}

async fn sdk_client(url: &str, localpart: &str, device: &str) -> Result<Client> {
    let client = Client::builder()
        .homeserver_url(url)
        // As Element X does: sliding sync only where /versions advertises it.
        .sliding_sync_version_builder(VersionBuilder::DiscoverNative)
        .build()
        .await
        .context(
            "build the matrix-sdk client (does /versions advertise simplified sliding sync?)",
        )?;
    client
        .matrix_auth()
        .login_username(localpart, PASSWORD)
        .initial_device_display_name(device)
        .send()
        .await
        .with_context(|| format!("{localpart} logs in with matrix-sdk"))?;
    Ok(client)
}

async fn start_sync(client: &Client) -> Result<SyncService> {
    let sync_service = SyncService::builder(client.clone())
        .build()
        .await
        .context("build SyncService")?;
    sync_service.start().await;
    Ok(sync_service)
}

struct SeededRoom {
    id: String,
    name: String,
    /// Bob's messages since alice joined, none of them read: the server's notification count.
    unread: u64,
    /// Bob's mentions of alice among them: the server's highlight count.
    highlights: u64,
    bodies: Vec<String>,
}

async fn scenario(url: &str) -> Result<()> {
    STARTED.get_or_init(Instant::now);
    let http = Http::new(url);
    let suffix = format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_micros()
            & 0xff_ffff
    );
    let alice_local = format!("sdkalice{suffix}");
    let carol_local = format!("sdkcarol{suffix}");
    // alice's first device plays "another device" of the SDK's user (it joins and reads).
    let alice_other = http.register(&alice_local, PASSWORD).await?;
    let bob_local = format!("sdkbob{suffix}");
    let bob = http.register(&bob_local, PASSWORD).await?;
    http.register(&carol_local, PASSWORD).await?;
    ok("users registered with the m.login.dummy flow");

    // Bob's rooms, each with alice joined and 1 to 3 unread messages from bob; the newest
    // activity is in the last room created.
    let mut seeded = Vec::new();
    for index in 0..ROOMS {
        // Room 00 has no name: the SDK names it after its hero, bob.
        let name = if index == 0 {
            bob_local.clone()
        } else {
            format!("Room {index:02}")
        };
        let mut body = json!({"preset": "private_chat", "invite": [alice_other.user_id]});
        if index > 0 {
            body["name"] = json!(name);
        }
        let id = http.create_room(&bob, body).await?;
        http.join(&alice_other, &id).await?;
        let mut bodies = Vec::new();
        for n in 0..1 + index % 3 {
            let text = format!("{name} message {n}");
            http.send_text(&bob, &id, &text).await?;
            bodies.push(text);
        }
        seeded.push(SeededRoom {
            id,
            name,
            unread: bodies.len() as u64,
            highlights: 0,
            bodies,
        });
    }
    // A mention of alice: a highlight as well as a notification.
    let mentioned = &mut seeded[30];
    let text = format!("{} mentions {}", mentioned.name, alice_other.user_id);
    http.send_mention(&bob, &mentioned.id, &text, &alice_other.user_id)
        .await?;
    mentioned.bodies.push(text);
    mentioned.unread += 1;
    mentioned.highlights = 1;
    // Room 30 is now the newest: keep `seeded` in activity order.
    let room30 = seeded.remove(30);
    seeded.push(room30);
    ok("bob created 50 rooms with alice in them and sent unread messages, one mentioning her");

    let alice = sdk_client(url, &alice_local, "alice matrix-sdk").await?;
    ok("alice logs in with matrix-sdk (sliding sync discovered from /versions)");
    let alice_sync = start_sync(&alice).await?;
    let room_list_service = alice_sync.room_list_service();
    let view = RoomListView::spawn(room_list_service.all_rooms().await.context("all_rooms")?);

    // The list: every room, newest activity first, with the names bob gave them.
    let expected: Vec<&SeededRoom> = seeded.iter().rev().collect();
    eventually(
        "the room list shows the 50 rooms in activity order with their names",
        || {
            let rows = view.rows();
            let got: Vec<(&str, &str)> = rows
                .iter()
                .map(|row| (row.id.as_str(), row.name.as_str()))
                .collect();
            let want: Vec<(&str, &str)> = expected
                .iter()
                .map(|room| (room.id.as_str(), room.name.as_str()))
                .collect();
            if got == want {
                Ok(())
            } else {
                Err(format!(
                    "names in list order: {:?}",
                    rows.iter().map(|row| &row.name).collect::<Vec<_>>()
                ))
            }
        },
    )
    .await?;
    eventually("the list's count from the server is 50", || {
        match view.loading.get() {
            RoomListLoadingState::Loaded {
                maximum_number_of_rooms: Some(50),
            } => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    eventually("every room's unread counts are exactly the server's (1 to 4 notifications, 1 highlight where mentioned)", || {
        let rows = view.rows();
        for room in &seeded {
            let row = rows.iter().find(|row| row.id.as_str() == room.id).ok_or(format!("{} missing", room.name))?;
            if (row.notifications, row.highlights) != (room.unread, room.highlights) {
                return Err(format!(
                    "{}: notification_count {} highlight_count {}, expected {} and {}",
                    room.name, row.notifications, row.highlights, room.unread, room.highlights
                ));
            }
        }
        Ok(())
    })
    .await?;

    // A new message moves its room to the top and raises its count.
    let moved = &seeded[10];
    let newest = http.send_text(&bob, &moved.id, "Room 10 wakes up").await?;
    eventually(
        "a new message moves Room 10 to the top of the list and raises its count",
        || {
            let rows = view.rows();
            let top = rows.first().ok_or("empty list")?;
            if top.id.as_str() != moved.id {
                return Err(format!("top is {}", top.name));
            }
            if top.notifications != moved.unread + 1 {
                return Err(format!(
                    "notification_count {}, expected {}",
                    top.notifications,
                    moved.unread + 1
                ));
            }
            Ok(())
        },
    )
    .await?;

    // Alice reads it on her other device: the count drops to 0 with no new event in the room.
    http.read_receipt(&alice_other, &moved.id, &newest).await?;
    eventually(
        "a read receipt from alice's other device brings Room 10's count to 0",
        || {
            let row = view.row(&moved.id).ok_or("Room 10 missing")?;
            if (row.notifications, row.highlights) == (0, 0) {
                Ok(())
            } else {
                Err(format!(
                    "notification_count {} highlight_count {}",
                    row.notifications, row.highlights
                ))
            }
        },
    )
    .await?;

    // An invite appears, and accepting it through the SDK makes it a joined room.
    let invited = http
        .create_room(&bob, json!({"name": "Invitation", "preset": "private_chat", "invite": [alice_other.user_id]}))
        .await?;
    eventually("bob's invite appears in the room list as an invite", || {
        let row = view.row(&invited).ok_or("not in the list")?;
        if row.state == RoomState::Invited {
            Ok(())
        } else {
            Err(format!("state {:?}", row.state))
        }
    })
    .await?;
    let invite_room = room_list_service
        .room(<&RoomId>::try_from(invited.as_str())?)
        .context("invited room")?;
    invite_room
        .join()
        .await
        .context("alice accepts the invite with matrix-sdk")?;
    eventually(
        "the accepted invite is a joined room named Invitation",
        || {
            let row = view.row(&invited).ok_or("not in the list")?;
            if row.state == RoomState::Joined && row.name == "Invitation" {
                Ok(())
            } else {
                Err(format!("state {:?} name {:?}", row.state, row.name))
            }
        },
    )
    .await?;

    // A room alice leaves disappears from the list.
    let left = &seeded[5];
    room_list_service
        .room(<&RoomId>::try_from(left.id.as_str())?)?
        .leave()
        .await
        .context("alice leaves Room 05")?;
    eventually(
        "Room 05, left, disappears from the room list",
        || match view.row(&left.id) {
            None => Ok(()),
            Some(row) => Err(format!("still listed, state {:?}", row.state)),
        },
    )
    .await?;

    // A longer history than the room subscription's timeline (20 events), opened as Element X
    // opens a room: subscribe to it, then build its timeline.
    let history = &mut seeded[20];
    for n in 0..40 {
        let text = format!("{} history {n}", history.name);
        http.send_text(&bob, &history.id, &text).await?;
        history.bodies.push(text);
    }
    let history_id = <&RoomId>::try_from(history.id.as_str())?;
    room_list_service.subscribe_to_rooms(&[history_id]).await;
    let timeline = room_list_service.room(history_id)?.timeline().await?;
    back_paginate_to_creation(&timeline, history).await?;

    encrypted_exchange(url, &http, &alice, &carol_local).await?;

    alice_sync.stop().await;
    Ok(())
}

/// Paginates a room's timeline backwards until the SDK reports its start, and checks that the
/// room's creation and all of bob's messages, in order, are in it.
async fn back_paginate_to_creation(timeline: &Timeline, room: &SeededRoom) -> Result<()> {
    let deadline = Instant::now() + STEP;
    loop {
        let hit_start = tokio::time::timeout(STEP, timeline.paginate_backwards(5))
            .await
            .map_err(|_| anyhow!("back-pagination of {} hung", room.name))??;
        if hit_start {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "back-pagination of {} did not reach the room's start within {STEP:?}",
                room.name
            );
        }
    }
    // The timeline applies the event cache's updates on its own task: wait for them.
    let want: Vec<&str> = room.bodies.iter().map(String::as_str).collect();
    let deadline = Instant::now() + STEP;
    loop {
        let items = timeline.items().await;
        let events: Vec<_> = items.iter().filter_map(|item| item.as_event()).collect();
        let types: Vec<String> = events
            .iter()
            .map(|event| event.content().event_type_str().unwrap_or_default())
            .collect();
        let bodies: Vec<&str> = events
            .iter()
            .filter_map(|event| event.content().as_message())
            .map(|message| message.body())
            .collect();
        if types.first().map(String::as_str) == Some("m.room.create") && bodies == want {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "{}: after back-pagination reached the start, the timeline is {types:?} with messages {bodies:?}, \
                 expected m.room.create first and messages {want:?}",
                room.name
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ok("a room's timeline back-paginates to its creation with every message in order");
    Ok(())
}

/// Alice (matrix-sdk) and carol (a second matrix-sdk client) share an encrypted room: alice's
/// message reaches the server encrypted and carol's SDK decrypts it.
async fn encrypted_exchange(
    url: &str,
    http: &Http,
    alice: &Client,
    carol_local: &str,
) -> Result<()> {
    let carol = sdk_client(url, carol_local, "carol matrix-sdk").await?;
    let carol_sync = start_sync(&carol).await?;
    let carol_id = carol.user_id().context("carol's user ID")?.to_string();
    let alice_session = Session {
        user_id: alice.user_id().context("alice's user ID")?.to_string(),
        token: alice.access_token().context("alice's access token")?,
    };
    let carol_session = Session {
        user_id: carol_id.clone(),
        token: carol.access_token().context("carol's token")?,
    };
    let body = json!({
        "name": "Secrets",
        "preset": "private_chat",
        "invite": [carol_id],
        "initial_state": [{"type": "m.room.encryption", "state_key": "", "content": {"algorithm": "m.megolm.v1.aes-sha2"}}],
    });
    let room_id = OwnedRoomId::try_from(http.create_room(&alice_session, body).await?)?;

    eventually(
        "carol's SDK sees the invite to the encrypted room",
        || match carol.get_room(&room_id) {
            Some(room) if room.state() == RoomState::Invited => Ok(()),
            other => Err(format!("{:?}", other.map(|room| room.state()))),
        },
    )
    .await?;
    carol
        .get_room(&room_id)
        .context("carol's room")?
        .join()
        .await
        .context("carol joins")?;
    eventually(
        "alice's SDK knows Secrets is encrypted and carol joined",
        || {
            let alice_room = alice
                .get_room(&room_id)
                .ok_or("alice's SDK has no Secrets room")?;
            if !alice_room.encryption_state().is_encrypted() {
                return Err("not encrypted".into());
            }
            if alice_room.joined_members_count() != 2 {
                return Err(format!(
                    "{} joined members",
                    alice_room.joined_members_count()
                ));
            }
            Ok(())
        },
    )
    .await?;

    // Carol's device keys go up on her first encryption sync; alice's SDK learns of them through
    // the e2ee extension's device_lists.changed. Sending before that would (rightly) leave carol
    // without the room key. When that change reaches alice before her room-list sync has shown
    // her carol's join, the SDK starts tracking carol only afterwards and queries her keys on its
    // encryption loop's next turn, which can be after a whole 30 s long-poll (seen in about one
    // run in ten; the server answered alice's long-poll right after carol's upload): allow for it.
    let carol_user = carol.user_id().context("carol's user ID")?.to_owned();
    let carol_device = carol.device_id().context("carol's device ID")?.to_owned();
    let deadline = Instant::now() + LONG_POLL + STEP;
    loop {
        let known = alice
            .encryption()
            .get_device(&carol_user, &carol_device)
            .await?
            .is_some();
        if known {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "alice's SDK did not learn carol's device {carol_device} within {:?} (e2ee device_lists)",
                LONG_POLL + STEP
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ok("alice's SDK learns carol's new device (e2ee extension device_lists)");

    let alice_room = alice
        .get_room(&room_id)
        .context("alice's SDK has no Secrets room")?;
    let secret = "the eagle lands at dawn";
    let sent = tokio::time::timeout(
        STEP,
        alice_room.send(RoomMessageEventContent::text_plain(secret)),
    )
    .await
    .map_err(|_| anyhow!("alice's encrypted send hung"))?
    .context("alice sends in the encrypted room")?;
    let event_id = sent.response.event_id.to_string();
    let stored = http
        .event(&carol_session, room_id.as_str(), &event_id)
        .await?;
    if stored["type"] != "m.room.encrypted" {
        bail!(
            "alice's message reached the server as {}, not m.room.encrypted",
            stored["type"]
        );
    }
    ok("alice's matrix-sdk sends the message encrypted (m.room.encrypted on the server)");

    let carol_room = carol.get_room(&room_id).context("carol's room")?;
    wait_for_decrypted(&carol_room.timeline().await?, &event_id, secret, "carol").await?;
    ok("carol's matrix-sdk decrypts alice's message");

    // And back: carol's reply, decrypted by alice's SDK (whose SyncService also runs the room list).
    let reply = "roger, dawn it is";
    let sent = tokio::time::timeout(
        STEP,
        carol_room.send(RoomMessageEventContent::text_plain(reply)),
    )
    .await
    .map_err(|_| anyhow!("carol's encrypted send hung"))?
    .context("carol replies in the encrypted room")?;
    wait_for_decrypted(
        &alice_room.timeline().await?,
        sent.response.event_id.as_str(),
        reply,
        "alice",
    )
    .await?;
    ok("alice's matrix-sdk decrypts carol's reply");
    carol_sync.stop().await;
    Ok(())
}

/// Waits until `who`'s timeline shows `event_id` decrypted to `expected`.
async fn wait_for_decrypted(
    timeline: &Timeline,
    event_id: &str,
    expected: &str,
    who: &str,
) -> Result<()> {
    let deadline = Instant::now() + STEP;
    loop {
        let items = timeline.items().await;
        let event = items
            .iter()
            .filter_map(|item| item.as_event())
            .find(|event| event.event_id().map(|id| id.as_str()) == Some(event_id));
        if let Some(body) = event
            .and_then(|event| event.content().as_message())
            .map(|message| message.body().to_owned())
        {
            if body != expected {
                bail!("{who} decrypted {body:?}, the sender sent {expected:?}");
            }
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{who}'s SDK did not decrypt {event_id} within {STEP:?}: {:?}",
                event.map(|event| event.content().clone())
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
