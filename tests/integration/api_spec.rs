//! `api-spec/openapi.yaml` describes exactly the routes the server serves.

use std::collections::BTreeSet;

use crate::support::TestServer;

fn documented() -> BTreeSet<(String, String)> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/api-spec/openapi.yaml"
    ))
    .unwrap();
    let spec: serde_norway::Value = serde_norway::from_str(&text).unwrap();
    let mut routes = BTreeSet::new();
    for (path, item) in spec["paths"].as_mapping().expect("paths") {
        for (method, _) in item.as_mapping().unwrap() {
            let method = method.as_str().unwrap();
            if ["get", "put", "post", "delete", "patch"].contains(&method) {
                routes.insert((method.to_uppercase(), path.as_str().unwrap().to_owned()));
            }
        }
    }
    routes
}

/// Legacy `r0` paths are aliases of `v3` and documented once, under `v3`.
fn served() -> BTreeSet<(String, String)> {
    myelin::api::served_routes()
        .into_iter()
        .map(|(method, path)| {
            (
                method,
                path.replace("/_matrix/client/r0/", "/_matrix/client/v3/")
                    .replace("/_matrix/media/r0/", "/_matrix/media/v3/"),
            )
        })
        // `/state/{type}` and `/state/{type}/` are the empty-state-key forms of `/state/{type}/{key}`.
        .map(|(method, path)| {
            match path
                .strip_suffix('/')
                .unwrap_or(&path)
                .strip_suffix("/{event_type}")
            {
                Some(prefix) if prefix.ends_with("/state") => {
                    (method, format!("{prefix}/{{event_type}}/{{state_key}}"))
                }
                _ => (method, path),
            }
        })
        .map(|(method, path)| (method, rename_params(&path)))
        .collect()
}

/// ruma names path parameters in snake_case; the spec uses camelCase.
fn rename_params(path: &str) -> String {
    path.split('/')
        .map(
            |segment| match segment.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                Some(name) => {
                    let mut out = String::from("{");
                    let mut upper = false;
                    for c in name.chars() {
                        if c == '_' {
                            upper = true;
                        } else if upper {
                            out.extend(c.to_uppercase());
                            upper = false;
                        } else {
                            out.push(c);
                        }
                    }
                    out + "}"
                }
                None => segment.to_owned(),
            },
        )
        .collect::<Vec<_>>()
        .join("/")
}

#[test]
fn every_served_route_is_documented_and_every_documented_route_is_served() {
    let documented = documented();
    let served = served();
    let undocumented: Vec<_> = served.difference(&documented).collect();
    let unserved: Vec<_> = documented.difference(&served).collect();
    assert!(
        undocumented.is_empty(),
        "served but not in api-spec/openapi.yaml: {undocumented:#?}"
    );
    assert!(
        unserved.is_empty(),
        "in api-spec/openapi.yaml but not served: {unserved:#?}"
    );
}

#[tokio::test]
async fn every_documented_route_answers_with_something_other_than_unrecognized() {
    let server = TestServer::start().await;
    let client = server.register("spec").await;
    for (method, path) in myelin::api::served_routes() {
        let concrete = path
            .split('/')
            .map(|s| if s.starts_with('{') { "x" } else { s })
            .collect::<Vec<_>>()
            .join("/");
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let response = client
            .request(method.clone(), &concrete, Some(serde_json::json!({})))
            .await;
        assert_ne!(
            response.body["errcode"], "M_UNRECOGNIZED",
            "{method} {path} is not routed: {}",
            response.body
        );
        assert_ne!(
            response.status.as_u16(),
            500,
            "{method} {path} failed: {}",
            response.body
        );
    }
}
