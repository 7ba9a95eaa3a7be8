//! The Synapse-compatible admin API for accounts: who may call it, the user lists (v2 and
//! v3) with their filters, orders and paging, create or modify, deactivate (with erase),
//! password resets, devices, rate-limit overrides, and a user's rooms.

use serde_json::{json, Value};

use crate::support::{client::enc, Client, TestServer};

fn user_path(server: &TestServer, localpart: &str) -> String {
    format!(
        "/_synapse/admin/v2/users/{}",
        enc(&server.user_id(localpart))
    )
}

fn names(list: &Value) -> Vec<String> {
    list["users"]
        .as_array()
        .expect("a users list")
        .iter()
        .map(|u| u["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn only_admins_may_call_the_admin_api_but_anyone_may_read_the_version() {
    let server = TestServer::start().await;
    let admin = server.create_admin("root", "rootpassword").await;
    let bob = server.register("bob").await;
    let room = admin.create_room(json!({})).await;
    let bob_id = enc(&bob.user_id);
    let calls = [
        ("GET", "/_synapse/admin/v2/users".to_owned()),
        ("GET", "/_synapse/admin/v3/users".to_owned()),
        ("GET", format!("/_synapse/admin/v2/users/{bob_id}")),
        ("PUT", format!("/_synapse/admin/v2/users/{bob_id}")),
        ("POST", format!("/_synapse/admin/v1/deactivate/{bob_id}")),
        (
            "POST",
            format!("/_synapse/admin/v1/reset_password/{bob_id}"),
        ),
        ("GET", format!("/_synapse/admin/v1/users/{bob_id}/admin")),
        ("PUT", format!("/_synapse/admin/v1/users/{bob_id}/admin")),
        (
            "POST",
            format!("/_synapse/admin/v1/users/{bob_id}/override_ratelimit"),
        ),
        ("GET", format!("/_synapse/admin/v2/users/{bob_id}/devices")),
        (
            "DELETE",
            format!("/_synapse/admin/v2/users/{bob_id}/devices/X"),
        ),
        (
            "GET",
            format!("/_synapse/admin/v1/users/{bob_id}/joined_rooms"),
        ),
        ("GET", format!("/_synapse/admin/v1/users/{bob_id}/media")),
        ("GET", format!("/_synapse/admin/v1/whois/{bob_id}")),
        ("POST", format!("/_synapse/admin/v1/users/{bob_id}/login")),
        (
            "GET",
            format!("/_synapse/admin/v1/room/{}/media", enc(&room)),
        ),
        ("GET", "/_synapse/admin/v1/rooms".to_owned()),
        ("GET", format!("/_synapse/admin/v1/rooms/{}", enc(&room))),
        (
            "GET",
            format!("/_synapse/admin/v1/rooms/{}/state", enc(&room)),
        ),
        ("DELETE", format!("/_synapse/admin/v2/rooms/{}", enc(&room))),
        (
            "POST",
            format!("/_synapse/admin/v1/purge_history/{}", enc(&room)),
        ),
        (
            "GET",
            "/_synapse/admin/v1/purge_history_status/unknown".to_owned(),
        ),
        (
            "POST",
            "/_synapse/admin/v1/media/quarantine/localhost/abc".to_owned(),
        ),
        (
            "DELETE",
            "/_synapse/admin/v1/media/localhost/abc".to_owned(),
        ),
    ];
    let anonymous = server.client();
    for (method, path) in &calls {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        bob.request(method.clone(), path, Some(json!({})))
            .await
            .assert_error(403, "M_FORBIDDEN");
        anonymous
            .request(method, path, Some(json!({})))
            .await
            .assert_error(401, "M_MISSING_TOKEN");
    }
    // Nothing was changed by the refused calls.
    assert_eq!(
        admin
            .get(&format!("/_synapse/admin/v2/users/{bob_id}"))
            .await
            .ok()["deactivated"],
        false
    );

    let version = anonymous
        .get("/_synapse/admin/v1/server_version")
        .await
        .ok();
    assert!(version["server_version"]
        .as_str()
        .unwrap()
        .starts_with("myelin "));
}

#[tokio::test]
async fn user_lists_filter_order_page_and_count_as_synapse_does() {
    let server = TestServer::start().await;
    let admin = server.create_admin("root", "rootpassword").await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    server.register("carol").await;
    bob.put(
        &format!(
            "/_matrix/client/v3/profile/{}/displayname",
            enc(&bob.user_id)
        ),
        json!({ "displayname": "zed" }),
    )
    .await
    .ok();
    admin
        .post(
            &format!(
                "/_synapse/admin/v1/deactivate/{}",
                enc(&server.user_id("carol"))
            ),
            json!({}),
        )
        .await
        .ok();
    let list = |query: &str| {
        let admin = admin.clone();
        let query = query.to_owned();
        async move { admin.get(&format!("/_synapse/admin/{query}")).await.ok() }
    };
    let id = |localpart: &str| server.user_id(localpart);

    // v2 leaves deactivated users out unless asked; the list is by user ID.
    let all = list("v2/users").await;
    assert_eq!(names(&all), [id("alice"), id("bob"), id("root")]);
    assert_eq!(all["total"], 3);
    assert!(all.get("next_token").is_none());
    let alice_entry = &all["users"][0];
    for key in [
        "name",
        "is_guest",
        "admin",
        "user_type",
        "deactivated",
        "erased",
        "shadow_banned",
        "displayname",
        "avatar_url",
        "creation_ts",
        "last_seen_ts",
        "locked",
    ] {
        assert!(
            alice_entry.get(key).is_some(),
            "{key} missing: {alice_entry}"
        );
    }
    assert_eq!(alice_entry["displayname"], "alice");
    // Milliseconds in the list.
    assert!(alice_entry["creation_ts"].as_i64().unwrap() > 1_000_000_000_000);
    assert!(alice_entry["last_seen_ts"].as_i64().is_some());
    assert_eq!(names(&list("v2/users?deactivated=true").await).len(), 4);

    // v3 reads `deactivated` as a filter both ways.
    let deactivated = list("v3/users?deactivated=true").await;
    assert_eq!(names(&deactivated), [id("carol")]);
    // Without `erase` the profile stays, as in Synapse.
    assert_eq!(deactivated["users"][0]["displayname"], "carol");
    assert_eq!(deactivated["users"][0]["erased"], false);
    assert_eq!(names(&list("v3/users?deactivated=false").await).len(), 3);
    assert_eq!(list("v3/users").await["total"], 4);

    // Paging: `next_token` is a string offset, present only while more follow.
    let first = list("v2/users?limit=2").await;
    assert_eq!(names(&first), [id("alice"), id("bob")]);
    assert_eq!(first["next_token"], "2");
    assert_eq!(first["total"], 3);
    let second = list("v2/users?limit=2&from=2").await;
    assert_eq!(names(&second), [id("root")]);
    assert!(second.get("next_token").is_none());

    // Filters: `name` matches localparts and display names, `user_id` the ID, `admins`.
    assert_eq!(names(&list("v2/users?name=ZE").await), [id("bob")]);
    assert_eq!(names(&list("v2/users?user_id=lic").await), [id("alice")]);
    assert_eq!(names(&list("v2/users?admins=true").await), [id("root")]);
    assert_eq!(names(&list("v2/users?admins=false").await).len(), 2);
    // `%` is a literal, not a wildcard.
    assert_eq!(list("v2/users?name=%25").await["total"], 0);

    // Orders, in both directions.
    assert_eq!(
        names(&list("v2/users?order_by=displayname&dir=b").await),
        [id("bob"), id("root"), id("alice")]
    );
    assert_eq!(
        names(&list("v2/users?order_by=creation_ts&dir=b").await),
        [id("bob"), id("alice"), id("root")]
    );
    assert_eq!(
        names(&list("v2/users?order_by=admin&dir=b").await)[0],
        id("root")
    );
    assert_eq!(names(&list("v2/users?dir=b").await)[0], id("root"));

    for bad in [
        "dir=x",
        "order_by=height",
        "from=-1",
        "limit=x",
        "admins=maybe",
    ] {
        admin
            .get(&format!("/_synapse/admin/v2/users?{bad}"))
            .await
            .assert_error(400, "M_INVALID_PARAM");
    }
    drop(alice);
}

#[tokio::test]
async fn admins_create_modify_deactivate_with_erase_and_reactivate_users() {
    let server = TestServer::start().await;
    let admin = server.create_admin("root", "rootpassword").await;
    let alice = server.register("alice").await;
    let dave = user_path(&server, "dave");

    // Created with the fields the UI sends, its own ones included (ignored).
    let created = admin
        .put(
            &dave,
            json!({
                "password": "first-password", "displayname": "Dave", "admin": false,
                "threepids": [], "avatar_src": "x", "is_guest": false, "user_type": null,
            }),
        )
        .await;
    assert_eq!(created.status.as_u16(), 201, "{}", created.body);
    assert_eq!(created.body["name"], server.user_id("dave"));
    assert_eq!(created.body["displayname"], "Dave");
    // Seconds in the details, as Synapse serves them.
    assert!(created.body["creation_ts"].as_i64().unwrap() < 100_000_000_000);
    for key in [
        "threepids",
        "external_ids",
        "erased",
        "appservice_id",
        "locked",
    ] {
        assert!(created.body.get(key).is_some(), "{key} missing");
    }
    let dave_client = server.client().login("dave", "first-password").await;

    // Modified: 200 and the details afterwards.
    let modified = admin
        .put(
            &dave,
            json!({ "displayname": "David", "admin": true, "creation_ts_ms": 1 }),
        )
        .await
        .ok();
    assert_eq!(modified["displayname"], "David");
    assert_eq!(modified["admin"], true);
    let flag = format!(
        "/_synapse/admin/v1/users/{}/admin",
        enc(&server.user_id("dave"))
    );
    assert_eq!(admin.get(&flag).await.ok()["admin"], true);
    admin.put(&flag, json!({ "admin": false })).await.ok();
    assert_eq!(admin.get(&dave).await.ok()["admin"], false);
    admin
        .put(&dave, json!({ "admin": "yes" }))
        .await
        .assert_error(400, "M_INVALID_PARAM");
    admin
        .get(&user_path(&server, "nobody"))
        .await
        .assert_error(404, "M_NOT_FOUND");
    admin
        .get("/_synapse/admin/v2/users/not-a-user-id")
        .await
        .assert_error(400, "M_INVALID_PARAM");

    // Dave's rooms, as the Rooms and Memberships tabs read them.
    let room = alice.create_room(json!({ "preset": "public_chat" })).await;
    dave_client.join(&room).await.ok();
    let dave_id = enc(&server.user_id("dave"));
    let joined = admin
        .get(&format!("/_synapse/admin/v1/users/{dave_id}/joined_rooms"))
        .await
        .ok();
    assert_eq!(joined, json!({ "joined_rooms": [room], "total": 1 }));
    let memberships = admin
        .get(&format!("/_synapse/admin/v1/users/{dave_id}/memberships"))
        .await
        .ok();
    assert_eq!(memberships["memberships"][&room], "join");

    // Saving the whole record unchanged sends nothing into Dave's rooms; a new name does.
    let member_events = format!(
        "SELECT count(*) AS n FROM events WHERE room_id = '{room}' \
         AND event_type = 'm.room.member' AND state_key = '{}'",
        server.user_id("dave")
    );
    let before = server.count(&member_events).await;
    let mut record = admin.get(&dave).await.ok();
    record["avatar_src"] = json!(null);
    admin.put(&dave, record).await.ok();
    assert_eq!(server.count(&member_events).await, before);
    admin
        .put(&dave, json!({ "displayname": "Dave again" }))
        .await
        .ok();
    assert_eq!(server.count(&member_events).await, before + 1);
    let member = alice
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/state/m.room.member/{dave_id}",
            enc(&room)
        ))
        .await
        .ok();
    assert_eq!(member["displayname"], "Dave again");

    // Deactivated with erase: no login, no session, out of the room, profile gone.
    let deactivated = admin
        .post(
            &format!("/_synapse/admin/v1/deactivate/{dave_id}"),
            json!({ "erase": true }),
        )
        .await
        .ok();
    assert_eq!(deactivated["id_server_unbind_result"], "no-support");
    let details = admin.get(&dave).await.ok();
    assert_eq!(details["deactivated"], true);
    assert_eq!(details["erased"], true);
    assert_eq!(details["displayname"], Value::Null);
    server
        .client()
        .login_response("dave", "first-password")
        .await
        .assert_error(403, "M_USER_DEACTIVATED");
    dave_client
        .get("/_matrix/client/v3/account/whoami")
        .await
        .assert_error(401, "M_UNKNOWN_TOKEN");
    let members = alice
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/joined_members",
            enc(&room)
        ))
        .await
        .ok();
    assert!(members["joined"].get(server.user_id("dave")).is_none());

    // Reactivation needs a new password.
    admin
        .put(&dave, json!({ "deactivated": false }))
        .await
        .assert_error(400, "M_INVALID_PARAM");
    let back = admin
        .put(
            &dave,
            json!({ "deactivated": false, "password": "second-password" }),
        )
        .await
        .ok();
    assert_eq!(back["deactivated"], false);
    server.client().login("dave", "second-password").await;

    // Only local users.
    admin
        .put(
            "/_synapse/admin/v2/users/%40eve%3Aelsewhere.example",
            json!({}),
        )
        .await
        .assert_error(400, "M_INVALID_PARAM");
    // Admins cannot demote themselves.
    admin
        .put(&user_path(&server, "root"), json!({ "admin": false }))
        .await
        .assert_error(400, "M_INVALID_PARAM");
}

