//! Profiles, account data, filters, push rules, discovery and capabilities.

use serde_json::json;

use crate::support::TestServer;

#[tokio::test]
async fn display_name_and_avatar_are_set_and_read() {
    let server = TestServer::start().await;
    let mia = server.register("mia").await;
    let anon = server.client();
    let profile = anon
        .get("/_matrix/client/v3/profile/@mia:localhost")
        .await
        .ok();
    assert_eq!(
        profile["displayname"], "mia",
        "display name defaults to the localpart"
    );
    mia.put(
        "/_matrix/client/v3/profile/@mia:localhost/displayname",
        json!({ "displayname": "Mia M." }),
    )
    .await
    .ok();
    mia.put(
        "/_matrix/client/v3/profile/@mia:localhost/avatar_url",
        json!({ "avatar_url": "mxc://localhost/abc" }),
    )
    .await
    .ok();
    let name = anon
        .get("/_matrix/client/v3/profile/@mia:localhost/displayname")
        .await
        .ok();
    assert_eq!(name, json!({ "displayname": "Mia M." }));
    let profile = anon
        .get("/_matrix/client/v3/profile/@mia:localhost")
        .await
        .ok();
    assert_eq!(profile["avatar_url"], "mxc://localhost/abc");
    anon.get("/_matrix/client/v3/profile/@ghost:localhost")
        .await
        .assert_error(404, "M_NOT_FOUND");
    mia.request(
        reqwest::Method::DELETE,
        "/_matrix/client/v3/profile/@mia:localhost/avatar_url",
        None,
    )
    .await
    .ok();
    anon.get("/_matrix/client/v3/profile/@mia:localhost/avatar_url")
        .await
        .assert_error(404, "M_NOT_FOUND");
}

#[tokio::test]
async fn account_data_round_trips_globally_and_per_room() {
    let server = TestServer::start().await;
    let ned = server.register("ned").await;
    let global = "/_matrix/client/v3/user/@ned:localhost/account_data/org.example.settings";
    ned.get(global).await.assert_error(404, "M_NOT_FOUND");
    ned.put(global, json!({ "theme": "dark" })).await.ok();
    ned.put(global, json!({ "theme": "light" })).await.ok();
    assert_eq!(ned.get(global).await.ok(), json!({ "theme": "light" }));

    let room =
        "/_matrix/client/v3/user/@ned:localhost/rooms/!room:localhost/account_data/m.tag.like";
    ned.put(room, json!({ "x": 1 })).await.ok();
    assert_eq!(ned.get(room).await.ok(), json!({ "x": 1 }));
    let fully_read =
        "/_matrix/client/v3/user/@ned:localhost/rooms/!room:localhost/account_data/m.fully_read";
    ned.put(fully_read, json!({ "event_id": "$x" }))
        .await
        .assert_error(405, "M_BAD_JSON");
}

#[tokio::test]
async fn the_whole_profile_is_limited_to_64_kib() {
    let server = TestServer::start().await;
    let mia = server.register("mia").await;
    let field = |name: &str| format!("/_matrix/client/v3/profile/@mia:localhost/{name}");
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
        .get("/_matrix/client/v3/profile/@mia:localhost")
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
        "/_matrix/client/v3/user/@mia:localhost/account_data/x.floats",
        json!({ "n": numbers }),
    )
    .await
    .ok();
    let stored = mia
        .get("/_matrix/client/v3/user/@mia:localhost/account_data/x.floats")
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
        .post("/_matrix/client/v3/user/@olga:localhost/filter", filter)
        .await
        .ok();
    let id = created["filter_id"]
        .as_str()
        .expect("filter_id is a string");
    let stored = olga
        .get(&format!(
            "/_matrix/client/v3/user/@olga:localhost/filter/{id}"
        ))
        .await
        .ok();
    assert_eq!(stored["room"]["timeline"]["limit"], 10);
    assert_eq!(
        stored["room"]["timeline"]["types"],
        json!(["m.room.message"])
    );
    olga.get("/_matrix/client/v3/user/@olga:localhost/filter/999999")
        .await
        .assert_error(404, "M_NOT_FOUND");
    olga.get("/_matrix/client/v3/user/@olga:localhost/filter/abc")
        .await
        .assert_error(404, "M_NOT_FOUND");
    olga.post(
        "/_matrix/client/v3/user/@olga:localhost/filter",
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
    assert_eq!(caps["capabilities"]["m.room_versions"]["default"], "12");
    let versions = server.client().get("/_matrix/client/versions").await.ok();
    assert!(versions["versions"]
        .as_array()
        .unwrap()
        .contains(&json!("v1.1")));
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
