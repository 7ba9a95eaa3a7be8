//! Scenario 12: one room with many members (20,000 at full scale), joined through the API:
//! how long the joins take, then a send's latency, the time until 1,000 long-polling members
//! have a message, the member lists (`/members`, `/joined_members`), a member's initial sync
//! with lazy-loaded members, and how much the joins grew the database.
//!
//! The members are an application service's users (`--appservice-token`): registered without
//! a password and acting through its token, as a bridge's are. Registering 20,000 users
//! through ordinary registration would spend the run hashing passwords. Without a token the
//! scenario says it was skipped.
//!
//! A server whose API would take hours for the joins measures a room made elsewhere
//! (`saved.rs`): the saved set-up is the room, its owner and its members in join order, and
//! the joins' figures are then the other server's.

use std::time::{Duration, Instant};

use futures_util::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::{
    client::{enc, Failure, User},
    database_size,
    delivery::reach_pollers,
    saved::{SetUpFiles, LOADED},
    stats::{round, Samples},
    Bench, SET_UP_IN_FLIGHT,
};

/// Samples of each member-list measure.
const SAMPLES: usize = 5;
/// Sequential sends measured in the full room.
const SENDS: usize = 20;

/// A `/sync` filter with lazy-loaded members and one timeline event, as Element asks.
fn lazy_filter() -> String {
    json!({ "room": { "state": { "lazy_load_members": true }, "timeline": { "limit": 1 } } })
        .to_string()
}

/// What the set-up made: the room, and who is in it.
#[derive(Serialize, Deserialize)]
struct SetUp {
    room_id: String,
    /// The room's creator, who sends and lists the members.
    owner: String,
    /// The other members, in the order they joined.
    members: Vec<String>,
    /// The joins' figures, for the report.
    report: Value,
}

pub async fn big_room(
    bench: &Bench,
    appservice_token: Option<&str>,
    members: usize,
    pollers: usize,
    more_joins: usize,
    files: SetUpFiles<'_>,
) -> Result<Value, Failure> {
    let Some(as_token) = appservice_token else {
        return Ok(json!({ "skipped": "needs --appservice-token to register the members" }));
    };
    let set_up = match files.load::<SetUp>()? {
        Some(mut set_up) => {
            set_up.report = json!({ "joins": { "members": set_up.members.len(), "how": LOADED } });
            set_up
        }
        None => set_up_through_api(bench, as_token, members).await?,
    };
    files.store(&set_up)?;
    bench.analyze().await;
    let act = |user_id: &String| User::acting_as(&bench.http, &bench.url, as_token, user_id);
    let owner = act(&set_up.owner);
    let users: Vec<User> = set_up.members.iter().map(act).collect();
    // Transaction IDs of this run's own: a saved set-up may be measured more than once.
    let txn = |name: &str| format!("{}{name}", bench.prefix);
    let mut report = measure(&owner, &users, &set_up.room_id, pollers, txn).await?;
    if let (Value::Object(report), Value::Object(joins)) = (&mut report, set_up.report) {
        report.extend(joins);
    }
    if more_joins > 0 {
        report["more_joins"] = join_more(bench, as_token, &set_up.room_id, more_joins).await?;
    }
    Ok(report)
}

/// `count` new members join the full room through the API, as many at a time as the set-up's
/// joins: each join's time, their rate and the database's growth per member.
async fn join_more(
    bench: &Bench,
    as_token: &str,
    room: &str,
    count: usize,
) -> Result<Value, Failure> {
    let users = bench.appservice_users(as_token, "more", count).await?;
    let joins = timed_joins(bench, &users, room).await?;
    let mut report = joins.summary();
    report["db_bytes_per_member"] = json!(joins.db_bytes_per_member());
    Ok(report)
}

/// Joins through the API, as timed by [`timed_joins`].
struct TimedJoins {
    /// Each join's time, in the order the users were given.
    times: Vec<Duration>,
    /// The time for all of them.
    elapsed: Duration,
    /// How much the database grew, when `--database-url` was given.
    db_growth: Option<i64>,
}

impl TimedJoins {
    /// The times of the joins from the `from`th on.
    fn samples(&self, from: usize) -> Samples {
        let mut samples = Samples::default();
        self.times[from..]
            .iter()
            .for_each(|elapsed| samples.push(*elapsed));
        samples
    }

    /// Every join's percentiles, with their count, total time and rate.
    fn summary(&self) -> Value {
        let mut summary = self.samples(0).summary();
        let members = self.times.len();
        summary["members"] = json!(members);
        summary["total_s"] = json!(round(self.elapsed.as_secs_f64()));
        summary["per_s"] = json!(round(members as f64 / self.elapsed.as_secs_f64()));
        summary
    }

    fn db_bytes_per_member(&self) -> Option<i64> {
        self.db_growth
            .map(|growth| growth / self.times.len().max(1) as i64)
    }
}

