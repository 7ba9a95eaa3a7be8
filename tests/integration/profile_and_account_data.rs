//! Profiles, account data, filters, push rules, discovery and capabilities.

use serde_json::json;

use crate::support::{client::enc, room_id, server_name, user_id, TestServer};

#[tokio::test]
async fn display_name_and_avatar_are_set_and_read() {
    let server = TestServer::start().await;
    let mia = server.register("mia").await;
    let anon = server.client();
    let profile = anon
        .get(&format!(
            "/_matrix/client/v3/profile/{}",
            enc(&user_id("mia"))
        ))
        .await
        .ok();
    assert_eq!(
        profile["displayname"], "mia",
        "display name defaults to the localpart"
    );
    mia.put(
        &format!(
            "/_matrix/client/v3/profile/{}/displayname",
            enc(&user_id("mia"))
        ),
        json!({ "displayname": "Mia M." }),
    )
    .await
    .ok();
    mia.put(
        &format!(
            "/_matrix/client/v3/profile/{}/avatar_url",
            enc(&user_id("mia"))
        ),
        json!({ "avatar_url": format!("mxc://{}/abc", server_name()) }),
    )
    .await
    .ok();
    let name = anon
        .get(&format!(
            "/_matrix/client/v3/profile/{}/displayname",
            enc(&user_id("mia"))
        ))
        .await
        .ok();
    assert_eq!(name, json!({ "displayname": "Mia M." }));
    let profile = anon
        .get(&format!(
            "/_matrix/client/v3/profile/{}",
            enc(&user_id("mia"))
        ))
        .await
        .ok();
    assert_eq!(
        profile["avatar_url"],
        format!("mxc://{}/abc", server_name())
    );
    anon.get(&format!(
        "/_matrix/client/v3/profile/{}",
        enc(&user_id("ghost"))
    ))
    .await
    .assert_error(404, "M_NOT_FOUND");
    mia.request(
        reqwest::Method::DELETE,
        &format!(
            "/_matrix/client/v3/profile/{}/avatar_url",
            enc(&user_id("mia"))
        ),
        None,
    )
    .await
    .ok();
    anon.get(&format!(
        "/_matrix/client/v3/profile/{}/avatar_url",
        enc(&user_id("mia"))
    ))
    .await
    .assert_error(404, "M_NOT_FOUND");
}

/// The `m.tag` content in a sync's room `account_data`, if the sync carries it.
fn synced_tags(sync: &serde_json::Value, room: &str) -> Option<serde_json::Value> {
    sync["rooms"]["join"][room]["account_data"]["events"]
        .as_array()?
        .iter()
        .rev()
        .find(|e| e["type"] == "m.tag")
        .map(|e| e["content"]["tags"].clone())
}

#[tokio::test]
async fn room_tags_are_set_listed_removed_and_synced_for_their_owner_only() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    bob.join(&room).await.ok();
    let tags = format!(
        "/_matrix/client/v3/user/{}/rooms/{}/tags",
        enc(&alice.user_id),
        enc(&room)
    );
    let tag = |name: &str| format!("{tags}/{}", enc(name));
    assert_eq!(alice.get(&tags).await.ok(), json!({ "tags": {} }));
    let since = alice.next_batch().await;

    alice
        .put(&tag("m.favourite"), json!({ "order": 0.25 }))
        .await
        .ok();
    alice.put(&tag("u.work"), json!({})).await.ok();
    let both = json!({ "m.favourite": { "order": 0.25 }, "u.work": {} });
    assert_eq!(alice.get(&tags).await.ok(), json!({ "tags": both }));
    let sync = alice.sync(Some(&since), 0, None).await;
    assert_eq!(synced_tags(&sync, &room), Some(both.clone()));
    let since = sync["next_batch"].as_str().unwrap().to_owned();
    assert_eq!(
        synced_tags(&alice.sync(None, 0, None).await, &room),
        Some(both.clone())
    );

    // Bad input changes nothing.
    let long = "u.".to_owned() + &"x".repeat(254);
    for (name, body, errcode) in [
        ("u.late", json!({ "order": 1.5 }), "M_INVALID_PARAM"),
        ("u.late", json!({ "order": -0.1 }), "M_INVALID_PARAM"),
        ("u.late", json!({ "order": true }), "M_BAD_JSON"),
        // Old clients send the order as a string (accepted): its value is still checked.
        ("u.late", json!({ "order": "2" }), "M_INVALID_PARAM"),
        (long.as_str(), json!({}), "M_INVALID_PARAM"),
    ] {
        alice.put(&tag(name), body).await.assert_error(400, errcode);
    }
    let at_limit = "u.".to_owned() + &"y".repeat(253);
    alice.put(&tag(&at_limit), json!({ "order": 1 })).await.ok();
    alice.delete(&tag(&at_limit), json!({})).await.ok();

    // Only the owner reads or writes their tags.
    bob.get(&tags).await.assert_error(403, "M_FORBIDDEN");
    bob.put(&tag("u.mine"), json!({}))
        .await
        .assert_error(403, "M_FORBIDDEN");
    bob.delete(&tag("u.work"), json!({}))
        .await
        .assert_error(403, "M_FORBIDDEN");
    let bobs_sync = bob.sync(None, 0, None).await;
    assert_eq!(synced_tags(&bobs_sync, &room), None);

    alice.delete(&tag("u.work"), json!({})).await.ok();
    alice.delete(&tag("u.never"), json!({})).await.ok();
    let one = json!({ "m.favourite": { "order": 0.25 } });
    assert_eq!(alice.get(&tags).await.ok(), json!({ "tags": one }));
    let sync = alice.sync(Some(&since), 0, None).await;
    assert_eq!(synced_tags(&sync, &room), Some(one));
}

