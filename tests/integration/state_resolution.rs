//! State resolution over stored events (`service::rooms::state_res`): the algorithm of the
//! room's version, fed from the database's auth chains.

use diesel_async::RunQueryDsl;
use myelin::{
    service::rooms::{state_res, versions::rules_for},
    storage::state::{get_state_ids, StateIds},
};
use serde_json::json;

use crate::support::TestServer;

#[derive(diesel::QueryableByName)]
struct Group {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    state_group: i64,
}

/// The state after an event.
async fn state_after(server: &TestServer, event_id: &str) -> StateIds {
    let mut conn = server.db().await;
    let group: Group = diesel::sql_query(format!(
        "SELECT state_group FROM events WHERE event_id = '{event_id}'"
    ))
    .get_result(&mut conn)
    .await
    .unwrap();
    get_state_ids(&conn, group.state_group).await.unwrap()
}

/// Two states of one room's linear history conflict on power levels, membership, the topic and
/// the name; resolution must pick the later state whatever order they are given in, with the
/// algorithm of each room version (v2 for 11, v2.1 for 12).
#[tokio::test]
async fn resolving_two_states_of_a_linear_history_gives_the_later_one() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    for version in ["11", "12"] {
        let room = alice
            .create_room(json!({ "preset": "public_chat", "room_version": version }))
            .await;
        bob.join(&room).await.ok();
        let topic = alice
            .put_state(&room, "m.room.topic", "", json!({ "topic": "first" }))
            .await
            .ok();
        let earlier = state_after(&server, topic["event_id"].as_str().unwrap()).await;

        let mut levels = alice
            .get(&format!(
                "/_matrix/client/v3/rooms/{}/state/m.room.power_levels/",
                crate::support::client::enc(&room)
            ))
            .await
            .ok();
        levels["users"][bob.user_id.as_str()] = json!(50);
        levels["state_default"] = json!(50);
        alice
            .put_state(&room, "m.room.power_levels", "", levels)
            .await
            .ok();
        bob.put_state(&room, "m.room.topic", "", json!({ "topic": "second" }))
            .await
            .ok();
        bob.put_state(&room, "m.room.name", "", json!({ "name": "named" }))
            .await
            .ok();
        let leave = bob
            .post(
                &format!(
                    "/_matrix/client/v3/rooms/{}/leave",
                    crate::support::client::enc(&room)
                ),
                json!({}),
            )
            .await
            .ok();
        assert!(leave.is_object());
        let last = alice
            .put_state(&room, "m.room.topic", "", json!({ "topic": "third" }))
            .await
            .ok();
        let later = state_after(&server, last["event_id"].as_str().unwrap()).await;
        assert_ne!(earlier, later);

        let rules = rules_for(version).unwrap();
        let conn = server.db().await;
        for states in [
            vec![earlier.clone(), later.clone()],
            vec![later.clone(), earlier.clone()],
        ] {
            let resolved = state_res::resolve(&conn, &rules, &room, &states)
                .await
                .unwrap();
            assert_eq!(resolved, later, "room version {version}");
        }
        assert_eq!(
            state_res::resolve(&conn, &rules, &room, std::slice::from_ref(&earlier))
                .await
                .unwrap(),
            earlier
        );
    }
}
