//! Registration, login, logout, refresh, password change and deactivation.

use serde_json::json;

use crate::support::{client::enc, user_id, ServerOptions, TestServer};

const REGISTER: &str = "/_matrix/client/v3/register";

#[tokio::test]
async fn register_without_auth_gets_uia_challenge_then_completes_with_dummy() {
    let server = TestServer::start().await;
    let client = server.client();
    let challenge = client
        .post(REGISTER, json!({ "username": "alice", "password": "pw" }))
        .await;
    assert_eq!(challenge.status, 401);
    assert_eq!(
        challenge.body["flows"],
        json!([{ "stages": ["m.login.dummy"] }])
    );
    let session = challenge.body["session"]
        .as_str()
        .expect("session")
        .to_owned();

    let done = client
        .post(
            REGISTER,
            json!({ "username": "alice", "password": "pw", "auth": { "type": "m.login.dummy", "session": session } }),
        )
        .await
        .ok();
    assert_eq!(done["user_id"], user_id("alice"));
    assert!(
        done["access_token"].as_str().unwrap().len() >= 43,
        "token has at least 256 bits"
    );
    let alice = client.with_session(&done);
    let whoami = alice.get("/_matrix/client/v3/account/whoami").await.ok();
    assert_eq!(whoami["user_id"], user_id("alice"));
    assert_eq!(whoami["device_id"], done["device_id"]);

    // The completed session cannot be replayed for a second account.
    let replay = client
        .post(REGISTER, json!({ "username": "mallory", "auth": { "type": "m.login.dummy", "session": session } }))
        .await;
    assert_eq!(
        replay.status.as_u16() / 100,
        4,
        "replayed session must fail: {}",
        replay.body
    );
}

#[tokio::test]
async fn taken_and_invalid_usernames_are_refused() {
    let server = TestServer::start().await;
    server.register("bob").await;
    let client = server.client();
    let again = client
        .post(
            REGISTER,
            json!({ "username": "bob", "auth": { "type": "m.login.dummy" } }),
        )
        .await;
    again.assert_error(400, "M_USER_IN_USE");
    let bad = client
        .post(
            REGISTER,
            json!({ "username": "b@d!", "auth": { "type": "m.login.dummy" } }),
        )
        .await;
    bad.assert_error(400, "M_INVALID_USERNAME");
    client
        .get("/_matrix/client/v3/register/available?username=bob")
        .await
        .assert_error(400, "M_USER_IN_USE");
    let free = client
        .get("/_matrix/client/v3/register/available?username=carol")
        .await
        .ok();
    assert_eq!(free["available"], true);
}

#[tokio::test]
async fn inhibit_login_registers_without_a_session() {
    let server = TestServer::start().await;
    let body = server
        .client()
        .post(REGISTER, json!({ "username": "quiet", "password": "pw", "inhibit_login": true, "auth": { "type": "m.login.dummy" } }))
        .await
        .ok();
    assert_eq!(body["user_id"], user_id("quiet"));
    assert!(body.get("access_token").is_none(), "{body}");
    server.client().login("quiet", "pw").await;
}

#[tokio::test]
async fn closed_registration_is_forbidden() {
    let server =
        TestServer::start_with(ServerOptions::default().env("MYELIN_REGISTRATION", "closed")).await;
    let response = server
        .client()
        .post(
            REGISTER,
            json!({ "username": "x", "auth": { "type": "m.login.dummy" } }),
        )
        .await;
    response.assert_error(403, "M_FORBIDDEN");
}

#[tokio::test]
async fn token_registration_uses_admin_created_tokens_and_counts_uses() {
    let server =
        TestServer::start_with(ServerOptions::default().env("MYELIN_REGISTRATION", "token")).await;
    let admin = server.create_admin("root", "rootpw").await;
    let token = admin
        .post(
            "/_synapse/admin/v1/registration_tokens/new",
            json!({ "token": "letmein", "uses_allowed": 1 }),
        )
        .await
        .ok();
    assert_eq!(token["token"], "letmein");

    let client = server.client();
    let validity = "/_matrix/client/v1/register/m.login.registration_token/validity";
    assert_eq!(
        client.get(&format!("{validity}?token=letmein")).await.ok()["valid"],
        true
    );
    assert_eq!(
        client.get(&format!("{validity}?token=nope")).await.ok()["valid"],
        false
    );

    let challenge = client
        .post(REGISTER, json!({ "username": "newbie", "password": "pw" }))
        .await;
    assert_eq!(
        challenge.body["flows"],
        json!([{ "stages": ["m.login.registration_token"] }])
    );
    let wrong = client
        .post(REGISTER, json!({ "username": "newbie", "password": "pw", "auth": { "type": "m.login.registration_token", "token": "nope" } }))
        .await;
    assert_eq!(wrong.status, 401);
    assert_eq!(wrong.body["errcode"], "M_UNAUTHORIZED");
    let dummy = client
        .post(
            REGISTER,
            json!({ "username": "newbie", "auth": { "type": "m.login.dummy" } }),
        )
        .await;
    assert_eq!(
        dummy.status, 401,
        "dummy is not enough in token mode: {}",
        dummy.body
    );

    let ok = client
        .post(REGISTER, json!({ "username": "newbie", "password": "pw", "auth": { "type": "m.login.registration_token", "token": "letmein" } }))
        .await
        .ok();
    assert_eq!(ok["user_id"], user_id("newbie"));
    // The single use is spent.
    assert_eq!(
        client.get(&format!("{validity}?token=letmein")).await.ok()["valid"],
        false
    );
    let listed = admin
        .get("/_synapse/admin/v1/registration_tokens")
        .await
        .ok();
    assert_eq!(listed["registration_tokens"][0]["completed"], 1);
    // Non-admins cannot manage tokens.
    let user = client.with_session(&ok);
    user.get("/_synapse/admin/v1/registration_tokens")
        .await
        .assert_error(403, "M_FORBIDDEN");
}