#[tokio::test]
async fn account_data_round_trips_globally_and_per_room() {
    let server = TestServer::start().await;
    let ned = server.register("ned").await;
    let global = &format!(
        "/_matrix/client/v3/user/{}/account_data/org.example.settings",
        enc(&user_id("ned"))
    );
    ned.get(global).await.assert_error(404, "M_NOT_FOUND");
    ned.put(global, json!({ "theme": "dark" })).await.ok();
    ned.put(global, json!({ "theme": "light" })).await.ok();
    assert_eq!(ned.get(global).await.ok(), json!({ "theme": "light" }));

    let room = &format!(
        "/_matrix/client/v3/user/{}/rooms/{}/account_data/m.tag.like",
        enc(&user_id("ned")),
        enc(&room_id("room"))
    );
    ned.put(room, json!({ "x": 1 })).await.ok();
    assert_eq!(ned.get(room).await.ok(), json!({ "x": 1 }));
    let fully_read = &format!(
        "/_matrix/client/v3/user/{}/rooms/{}/account_data/m.fully_read",
        enc(&user_id("ned")),
        enc(&room_id("room"))
    );
    ned.put(fully_read, json!({ "event_id": "$x" }))
        .await
        .assert_error(405, "M_BAD_JSON");
}

#[tokio::test]
async fn the_whole_profile_is_limited_to_64_kib() {
    let server = TestServer::start().await;
    let mia = server.register("mia").await;
    let field = |name: &str| format!("/_matrix/client/v3/profile/{}/{name}", mia.user_id);
    let big = "x".repeat(20 * 1024);
    for name in ["org.example.a", "org.example.b", "org.example.c"] {
        mia.put(&field(name), json!({ name: big })).await.ok();
    }
    mia.put(&field("org.example.d"), json!({ "org.example.d": big }))
        .await
        .assert_error(400, "M_PROFILE_TOO_LARGE");
    mia.put(
        &field("org.example.e"),
        json!({ "org.example.e": "x".repeat(70 * 1024) }),
    )
    .await
    .assert_error(400, "M_PROFILE_TOO_LARGE");
    let profile = mia
        .get(&format!("/_matrix/client/v3/profile/{}", mia.user_id))
        .await
        .ok();
    assert!(profile.get("org.example.d").is_none(), "nothing written");
    // Replacing a field counts its new size, not both.
    mia.put(
        &field("org.example.a"),
        json!({ "org.example.a": "x".repeat(21 * 1024) }),
    )
    .await
    .ok();
}

