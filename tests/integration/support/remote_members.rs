//! Remote members written straight into a room's tables, as a federated join or invite would
//! leave them, for tests of what happens after (sending, leaving, sync), without a handshake.

use diesel::{
    sql_query,
    sql_types::{Array, BigInt, Bool, Jsonb, Text},
    QueryableByName,
};
use diesel_async::RunQueryDsl;
use rand::Rng;
use serde_json::json;

use super::TestServer;

/// Makes `user` (of another server) `membership` in the room, as set by `sender`, the way a
/// federated join (or invite) will: an
/// `m.room.member` event on the room's forward extremity, a state group over the current one,
/// the current state, the membership row and the room's tip. The event is not signed: nothing
/// on these paths checks signatures (a federated join stores the joiner's signed event).
pub async fn put_remote_member(
    server: &TestServer,
    room: &str,
    sender: &str,
    user: &str,
    membership: &str,
) -> String {
    #[derive(QueryableByName)]
    struct Room {
        #[diesel(sql_type = Text)]
        room_version: String,
        #[diesel(sql_type = BigInt)]
        current_state_group: i64,
        #[diesel(sql_type = Array<Text>)]
        forward_extremities: Vec<String>,
        #[diesel(sql_type = BigInt)]
        tip_depth: i64,
    }
    #[derive(QueryableByName)]
    struct Id {
        #[diesel(sql_type = Text)]
        event_id: String,
    }
    #[derive(QueryableByName)]
    struct Number {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let mut db = server.db().await;
    let r: Room = sql_query(
        "SELECT room_version, current_state_group, forward_extremities, tip_depth \
         FROM rooms WHERE room_id = $1",
    )
    .bind::<Text, _>(room)
    .get_result(&mut db)
    .await
    .unwrap();
    // The auth events a member event selects (room v12 leaves the create event out).
    let auth: Vec<Id> = sql_query(
        "SELECT event_id FROM room_current_state WHERE room_id = $1 AND ( \
             (event_type IN ('m.room.power_levels', 'm.room.join_rules') AND state_key = '') \
             OR (event_type = 'm.room.member' AND state_key = $2) \
             OR (event_type = 'm.room.create' AND $3))",
    )
    .bind::<Text, _>(room)
    .bind::<Text, _>(user)
    .bind::<Bool, _>(r.room_version != "12")
    .load(&mut db)
    .await
    .unwrap();
    let event_id = format!("$remote{membership}{:016x}", rand::rng().random::<u64>());
    let depth = r.tip_depth + 1;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let pdu = json!({
        "auth_events": auth.iter().map(|a| a.event_id.clone()).collect::<Vec<_>>(),
        "prev_events": r.forward_extremities,
        // A display name, so that a redacted copy differs from the event.
        "content": { "membership": membership, "displayname": user },
        "depth": depth,
        "origin_server_ts": now,
        "room_id": room,
        "sender": sender,
        "state_key": user,
        "type": "m.room.member",
    });
    let group: Number = sql_query(
        "INSERT INTO state_groups (room_id, parent_group, chain_length) \
         SELECT $1, state_group, chain_length + 1 FROM state_groups WHERE state_group = $2 \
         RETURNING state_group AS n",
    )
    .bind::<Text, _>(room)
    .bind::<BigInt, _>(r.current_state_group)
    .get_result(&mut db)
    .await
    .unwrap();
    sql_query(
        "INSERT INTO state_group_entries (state_group, event_type, state_key, event_id) \
         VALUES ($1, 'm.room.member', $2, $3)",
    )
    .bind::<BigInt, _>(group.n)
    .bind::<Text, _>(user)
    .bind::<Text, _>(&event_id)
    .execute(&mut db)
    .await
    .unwrap();
    // Everything below in one transaction, which holds the stream position it takes (readers
    // stay below it until the commit).
    diesel_async::SimpleAsyncConnection::batch_execute(&mut db, "BEGIN")
        .await
        .unwrap();
    let position: Number = sql_query("SELECT (myelin_take_positions('events', 1))[1] AS n")
        .get_result(&mut db)
        .await
        .unwrap();
    sql_query(
        "INSERT INTO events (event_id, room_id, stream_ordering, depth, sender, event_type, \
             state_key, origin_server_ts, pdu, state_group) \
         VALUES ($1, $2, $3, $4, $5, 'm.room.member', $6, $7, $8, $9)",
    )
    .bind::<Text, _>(&event_id)
    .bind::<Text, _>(room)
    .bind::<BigInt, _>(position.n)
    .bind::<BigInt, _>(depth)
    .bind::<Text, _>(sender)
    .bind::<Text, _>(user)
    .bind::<BigInt, _>(now)
    .bind::<Jsonb, _>(&pdu)
    .bind::<BigInt, _>(group.n)
    .execute(&mut db)
    .await
    .unwrap();
    sql_query(
        "UPDATE rooms SET current_state_group = $2, forward_extremities = ARRAY[$3], \
             tip_depth = $4 WHERE room_id = $1",
    )
    .bind::<Text, _>(room)
    .bind::<BigInt, _>(group.n)
    .bind::<Text, _>(&event_id)
    .bind::<BigInt, _>(depth)
    .execute(&mut db)
    .await
    .unwrap();
    sql_query(
        "INSERT INTO room_current_state (room_id, event_type, state_key, event_id) \
         VALUES ($1, 'm.room.member', $2, $3) \
         ON CONFLICT (room_id, event_type, state_key) DO UPDATE SET event_id = $3",
    )
    .bind::<Text, _>(room)
    .bind::<Text, _>(user)
    .bind::<Text, _>(&event_id)
    .execute(&mut db)
    .await
    .unwrap();
    sql_query(
        "INSERT INTO room_memberships (room_id, user_id, membership, event_id, stream_ordering, \
             forgotten) VALUES ($1, $2, $3, $4, $5, false) \
         ON CONFLICT (room_id, user_id) DO UPDATE \
         SET membership = $3, event_id = $4, stream_ordering = $5",
    )
    .bind::<Text, _>(room)
    .bind::<Text, _>(user)
    .bind::<Text, _>(membership)
    .bind::<Text, _>(&event_id)
    .bind::<BigInt, _>(position.n)
    .execute(&mut db)
    .await
    .unwrap();
    diesel_async::SimpleAsyncConnection::batch_execute(&mut db, "COMMIT")
        .await
        .unwrap();
    event_id
}

/// Joins `user` (of another server) to the room, see [`put_remote_member`].
pub async fn join_remote(server: &TestServer, room: &str, user: &str) -> String {
    put_remote_member(server, room, user, user, "join").await
}