#[tokio::test]
async fn login_accepts_localpart_and_full_id_and_rejects_bad_passwords() {
    let server = TestServer::start().await;
    server.register("dave").await;
    let client = server.client();
    let by_localpart = client.login_response("dave", "password").await.ok();
    assert_eq!(by_localpart["user_id"], user_id("dave"));
    assert!(by_localpart["well_known"]["m.homeserver"]["base_url"].is_string());
    let by_id = client
        .login_response(&user_id("dave"), "password")
        .await
        .ok();
    assert_ne!(
        by_id["device_id"], by_localpart["device_id"],
        "each login is a new device"
    );
    client
        .login_response("dave", "wrong")
        .await
        .assert_error(403, "M_FORBIDDEN");
    client
        .login_response("nobody", "password")
        .await
        .assert_error(403, "M_FORBIDDEN");
    let flows = client.get("/_matrix/client/v3/login").await.ok();
    assert_eq!(flows["flows"][0]["type"], "m.login.password");
}

#[tokio::test]
async fn logout_revokes_the_token_at_once() {
    let server = TestServer::start().await;
    let erin = server.register("erin").await;
    erin.get("/_matrix/client/v3/account/whoami").await.ok();
    erin.post("/_matrix/client/v3/logout", json!({})).await.ok();
    let after = erin.get("/_matrix/client/v3/account/whoami").await;
    after.assert_error(401, "M_UNKNOWN_TOKEN");
    assert_eq!(after.body["soft_logout"], false);
}

#[tokio::test]
async fn logout_all_revokes_every_device() {
    let server = TestServer::start().await;
    let first = server.register("fay").await;
    let second = server.client().login("fay", "password").await;
    first.get("/_matrix/client/v3/account/whoami").await.ok();
    second
        .post("/_matrix/client/v3/logout/all", json!({}))
        .await
        .ok();
    first
        .get("/_matrix/client/v3/account/whoami")
        .await
        .assert_error(401, "M_UNKNOWN_TOKEN");
    second
        .get("/_matrix/client/v3/account/whoami")
        .await
        .assert_error(401, "M_UNKNOWN_TOKEN");
}

#[tokio::test]
async fn refresh_tokens_rotate_and_expired_tokens_are_soft_logged_out() {
    let server = TestServer::start_with(
        ServerOptions::default().env("MYELIN_REFRESHABLE_ACCESS_TOKEN_LIFETIME", "2"),
    )
    .await;
    let body = server
        .client()
        .post(REGISTER, json!({ "username": "gus", "password": "pw", "refresh_token": true, "auth": { "type": "m.login.dummy" } }))
        .await
        .ok();
    assert_eq!(body["expires_in_ms"], 2000);
    let refresh = body["refresh_token"]
        .as_str()
        .expect("refresh token")
        .to_owned();
    let gus = server.client().with_session(&body);
    gus.get("/_matrix/client/v3/account/whoami").await.ok();

    let rotated_at = std::time::Instant::now();
    let rotated = server
        .client()
        .post(
            "/_matrix/client/v3/refresh",
            json!({ "refresh_token": refresh }),
        )
        .await
        .ok();
    let new_gus = gus.with_session(&json!({
        "access_token": rotated["access_token"], "user_id": gus.user_id, "device_id": gus.device_id
    }));
    new_gus.get("/_matrix/client/v3/account/whoami").await.ok();
    gus.get("/_matrix/client/v3/account/whoami")
        .await
        .assert_error(401, "M_UNKNOWN_TOKEN");
    // A refresh token works once.
    server
        .client()
        .post(
            "/_matrix/client/v3/refresh",
            json!({ "refresh_token": refresh }),
        )
        .await
        .assert_error(401, "M_UNKNOWN_TOKEN");

    // Real time is the only way to expire a token: wait until the earliest moment it can have
    // (it was issued after `rotated_at`), then until the server says so.
    tokio::time::sleep_until((rotated_at + std::time::Duration::from_millis(2000)).into()).await;
    let mut expired = new_gus.get("/_matrix/client/v3/account/whoami").await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while expired.status == 200 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        expired = new_gus.get("/_matrix/client/v3/account/whoami").await;
    }
    expired.assert_error(401, "M_UNKNOWN_TOKEN");
    assert_eq!(expired.body["soft_logout"], true);
}