#[tokio::test]
async fn password_resets_replace_the_password_and_log_devices_out() {
    let server = TestServer::start().await;
    let admin = server.create_admin("root", "rootpassword").await;
    let alice = server.register("alice").await;
    let second = server.client().login("alice", "password").await;
    let reset = format!("/_synapse/admin/v1/reset_password/{}", enc(&alice.user_id));

    let kept = admin
        .post(
            &reset,
            json!({ "new_password": "new-one", "logout_devices": false }),
        )
        .await
        .ok();
    assert_eq!(kept, json!({}));
    alice.get("/_matrix/client/v3/account/whoami").await.ok();
    server
        .client()
        .login_response("alice", "password")
        .await
        .assert_error(403, "M_FORBIDDEN");

    admin
        .post(&reset, json!({ "new_password": "newest" }))
        .await
        .ok();
    for client in [&alice, &second] {
        client
            .get("/_matrix/client/v3/account/whoami")
            .await
            .assert_error(401, "M_UNKNOWN_TOKEN");
    }
    server
        .client()
        .login_response("alice", "new-one")
        .await
        .assert_error(403, "M_FORBIDDEN");
    server.client().login("alice", "newest").await;

    admin
        .post(&reset, json!({}))
        .await
        .assert_error(400, "M_MISSING_PARAM");
    admin
        .post(
            &format!(
                "/_synapse/admin/v1/reset_password/{}",
                enc(&server.user_id("ghost"))
            ),
            json!({ "new_password": "x" }),
        )
        .await
        .assert_error(404, "M_NOT_FOUND");
}

