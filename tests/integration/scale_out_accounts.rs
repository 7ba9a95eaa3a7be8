//! Scale-out, accounts and operations: a token, an admin's rights, media and rate limits with
//! two server processes on one database, and two processes started together on an empty one.
//! The messaging side is in `scale_out.rs`.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::scale_out::{refused_soon, via};
use crate::support::{
    client::enc, spawn_server_capturing_log, Client, ServerOptions, TestDb, TestServer,
};

#[tokio::test]
async fn a_token_from_one_process_works_on_the_other_until_logged_out_there() {
    let a = TestServer::start().await;
    let b = a.second_process().await;
    a.register("carol").await;
    // A second device: logged in on A, used on both (each process caches it).
    let carol_on_a = a.client().login("carol", "password").await;
    let carol_on_b = via(&carol_on_a, &b);
    for client in [&carol_on_a, &carol_on_b] {
        let whoami = client.get("/_matrix/client/v3/account/whoami").await.ok();
        assert_eq!(whoami["user_id"], carol_on_a.user_id.as_str());
        assert_eq!(whoami["device_id"], carol_on_a.device_id.as_str());
    }
    // Logged out through B: A, which has the token cached, refuses it at once (not after its
    // cache's 10 s lifetime).
    carol_on_b
        .post("/_matrix/client/v3/logout", json!({}))
        .await
        .ok();
    refused_soon(
        &carol_on_a,
        "/_matrix/client/v3/account/whoami",
        (401, "M_UNKNOWN_TOKEN"),
        "A still accepts a token logged out on B",
    )
    .await;
    carol_on_b
        .get("/_matrix/client/v3/account/whoami")
        .await
        .assert_error(401, "M_UNKNOWN_TOKEN");

    // logout/all on A ends every device's token on B too.
    let phone_on_b = via(&a.client().login("carol", "password").await, &b);
    let laptop_on_a = a.client().login("carol", "password").await;
    phone_on_b
        .get("/_matrix/client/v3/account/whoami")
        .await
        .ok();
    laptop_on_a
        .post("/_matrix/client/v3/logout/all", json!({}))
        .await
        .ok();
    refused_soon(
        &phone_on_b,
        "/_matrix/client/v3/account/whoami",
        (401, "M_UNKNOWN_TOKEN"),
        "B still accepts a token after logout/all on A",
    )
    .await;
}