#[tokio::test]
async fn password_change_needs_the_old_password_and_logs_out_other_devices() {
    let server = TestServer::start().await;
    let main = server.register("hana").await;
    let other = server.client().login("hana", "password").await;
    let path = "/_matrix/client/v3/account/password";

    let challenge = main.post(path, json!({ "new_password": "new" })).await;
    assert_eq!(challenge.status, 401);
    assert_eq!(
        challenge.body["flows"],
        json!([{ "stages": ["m.login.password"] }])
    );
    let session = challenge.body["session"].as_str().unwrap();
    let wrong = main
        .post(
            path,
            json!({ "new_password": "new", "auth": main.password_auth("bad", Some(session)) }),
        )
        .await;
    assert_eq!(wrong.status, 401);
    assert_eq!(wrong.body["errcode"], "M_FORBIDDEN");

    main.post(
        path,
        json!({ "new_password": "new", "auth": main.password_auth("password", Some(session)) }),
    )
    .await
    .ok();
    main.get("/_matrix/client/v3/account/whoami").await.ok();
    other
        .get("/_matrix/client/v3/account/whoami")
        .await
        .assert_error(401, "M_UNKNOWN_TOKEN");
    server
        .client()
        .login_response("hana", "password")
        .await
        .assert_error(403, "M_FORBIDDEN");
    server.client().login("hana", "new").await;
}

#[tokio::test]
async fn deactivated_accounts_cannot_log_in_and_their_tokens_die() {
    let server = TestServer::start().await;
    let ivan = server.register("ivan").await;
    let path = "/_matrix/client/v3/account/deactivate";
    let done = ivan
        .post(
            path,
            json!({ "auth": ivan.password_auth("password", None) }),
        )
        .await
        .ok();
    assert_eq!(done["id_server_unbind_result"], "no-support");
    ivan.get("/_matrix/client/v3/account/whoami")
        .await
        .assert_error(401, "M_UNKNOWN_TOKEN");
    let login = server.client().login_response("ivan", "password").await;
    assert_eq!(login.status, 403, "{}", login.body);
    // The name stays taken.
    server
        .client()
        .get("/_matrix/client/v3/register/available?username=ivan")
        .await
        .assert_error(400, "M_USER_IN_USE");
}

#[tokio::test]
async fn deactivation_keeps_the_profile_unless_erase_is_asked() {
    let server = TestServer::start().await;
    let kim = server.register("kim").await;
    let ivan = server.register("ivan").await;
    let judy = server.register("judy").await;
    for user in [&ivan, &judy] {
        let profile = format!("/_matrix/client/v3/profile/{}", enc(&user.user_id));
        user.put(
            &format!("{profile}/displayname"),
            json!({ "displayname": "Someone" }),
        )
        .await
        .ok();
        user.put(
            &format!("{profile}/avatar_url"),
            json!({ "avatar_url": "mxc://example.org/face" }),
        )
        .await
        .ok();
    }
    let deactivate = "/_matrix/client/v3/account/deactivate";
    ivan.post(
        deactivate,
        json!({ "auth": ivan.password_auth("password", None) }),
    )
    .await
    .ok();
    judy.post(
        deactivate,
        json!({ "auth": judy.password_auth("password", None), "erase": true }),
    )
    .await
    .ok();

    // Without `erase` the profile stays, as in Synapse.
    let ivan_profile = format!("/_matrix/client/v3/profile/{}", enc(&ivan.user_id));
    let kept = kim.get(&ivan_profile).await.ok();
    assert_eq!(kept["displayname"], "Someone", "{kept}");
    assert_eq!(kept["avatar_url"], "mxc://example.org/face", "{kept}");
    // With it the profile is gone and the account marked erased.
    let judy_profile = format!("/_matrix/client/v3/profile/{}", enc(&judy.user_id));
    for field in ["displayname", "avatar_url"] {
        kim.get(&format!("{judy_profile}/{field}"))
            .await
            .assert_error(404, "M_NOT_FOUND");
    }
    let erased =
        |user: &str| format!("SELECT count(*) AS n FROM users WHERE user_id = '{user}' AND erased");
    assert_eq!(server.count(&erased(&ivan.user_id)).await, 0);
    assert_eq!(server.count(&erased(&judy.user_id)).await, 1);
}

