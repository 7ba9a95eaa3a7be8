//! Third-party lookups answered by the appservices that registered the protocol, and the
//! appservice asked about an unknown user of its namespace before an invite names it.

use serde_json::{json, Value};

use crate::{
    appservices::server_with,
    support::{
        alias,
        appservice::{FakeAppservice, FakeRegistration},
        client::enc,
        server_name, user_id, ServerOptions, TestServer,
    },
};

/// The protocol metadata an IRC bridge answers with, with one instance.
fn irc_protocol(network: &str) -> Value {
    json!({
        "user_fields": ["network", "nickname"],
        "location_fields": ["network", "channel"],
        "icon": format!("mxc://example.org/{network}"),
        "field_types": {
            "network": { "regexp": "[a-z]+", "placeholder": "libera" },
            "nickname": { "regexp": ".+", "placeholder": "bob" },
            "channel": { "regexp": "#.+", "placeholder": "#matrix" },
        },
        "instances": [{
            "desc": network,
            "network_id": network,
            "fields": { "network": network },
        }],
    })
}

/// The GET requests `fake` received for `path`: their decoded query parameters.
fn queries_for(fake: &FakeAppservice, path: &str) -> Vec<Vec<(String, String)>> {
    fake.received()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path == path)
        .inspect(|r| assert_eq!(r.authorization, format!("Bearer {}", fake.hs_token)))
        .map(|r| {
            reqwest::Url::parse(&format!("http://x/?{}", r.query))
                .unwrap()
                .query_pairs()
                .map(|(name, value)| (name.into_owned(), value.into_owned()))
                .collect()
        })
        .collect()
}

/// `(name, value)` pairs, owned.
fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect()
}

