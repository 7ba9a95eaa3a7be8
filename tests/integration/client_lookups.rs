//! Lookups clients make at start: third-party identifiers and protocols, OAuth 2.0 metadata,
//! login flows, `/versions`; and `m.direct` kept when a direct-chat invite is accepted.

use serde_json::json;

use crate::support::TestServer;

#[tokio::test]
async fn start_up_lookups_answer_as_a_server_without_3pids_bridges_or_oauth() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    assert_eq!(
        alice.get("/_matrix/client/v3/account/3pid").await.ok(),
        json!({ "threepids": [] })
    );
    assert_eq!(
        alice.get("/_matrix/client/r0/account/3pid").await.ok(),
        json!({ "threepids": [] })
    );
    assert_eq!(
        alice
            .get("/_matrix/client/v3/thirdparty/protocols")
            .await
            .ok(),
        json!({})
    );
    for path in [
        "/_matrix/client/v3/account/3pid",
        "/_matrix/client/v3/thirdparty/protocols",
    ] {
        server
            .client()
            .get(path)
            .await
            .assert_error(401, "M_MISSING_TOKEN");
    }
    server
        .client()
        .get("/_matrix/client/v1/auth_metadata")
        .await
        .assert_error(404, "M_UNRECOGNIZED");

    // Exactly the login types `POST /login` takes.
    let flows = server.client().get("/_matrix/client/v3/login").await.ok();
    assert_eq!(flows["flows"], json!([{ "type": "m.login.password" }]));

    let versions = server.client().get("/_matrix/client/versions").await.ok();
    assert_eq!(versions["unstable_features"]["org.matrix.msc3266"], true);
    let list = versions["versions"].as_array().unwrap();
    assert!(list.contains(&json!("v1.13")) && list.contains(&json!("v1.14")));
}

#[tokio::test]
async fn joining_a_direct_chat_invite_records_it_in_m_direct() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let carol = server.register("carol").await;
    let existing = json!({ (carol.user_id.clone()): ["!old:example.org"] });
    bob.put(
        &format!(
            "/_matrix/client/v3/user/{}/account_data/m.direct",
            crate::support::client::enc(&bob.user_id)
        ),
        existing,
    )
    .await
    .ok();
    let initial = bob.sync(None, 0, None).await;
    let since = initial["next_batch"].as_str().unwrap().to_owned();

    let dm = alice
        .create_room(
            json!({ "preset": "trusted_private_chat", "is_direct": true, "invite": [bob.user_id] }),
        )
        .await;
    let group = alice
        .create_room(json!({ "preset": "private_chat", "invite": [bob.user_id] }))
        .await;
    bob.join(&dm).await.ok();
    bob.post(
        &format!(
            "/_matrix/client/v3/rooms/{}/join",
            crate::support::client::enc(&group)
        ),
        json!({}),
    )
    .await
    .ok();
    // Joining again changes nothing.
    bob.join(&dm).await.ok();
    // A DM joined by its (local) alias counts too.
    let by_alias = alice
        .create_room(json!({
            "preset": "trusted_private_chat",
            "is_direct": true,
            "invite": [bob.user_id],
            "room_alias_name": "dm-alias",
        }))
        .await;
    bob.join(&crate::support::alias("dm-alias")).await.ok();

    let path = format!(
        "/_matrix/client/v3/user/{}/account_data/m.direct",
        crate::support::client::enc(&bob.user_id)
    );
    let direct = bob.get(&path).await.ok();
    assert_eq!(
        direct,
        json!({
            (carol.user_id.clone()): ["!old:example.org"],
            (alice.user_id.clone()): [dm, by_alias],
        }),
        "the DM is added under the inviter, the group room is not"
    );
    let sync = bob.sync(Some(&since), 0, None).await;
    let events = sync["account_data"]["events"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let synced = events
        .iter()
        .find(|e| e["type"] == "m.direct")
        .unwrap_or_else(|| panic!("m.direct not in /sync: {sync}"));
    assert_eq!(synced["content"], direct);
    // Alice (who was never invited) gains nothing.
    alice
        .get(&format!(
            "/_matrix/client/v3/user/{}/account_data/m.direct",
            crate::support::client::enc(&alice.user_id)
        ))
        .await
        .assert_error(404, "M_NOT_FOUND");
}
