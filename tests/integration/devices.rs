//! Device listing, renaming and deletion (with UIA and token revocation).

use serde_json::json;

use crate::support::TestServer;

#[tokio::test]
async fn devices_are_listed_renamed_and_looked_up() {
    let server = TestServer::start().await;
    let jo = server.register("jo").await;
    let second = server.client().login("jo", "password").await;
    let list = jo.get("/_matrix/client/v3/devices").await.ok();
    let ids: Vec<&str> = list["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["device_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 2);
    assert!(ids.contains(&jo.device_id.as_str()) && ids.contains(&second.device_id.as_str()));

    let path = format!("/_matrix/client/v3/devices/{}", second.device_id);
    jo.put(&path, json!({ "display_name": "Laptop" }))
        .await
        .ok();
    let device = jo.get(&path).await.ok();
    assert_eq!(device["display_name"], "Laptop");
    assert!(device["last_seen_ts"].as_u64().is_some());
    jo.get("/_matrix/client/v3/devices/NOPE")
        .await
        .assert_error(404, "M_NOT_FOUND");
    jo.put(
        "/_matrix/client/v3/devices/NOPE",
        json!({ "display_name": "x" }),
    )
    .await
    .assert_error(404, "M_NOT_FOUND");
}

#[tokio::test]
async fn deleting_a_device_needs_the_password_and_kills_its_token() {
    let server = TestServer::start().await;
    let kim = server.register("kim").await;
    let phone = server.client().login("kim", "password").await;
    let path = format!("/_matrix/client/v3/devices/{}", phone.device_id);

    let challenge = kim.delete(&path, json!({})).await;
    assert_eq!(challenge.status, 401);
    let session = challenge.body["session"].as_str().unwrap();
    phone.get("/_matrix/client/v3/account/whoami").await.ok();
    kim.delete(
        &path,
        json!({ "auth": kim.password_auth("password", Some(session)) }),
    )
    .await
    .ok();
    phone
        .get("/_matrix/client/v3/account/whoami")
        .await
        .assert_error(401, "M_UNKNOWN_TOKEN");
    kim.get(&path).await.assert_error(404, "M_NOT_FOUND");
}

#[tokio::test]
async fn delete_devices_removes_several_at_once() {
    let server = TestServer::start().await;
    let lee = server.register("lee").await;
    let a = server.client().login("lee", "password").await;
    let b = server.client().login("lee", "password").await;
    lee.post(
        "/_matrix/client/v3/delete_devices",
        json!({ "devices": [a.device_id, b.device_id], "auth": lee.password_auth("password", None) }),
    )
    .await
    .ok();
    a.get("/_matrix/client/v3/account/whoami")
        .await
        .assert_error(401, "M_UNKNOWN_TOKEN");
    b.get("/_matrix/client/v3/account/whoami")
        .await
        .assert_error(401, "M_UNKNOWN_TOKEN");
    let list = lee.get("/_matrix/client/v3/devices").await.ok();
    assert_eq!(list["devices"].as_array().unwrap().len(), 1);
}