#[tokio::test]
async fn protocols_are_merged_and_lookups_forwarded_to_their_appservices() {
    let irc = FakeAppservice::start_with(
        server_name(),
        FakeRegistration {
            id: "irc",
            prefix: "irc_",
            extra: "protocols: [irc]",
            ..FakeRegistration::default()
        },
    )
    .await;
    let other = FakeAppservice::start_with(
        server_name(),
        FakeRegistration {
            id: "other",
            prefix: "other_",
            extra: "protocols: [irc, gitter]",
            ..FakeRegistration::default()
        },
    )
    .await;
    irc.answer_path(
        "/_matrix/app/v1/thirdparty/protocol/irc",
        irc_protocol("libera"),
    );
    other.answer_path(
        "/_matrix/app/v1/thirdparty/protocol/irc",
        irc_protocol("oftc"),
    );
    // `other` answers `{}` for gitter: no instances, so no protocol.
    let server = TestServer::start_with(FakeAppservice::options_for(
        &[&irc, &other],
        ServerOptions::default(),
    ))
    .await;
    let alice = server.register("alice").await;

    let protocols = alice
        .get("/_matrix/client/v3/thirdparty/protocols")
        .await
        .ok();
    let names: Vec<&String> = protocols.as_object().unwrap().keys().collect();
    assert_eq!(names, ["irc"], "{protocols}");
    let merged = &protocols["irc"];
    assert_eq!(merged["icon"], "mxc://example.org/libera");
    let instance_ids: Vec<&Value> = merged["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| &i["instance_id"])
        .collect();
    assert_eq!(instance_ids, [&json!("irc|libera"), &json!("other|oftc")]);
    let one = alice
        .get("/_matrix/client/v3/thirdparty/protocol/irc")
        .await
        .ok();
    assert_eq!(&one, merged);
    for unknown in ["gitter", "xmpp"] {
        alice
            .get(&format!("/_matrix/client/v3/thirdparty/protocol/{unknown}"))
            .await
            .assert_error(404, "M_NOT_FOUND");
    }

    // Locations: both appservices are asked with the client's fields; entries without
    // `alias`, `protocol` or `fields` are dropped.
    let libera_room = alias("irc_libera_matrix");
    irc.answer_path(
        "/_matrix/app/v1/thirdparty/location/irc",
        json!([
            { "alias": libera_room, "protocol": "irc", "fields": { "network": "libera", "channel": "#matrix" } },
            { "alias": "#broken:example.org", "protocol": "irc" },
        ]),
    );
    other.answer_path(
        "/_matrix/app/v1/thirdparty/location/irc",
        json!([{ "alias": alias("other_oftc_matrix"), "protocol": "irc", "fields": { "network": "oftc" } }]),
    );
    let locations = alice
        .get("/_matrix/client/v3/thirdparty/location/irc?network=libera&channel=%23matrix")
        .await
        .ok();
    let aliases: Vec<&Value> = locations
        .as_array()
        .unwrap()
        .iter()
        .map(|l| &l["alias"])
        .collect();
    assert_eq!(
        aliases,
        [&json!(libera_room), &json!(alias("other_oftc_matrix"))]
    );
    for fake in [&irc, &other] {
        assert_eq!(
            queries_for(fake, "/_matrix/app/v1/thirdparty/location/irc"),
            [pairs(&[("channel", "#matrix"), ("network", "libera")])]
        );
    }

    // Users likewise.
    irc.answer_path(
        "/_matrix/app/v1/thirdparty/user/irc",
        json!([{ "userid": user_id("irc_bob"), "protocol": "irc", "fields": { "nickname": "bob" } }]),
    );
    let users = alice
        .get("/_matrix/client/v3/thirdparty/user/irc?nickname=bob")
        .await
        .ok();
    assert_eq!(users.as_array().unwrap().len(), 1, "{users}");
    assert_eq!(users[0]["userid"], user_id("irc_bob"));
    assert_eq!(
        queries_for(&irc, "/_matrix/app/v1/thirdparty/user/irc"),
        [pairs(&[("nickname", "bob")])]
    );

    // A protocol nobody registered.
    for kind in ["location", "user"] {
        alice
            .get(&format!("/_matrix/client/v3/thirdparty/{kind}/xmpp?x=1"))
            .await
            .assert_error(404, "M_NOT_FOUND");
    }

    // Reverse lookups go to the appservice whose namespace holds the name.
    irc.answer_path(
        "/_matrix/app/v1/thirdparty/location",
        json!([{ "alias": libera_room, "protocol": "irc", "fields": { "network": "libera" } }]),
    );
    let found = alice
        .get(&format!(
            "/_matrix/client/v3/thirdparty/location?alias={}",
            enc(&libera_room)
        ))
        .await
        .ok();
    assert_eq!(found[0]["fields"]["network"], "libera", "{found}");
    assert_eq!(
        queries_for(&irc, "/_matrix/app/v1/thirdparty/location"),
        [pairs(&[("alias", &libera_room)])]
    );
    assert!(queries_for(&other, "/_matrix/app/v1/thirdparty/location").is_empty());
    let found = alice
        .get(&format!(
            "/_matrix/client/v3/thirdparty/user?userid={}",
            enc(&user_id("other_carol"))
        ))
        .await
        .ok();
    assert_eq!(found, json!([]));
    assert_eq!(
        queries_for(&other, "/_matrix/app/v1/thirdparty/user"),
        [pairs(&[("userid", &user_id("other_carol"))])]
    );
    assert!(queries_for(&irc, "/_matrix/app/v1/thirdparty/user").is_empty());
}

#[tokio::test]
async fn a_failed_protocol_lookup_is_not_asked_again_at_once() {
    let irc = FakeAppservice::start_with(
        server_name(),
        FakeRegistration {
            id: "irc",
            prefix: "irc_",
            extra: "protocols: [irc]",
            ..FakeRegistration::default()
        },
    )
    .await;
    irc.answer(500);
    let server = server_with(&irc).await;
    let alice = server.register("alice").await;
    for _ in 0..2 {
        let protocols = alice
            .get("/_matrix/client/v3/thirdparty/protocols")
            .await
            .ok();
        assert_eq!(protocols, json!({}));
    }
    alice
        .get("/_matrix/client/v3/thirdparty/protocol/irc")
        .await
        .assert_error(404, "M_NOT_FOUND");
    assert_eq!(
        queries_for(&irc, "/_matrix/app/v1/thirdparty/protocol/irc").len(),
        1,
        "the failed lookup was repeated"
    );
}

#[tokio::test]
async fn without_appservices_there_are_no_protocols() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let protocols = alice
        .get("/_matrix/client/v3/thirdparty/protocols")
        .await
        .ok();
    assert_eq!(protocols, json!({}));
    alice
        .get("/_matrix/client/v3/thirdparty/protocol/irc")
        .await
        .assert_error(404, "M_NOT_FOUND");
}

#[tokio::test]
async fn an_invite_of_an_unknown_user_in_a_namespace_asks_the_appservice_first() {
    let fake = FakeAppservice::start(server_name()).await;
    let server = server_with(&fake).await;
    let alice = server.register("alice").await;
    let room = alice.create_room(json!({})).await;
    // The fake answers 200 but registers nobody: the invite still finds no such user.
    alice
        .post(
            &format!("/_matrix/client/v3/rooms/{}/invite", enc(&room)),
            json!({ "user_id": user_id("echo_new") }),
        )
        .await
        .assert_error(404, "M_NOT_FOUND");
    alice
        .post(
            "/_matrix/client/v3/createRoom",
            json!({ "invite": [user_id("echo_other")], "is_direct": true }),
        )
        .await
        .assert_error(404, "M_NOT_FOUND");
    alice
        .post(
            &format!("/_matrix/client/v3/rooms/{}/invite", enc(&room)),
            json!({ "user_id": user_id("nobody") }),
        )
        .await
        .assert_error(404, "M_NOT_FOUND");
    let queries: Vec<String> = fake
        .received()
        .into_iter()
        .filter(|r| r.method == "GET")
        .map(|r| r.path)
        .collect();
    assert_eq!(
        queries,
        [
            format!("/_matrix/app/v1/users/{}", enc(&user_id("echo_new"))),
            format!("/_matrix/app/v1/users/{}", enc(&user_id("echo_other"))),
        ]
    );
}