/// Each user joins the room, as many at a time as the set-up allows, with the database's size
/// read before and after.
async fn timed_joins(bench: &Bench, users: &[User], room: &str) -> Result<TimedJoins, Failure> {
    let db_before = database_size(bench.loader_url.as_deref()).await;
    let started = Instant::now();
    let times = futures_util::stream::iter(users)
        .map(|user| async {
            let t = Instant::now();
            user.join(room).await?;
            Ok::<_, Failure>(t.elapsed())
        })
        .buffered(SET_UP_IN_FLIGHT)
        .try_collect()
        .await?;
    let elapsed = started.elapsed();
    let db_after = database_size(bench.loader_url.as_deref()).await;
    Ok(TimedJoins {
        times,
        elapsed,
        db_growth: db_before
            .zip(db_after)
            .map(|(before, after)| after - before),
    })
}

/// The room and its joins through the client API, each join timed.
async fn set_up_through_api(
    bench: &Bench,
    as_token: &str,
    members: usize,
) -> Result<SetUp, Failure> {
    let mut users = bench.appservice_users(as_token, "", members + 1).await?;
    let owner = users.remove(0);
    let room = owner
        .create_room(json!({ "preset": "public_chat", "name": "big room" }))
        .await?;
    // The joins, timed one by one; the last tenth is the room near its full size.
    let joins = timed_joins(bench, &users, &room).await?;
    let user_id = |user: &User| {
        user.appservice_user_id()
            .map(str::to_owned)
            .ok_or("the room's members act through the application service")
    };
    Ok(SetUp {
        room_id: room,
        owner: user_id(&owner)?,
        members: users.iter().map(user_id).collect::<Result<_, _>>()?,
        report: json!({
            "joins": joins.summary(),
            "last_tenth_of_joins": joins.samples(members - members / 10).summary(),
            "db_bytes_per_member": joins.db_bytes_per_member(),
        }),
    })
}

/// A send's latency, the fan-out to the long-polling members, the member lists and a member's
/// first lazy sync, each answer checked.
async fn measure(
    owner: &User,
    users: &[User],
    room: &str,
    pollers: usize,
    txn: impl Fn(&str) -> String,
) -> Result<Value, Failure> {
    let members = users.len();
    let mut sends = Samples::default();
    for i in 0..SENDS {
        let t = Instant::now();
        owner
            .send(room, &txn(&format!("big{i}")), &format!("message {i}"))
            .await?;
        sends.push(t.elapsed());
    }

    let fan_out_txn = txn("big-fan");
    let mut fan_out = reach_pollers(
        users.iter().take(pollers).cloned().collect(),
        Some(lazy_filter()),
        || owner.send(room, &fan_out_txn, "big-room fan-out"),
        "big-room fan-out",
    )
    .await?;
    fan_out["pollers"] = json!(pollers.min(members));
    fan_out["all_received_ms"] = fan_out["max_ms"].clone();

    // The member lists, each answer checked for every member.
    let everyone = members + 1;
    let mut member_events = Samples::default();
    let mut joined_members = Samples::default();
    for _ in 0..SAMPLES {
        let t = Instant::now();
        let listed = owner
            .get(&format!("/_matrix/client/v3/rooms/{}/members", enc(room)))
            .await?;
        member_events.push(t.elapsed());
        let joined = listed["chunk"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["content"]["membership"] == "join")
            .count();
        if joined != everyone {
            return Err(format!("/members lists {joined} joined of {everyone}"));
        }
        let t = Instant::now();
        let listed = owner
            .get(&format!(
                "/_matrix/client/v3/rooms/{}/joined_members",
                enc(room)
            ))
            .await?;
        joined_members.push(t.elapsed());
        let joined = listed["joined"].as_object().map_or(0, |j| j.len());
        if joined != everyone {
            return Err(format!("/joined_members lists {joined} of {everyone}"));
        }
    }

    // A member's first sync with lazy-loaded members: the room with only the members its
    // timeline needs (members other than the pollers, whose first sync is behind them).
    let mut lazy = Samples::default();
    let mut members_sent = 0;
    for user in users.iter().rev().take(SAMPLES) {
        let t = Instant::now();
        let sync = user
            .sync(None, Duration::ZERO, Some(&lazy_filter()))
            .await?;
        lazy.push(t.elapsed());
        let state = &sync["rooms"]["join"][room]["state"]["events"];
        let Some(state) = state.as_array() else {
            return Err(format!("a member's first sync lacks the big room: {sync}"));
        };
        members_sent = state
            .iter()
            .filter(|e| e["type"] == "m.room.member")
            .count();
    }

    let mut lazy_sync = lazy.summary();
    lazy_sync["member_events"] = json!(members_sent);
    Ok(json!({
        "send": sends.summary(),
        "fan_out": fan_out,
        "members": member_events.summary(),
        "joined_members": joined_members.summary(),
        "initial_sync_lazy": lazy_sync,
    }))
}