#[tokio::test]
async fn extreme_floats_in_stored_json_read_back_exactly() {
    let server = TestServer::start().await;
    let mia = server.register("mia").await;
    // PostgreSQL's jsonb prints these as long decimals; reading them back must give the same
    // number, not an out-of-range error (a 500 on every later read) or a neighbour.
    let numbers = json!([
        f64::MAX,
        -f64::MAX,
        f64::MIN_POSITIVE,
        5e-324,
        -1.862_057_149_810_556e-309,
        0.1
    ]);
    mia.put(
        &format!(
            "/_matrix/client/v3/user/{}/account_data/x.floats",
            mia.user_id
        ),
        json!({ "n": numbers }),
    )
    .await
    .ok();
    let stored = mia
        .get(&format!(
            "/_matrix/client/v3/user/{}/account_data/x.floats",
            mia.user_id
        ))
        .await
        .ok();
    assert_eq!(stored["n"], numbers);
    let version = mia
        .post(
            "/_matrix/client/v3/room_keys/version",
            json!({ "algorithm": "m.megolm_backup.v1.curve25519-aes-sha2",
                    "auth_data": { "public_key": "k", "n": numbers } }),
        )
        .await
        .ok();
    let backup = mia
        .get(&format!(
            "/_matrix/client/v3/room_keys/version/{}",
            version["version"].as_str().unwrap()
        ))
        .await
        .ok();
    assert_eq!(backup["auth_data"]["n"], numbers);
}

#[tokio::test]
async fn filters_are_stored_validated_and_private() {
    let server = TestServer::start().await;
    let olga = server.register("olga").await;
    let filter = json!({ "room": { "timeline": { "limit": 10, "types": ["m.room.message"] } }, "event_fields": ["content.body"] });
    let created = olga
        .post(
            &format!("/_matrix/client/v3/user/{}/filter", enc(&user_id("olga"))),
            filter,
        )
        .await
        .ok();
    let id = created["filter_id"]
        .as_str()
        .expect("filter_id is a string");
    let stored = olga
        .get(&format!(
            "/_matrix/client/v3/user/{}/filter/{id}",
            enc(&user_id("olga"))
        ))
        .await
        .ok();
    assert_eq!(stored["room"]["timeline"]["limit"], 10);
    assert_eq!(
        stored["room"]["timeline"]["types"],
        json!(["m.room.message"])
    );
    olga.get(&format!(
        "/_matrix/client/v3/user/{}/filter/999999",
        enc(&user_id("olga"))
    ))
    .await
    .assert_error(404, "M_NOT_FOUND");
    olga.get(&format!(
        "/_matrix/client/v3/user/{}/filter/abc",
        enc(&user_id("olga"))
    ))
    .await
    .assert_error(404, "M_NOT_FOUND");
    olga.post(
        &format!("/_matrix/client/v3/user/{}/filter", enc(&user_id("olga"))),
        json!({ "room": { "timeline": { "limit": 0 } } }),
    )
    .await
    .assert_error(400, "M_INVALID_PARAM");
}

#[tokio::test]
async fn push_rules_capabilities_versions_and_well_known() {
    let server = TestServer::start().await;
    let pat = server.register("pat").await;
    let rules = pat.get("/_matrix/client/v3/pushrules/").await.ok();
    let overrides = rules["global"]["override"].as_array().unwrap();
    assert!(
        overrides.iter().any(|r| r["rule_id"] == ".m.rule.master"),
        "{rules}"
    );
    let caps = pat.get("/_matrix/client/v3/capabilities").await.ok();
    // `m.change_password` defaults to enabled when absent, as the spec says.
    assert_ne!(caps["capabilities"]["m.change_password"]["enabled"], false);
    assert_eq!(
        caps["capabilities"]["m.room_versions"],
        json!({ "default": "12", "available": { "10": "stable", "11": "stable", "12": "stable" } })
    );
    let versions = server.client().get("/_matrix/client/versions").await.ok();
    let versions: Vec<&str> = versions["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let stable: Vec<String> = (1..=14).map(|minor| format!("v1.{minor}")).collect();
    assert!(
        stable.iter().all(|v| versions.contains(&v.as_str())),
        "every version from v1.1 to v1.14 (authenticated media, preview_url, thumbnail \
         Content-Disposition, room and user reports): {versions:?}"
    );
    assert!(
        !versions.contains(&"v1.15"),
        "v1.15 is not advertised yet: {versions:?}"
    );
    let well_known = server.client().get("/.well-known/matrix/client").await.ok();
    assert!(well_known["m.homeserver"]["base_url"]
        .as_str()
        .unwrap()
        .starts_with("http"));
    // No federation, so no delegation is advertised.
    server
        .client()
        .get("/.well-known/matrix/server")
        .await
        .assert_error(404, "M_NOT_FOUND");
}