#[tokio::test]
async fn deactivation_leaves_every_joined_invited_and_knocked_room() {
    let server = TestServer::start().await;
    let owner = server.register("owner").await;
    let ivan = server.register("ivan").await;
    let joined = owner.create_room(json!({ "preset": "public_chat" })).await;
    ivan.join(&joined).await.ok();
    let invited = owner.create_room(json!({})).await;
    owner
        .room_action(&invited, "invite", json!({ "user_id": ivan.user_id }))
        .await
        .ok();
    let knocked = owner
        .create_room(json!({ "room_version": "10", "initial_state": [
            { "type": "m.room.join_rules", "state_key": "", "content": { "join_rule": "knock" } }] }))
        .await;
    ivan.post(
        &format!("/_matrix/client/v3/knock/{}", enc(&knocked)),
        json!({}),
    )
    .await
    .ok();
    ivan.post(
        "/_matrix/client/v3/account/deactivate",
        json!({ "auth": ivan.password_auth("password", None) }),
    )
    .await
    .ok();
    for room in [&joined, &invited, &knocked] {
        let member = owner
            .get(&format!(
                "/_matrix/client/v3/rooms/{}/state/m.room.member/{}",
                enc(room),
                enc(&ivan.user_id)
            ))
            .await
            .ok();
        assert_eq!(member["membership"], "leave", "{room}");
    }
    let members = owner
        .get(&format!(
            "/_matrix/client/v3/rooms/{}/joined_members",
            enc(&joined)
        ))
        .await
        .ok();
    assert!(members["joined"].get(&ivan.user_id).is_none(), "{members}");
}

#[tokio::test]
async fn jwt_login_creates_and_logs_in_the_user() {
    let secret = "test-secret-at-least-32-bytes-long";
    let server =
        TestServer::start_with(ServerOptions::default().env("MYELIN_JWT_SECRET", secret)).await;
    let flows = server.client().get("/_matrix/client/v3/login").await.ok();
    assert!(
        flows["flows"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["type"] == "org.matrix.login.jwt"),
        "{flows}"
    );
    let claims = json!({ "sub": "jwtuser", "exp": 4_000_000_000u64 });
    let token = jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()).unwrap(),
    )
    .unwrap();
    let login = server
        .client()
        .post(
            "/_matrix/client/v3/login",
            json!({ "type": "org.matrix.login.jwt", "token": token }),
        )
        .await
        .ok();
    assert_eq!(login["user_id"], user_id("jwtuser"));
    let forged = jsonwebtoken::encode(
        &jsonwebtoken::Header::default(),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(b"wrong").unwrap(),
    )
    .unwrap();
    server
        .client()
        .post(
            "/_matrix/client/v3/login",
            json!({ "type": "org.matrix.login.jwt", "token": forged }),
        )
        .await
        .assert_error(403, "M_FORBIDDEN");
}

#[tokio::test]
async fn login_is_rate_limited_when_limits_are_on() {
    let server =
        TestServer::start_with(ServerOptions::default().env("MYELIN_RATE_LIMITS", "on")).await;
    let client = server.client();
    let mut limited = None;
    for _ in 0..10 {
        let response = client.login_response("nobody", "x").await;
        if response.status == 429 {
            limited = Some(response);
            break;
        }
    }
    let limited = limited.expect("login was never rate limited");
    limited.assert_error(429, "M_LIMIT_EXCEEDED");
    assert!(limited.body["retry_after_ms"].as_u64().unwrap() > 0);
}

#[tokio::test]
async fn logout_through_one_process_revokes_the_token_cached_by_another() {
    let server = TestServer::start().await;
    let second = server.second_process().await;
    let user = server.register("multi").await;
    let mut via_second = user.clone();
    via_second.base = second.base_url.clone();
    // The second process now has the token in its cache.
    via_second
        .get("/_matrix/client/v3/account/whoami")
        .await
        .ok();
    user.post("/_matrix/client/v3/logout", json!({})).await.ok();
    let started = std::time::Instant::now();
    loop {
        let response = via_second.get("/_matrix/client/v3/account/whoami").await;
        if response.status == 401 {
            response.assert_error(401, "M_UNKNOWN_TOKEN");
            break;
        }
        // Well under the cache's 10 s lifetime: the revocation must have been announced.
        assert!(
            started.elapsed().as_millis() < 2_000,
            "the other process still accepts the token"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