#[tokio::test]
async fn admins_list_rename_and_delete_a_users_devices() {
    let server = TestServer::start().await;
    let admin = server.create_admin("root", "rootpassword").await;
    let alice = server.register("alice").await;
    let second = server.client().login("alice", "password").await;
    let third = server.client().login("alice", "password").await;
    let base = format!("/_synapse/admin/v2/users/{}", enc(&alice.user_id));

    let listed = admin.get(&format!("{base}/devices")).await.ok();
    assert_eq!(listed["total"], 3);
    let device = listed["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["device_id"] == second.device_id.as_str())
        .expect("the second login's device");
    for key in [
        "device_id",
        "display_name",
        "last_seen_ip",
        "last_seen_user_agent",
        "last_seen_ts",
        "user_id",
        "dehydrated",
    ] {
        assert!(device.get(key).is_some(), "{key} missing: {device}");
    }
    assert_eq!(device["user_id"], alice.user_id.as_str());

    // Device IDs come raw in the path from the UIs.
    let one = format!("{base}/devices/{}", second.device_id);
    admin
        .put(&one, json!({ "display_name": "Old phone" }))
        .await
        .ok();
    assert_eq!(admin.get(&one).await.ok()["display_name"], "Old phone");
    admin
        .get(&format!("{base}/devices/NOSUCHDEVICE"))
        .await
        .assert_error(404, "M_NOT_FOUND");

    admin.delete(&one, json!({})).await.ok();
    second
        .get("/_matrix/client/v3/account/whoami")
        .await
        .assert_error(401, "M_UNKNOWN_TOKEN");
    admin
        .post(
            &format!("{base}/delete_devices"),
            json!({ "devices": [third.device_id] }),
        )
        .await
        .ok();
    third
        .get("/_matrix/client/v3/account/whoami")
        .await
        .assert_error(401, "M_UNKNOWN_TOKEN");
    let left = admin.get(&format!("{base}/devices")).await.ok();
    assert_eq!(left["total"], 1);
    assert_eq!(left["devices"][0]["device_id"], alice.device_id.as_str());
    alice.get("/_matrix/client/v3/account/whoami").await.ok();

    // Devices made by an admin come without a session.
    admin
        .post(
            &format!("{base}/devices"),
            json!({ "device_id": "MADEBYADMIN" }),
        )
        .await
        .ok();
    assert_eq!(admin.get(&format!("{base}/devices")).await.ok()["total"], 2);
    admin.get(&format!("{base}/devices/MADEBYADMIN")).await.ok();

    // The create-user form's check.
    let available = "/_synapse/admin/v1/username_available?username=";
    admin
        .get(&format!("{available}alice"))
        .await
        .assert_error(400, "M_USER_IN_USE");
    admin
        .get(&format!("{available}Bad%20Name"))
        .await
        .assert_error(400, "M_INVALID_USERNAME");
    assert_eq!(
        admin.get(&format!("{available}newcomer")).await.ok(),
        json!({ "available": true })
    );

    let whois = admin
        .get(&format!("/_synapse/admin/v1/whois/{}", enc(&alice.user_id)))
        .await
        .ok();
    assert_eq!(whois["user_id"], alice.user_id.as_str());
    assert!(whois["devices"][""]["sessions"][0]["connections"].is_array());
}

#[tokio::test]
async fn rate_limit_overrides_are_stored_reported_and_removed() {
    let server = TestServer::start().await;
    let admin = server.create_admin("root", "rootpassword").await;
    let alice: Client = server.register("alice").await;
    let path = format!(
        "/_synapse/admin/v1/users/{}/override_ratelimit",
        enc(&alice.user_id)
    );
    assert_eq!(admin.get(&path).await.ok(), json!({}));
    let set = admin
        .post(
            &path,
            json!({ "messages_per_second": 5, "burst_count": 10 }),
        )
        .await
        .ok();
    assert_eq!(set, json!({ "messages_per_second": 5, "burst_count": 10 }));
    assert_eq!(admin.get(&path).await.ok(), set);
    // Zero (no limit) by default, as in Synapse.
    admin.post(&path, json!({})).await.ok();
    assert_eq!(
        admin.get(&path).await.ok(),
        json!({ "messages_per_second": 0, "burst_count": 0 })
    );
    admin
        .post(&path, json!({ "messages_per_second": -1 }))
        .await
        .assert_error(400, "M_INVALID_PARAM");
    assert_eq!(admin.delete(&path, json!({})).await.ok(), json!({}));
    assert_eq!(admin.get(&path).await.ok(), json!({}));
}

#[tokio::test]
async fn admins_log_in_as_a_user_on_a_device_the_user_does_not_see() {
    let server = TestServer::start().await;
    let admin = server.create_admin("root", "rootpassword").await;
    let alice = server.register("alice").await;
    let login = format!("/_synapse/admin/v1/users/{}/login", enc(&alice.user_id));

    let token = admin.post(&login, json!({})).await.ok()["access_token"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut puppet = server.client();
    puppet.token = Some(token);
    let whoami = puppet.get("/_matrix/client/v3/account/whoami").await.ok();
    assert_eq!(whoami["user_id"], alice.user_id.as_str());
    // Neither the user nor the admin's device list shows the session.
    let own = alice.get("/_matrix/client/v3/devices").await.ok();
    assert_eq!(own["devices"].as_array().unwrap().len(), 1);
    let listed = admin
        .get(&format!(
            "/_synapse/admin/v2/users/{}/devices",
            enc(&alice.user_id)
        ))
        .await
        .ok();
    assert_eq!(listed["total"], 1);
    // It ends with the user's other sessions.
    alice
        .post("/_matrix/client/v3/logout/all", json!({}))
        .await
        .ok();
    puppet
        .get("/_matrix/client/v3/account/whoami")
        .await
        .assert_error(401, "M_UNKNOWN_TOKEN");

    // A token already expired does not work.
    let expired = admin
        .post(&login, json!({ "valid_until_ms": 1 }))
        .await
        .ok();
    puppet.token = expired["access_token"].as_str().map(str::to_owned);
    puppet
        .get("/_matrix/client/v3/account/whoami")
        .await
        .assert_error(401, "M_UNKNOWN_TOKEN");

    admin
        .post(
            &format!("/_synapse/admin/v1/users/{}/login", enc(&admin.user_id)),
            json!({}),
        )
        .await
        .assert_error(400, "M_INVALID_PARAM");
    admin
        .post(
            &format!(
                "/_synapse/admin/v1/users/{}/login",
                enc(&server.user_id("ghost"))
            ),
            json!({}),
        )
        .await
        .assert_error(404, "M_NOT_FOUND");
}