#[tokio::test]
async fn media_uploaded_through_one_process_downloads_and_thumbnails_through_the_other() {
    let a = TestServer::start().await;
    let b = a.second_process().await;
    let alice = a.register("alice").await;
    let alice_on_b = via(&alice, &b);
    let bytes = crate::media::png(64, 48);
    let uri = crate::media::upload(&alice, bytes.clone(), "image/png", "pic.png").await
        ["content_uri"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = uri.strip_prefix("mxc://").unwrap();
    let download = crate::media::send(
        &alice_on_b,
        reqwest::Method::GET,
        &format!("/_matrix/client/v1/media/download/{path}"),
        Vec::new(),
        &[],
    )
    .await;
    assert_eq!(download.status(), reqwest::StatusCode::OK);
    assert_eq!(download.bytes().await.unwrap().as_ref(), bytes.as_slice());
    let thumbnail = crate::media::send(
        &alice_on_b,
        reqwest::Method::GET,
        &format!("/_matrix/client/v1/media/thumbnail/{path}?width=32&height=32&method=crop"),
        Vec::new(),
        &[],
    )
    .await;
    assert_eq!(thumbnail.status(), reqwest::StatusCode::OK);
    let image = image::load_from_memory(&thumbnail.bytes().await.unwrap()).unwrap();
    assert_eq!((image.width(), image.height()), (32, 32));

    // What a process not sharing the media directory sees: the file missing on disk is a
    // 404, not a server error.
    let sha256: String = {
        use sha2::Digest;
        sha2::Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let stored = a
        .data_dir()
        .join("media")
        .join(&sha256[..2])
        .join(&sha256[2..4])
        .join(&sha256);
    std::fs::remove_file(&stored).expect("the upload is stored under the shared media directory");
    let missing = crate::media::send(
        &alice_on_b,
        reqwest::Method::GET,
        &format!("/_matrix/client/v1/media/download/{path}"),
        Vec::new(),
        &[],
    )
    .await;
    assert_eq!(missing.status(), reqwest::StatusCode::NOT_FOUND);
    let body: Value = missing.json().await.unwrap();
    assert_eq!(body["errcode"], "M_NOT_FOUND");
}

#[tokio::test]
async fn rate_limits_are_counted_per_process() {
    let a = TestServer::start_with(ServerOptions::default().env("MYELIN_RATE_LIMITS", "on")).await;
    let b = a.second_process().await;
    let on_a = a.client();
    let mut limited = false;
    for _ in 0..10 {
        let response = on_a.login_response("nobody", "wrong").await;
        if response.status == 429 {
            response.assert_error(429, "M_LIMIT_EXCEEDED");
            limited = true;
            break;
        }
    }
    assert!(limited, "A never rate limited the logins");
    // B keeps its own buckets: the same address is not limited there (yet).
    Client::new(&b.base_url)
        .login_response("nobody", "wrong")
        .await
        .assert_error(403, "M_FORBIDDEN");
}

#[tokio::test]
async fn an_admin_demoted_through_one_process_loses_admin_rights_on_the_other_at_once() {
    let a = TestServer::start().await;
    let b = a.second_process().await;
    let root = a.create_admin("root", "password").await;
    let deputy_on_b = via(&a.create_admin("deputy", "password").await, &b);
    // B caches the deputy's token lookup, admin flag included.
    deputy_on_b
        .get("/_synapse/admin/v2/users?limit=1")
        .await
        .ok();
    root.put(
        &format!(
            "/_synapse/admin/v1/users/{}/admin",
            enc(&deputy_on_b.user_id)
        ),
        json!({ "admin": false }),
    )
    .await
    .ok();
    refused_soon(
        &deputy_on_b,
        "/_synapse/admin/v2/users?limit=1",
        (403, "M_FORBIDDEN"),
        "B still treats a demoted admin as an admin",
    )
    .await;
}

/// A deployment starts its processes together, on a new database or after an upgrade: each
/// migrates at start, and they must not trip over each other doing it.
#[tokio::test]
async fn two_processes_started_together_on_an_empty_database_both_migrate_and_serve() {
    let db = TestDb::empty().await;
    let options = ServerOptions::default();
    let ((mut first, first_url), (mut second, second_url)) = tokio::join!(
        spawn_server_capturing_log(&db, &options),
        spawn_server_capturing_log(&db, &options)
    );
    // Both listen before migrating; both must get to ready (a failed migration exits).
    let ready = |base: String| async move {
        reqwest::get(format!("{base}/readyz"))
            .await
            .is_ok_and(|r| r.status() == 200)
    };
    let outcome = async {
        for (child, base) in [(&mut first, &first_url), (&mut second, &second_url)] {
            let deadline = Instant::now() + Duration::from_secs(90);
            loop {
                if ready(base.clone()).await {
                    break;
                }
                if let Some(status) = child.try_wait().unwrap() {
                    let mut log = String::new();
                    if let Some(mut stderr) = child.stderr.take() {
                        std::io::Read::read_to_string(&mut stderr, &mut log).ok();
                    }
                    return Err(format!("a process exited ({status}) while starting: {log}"));
                }
                if Instant::now() > deadline {
                    return Err("a process never became ready".to_owned());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        // Both serve the same, fully migrated database.
        let alice = Client::new(&first_url).register("alice", "password").await;
        let mut alice_on_second = alice.clone();
        alice_on_second.base = second_url.clone();
        alice_on_second.create_room(json!({})).await;
        Ok(())
    }
    .await;
    for child in [&mut first, &mut second] {
        let _ = child.kill();
        let _ = child.wait();
    }
    outcome.unwrap();
}
