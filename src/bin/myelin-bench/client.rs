//! A minimal Client-Server API client: only what the scenarios need, so the tool runs
//! unchanged against any homeserver.

use std::time::Duration;

use serde_json::{json, Value};

/// One logged-in user, or a user an application service acts as.
#[derive(Clone)]
pub struct User {
    http: reqwest::Client,
    base: String,
    token: String,
    /// For an application service's user: whom its token acts as (`?user_id=`).
    acts_as: Option<String>,
}

/// Percent-encodes a path segment.
pub fn enc(segment: &str) -> String {
    percent_encoding::utf8_percent_encode(segment, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// A failed request, with what the server said.
pub type Failure = String;

async fn call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: String,
    token: Option<&str>,
    body: Option<&Value>,
) -> Result<Value, Failure> {
    call_timed(http, method, url, token, body)
        .await
        .map(|(answer, _)| answer)
}

/// A request and how long it took until its whole body arrived (not counting the client's
/// parsing of the body, which grows with big answers).
async fn call_timed(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: String,
    token: Option<&str>,
    body: Option<&Value>,
) -> Result<(Value, Duration), Failure> {
    let started = std::time::Instant::now();
    let send = || {
        let mut request = http.request(method.clone(), &url);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        request.send()
    };
    let mut response = send().await;
    // A `GET` that never reached the server is sent again, once, and said so; nothing else is.
    // Seen with Synapse under a thousand pollers: its listen backlog full while its one
    // process was busy, the connection timed out (os error 110).
    if let Err(err) = &response {
        if method == reqwest::Method::GET && (err.is_connect() || err.is_request()) {
            eprintln!(
                "myelin-bench: {method} {url}: {}; sending it again",
                chain(err)
            );
            response = send().await;
        }
    }
    let response = response.map_err(|e| format!("{method} {url}: {}", chain(&e)))?;
    let status = response.status();
    let text = response.text().await.map_err(|e| e.to_string())?;
    let elapsed = started.elapsed();
    if !status.is_success() {
        return Err(format!("{method} {url}: {status} {text}"));
    }
    serde_json::from_str(&text)
        .map(|answer| (answer, elapsed))
        .map_err(|e| format!("{method} {url}: {e}"))
}

/// An error with the errors beneath it (reqwest's own says only "error sending request").
fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// Registers a user with `m.login.dummy` (the server must allow open registration).
pub async fn register(http: &reqwest::Client, base: &str, name: &str) -> Result<User, Failure> {
    let body = json!({
        "username": name,
        "password": "bench password 1234",
        "auth": { "type": "m.login.dummy" },
        "initial_device_display_name": "myelin-bench",
    });
    let url = format!("{base}/_matrix/client/v3/register");
    let answer = call(http, reqwest::Method::POST, url, None, Some(&body)).await?;
    Ok(User {
        http: http.clone(),
        base: base.to_owned(),
        token: answer["access_token"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        acts_as: None,
    })
}

/// Registers a user in an application service's namespace with its token (no password, no
/// login); the user then acts through that token.
pub async fn register_as_appservice(
    http: &reqwest::Client,
    base: &str,
    as_token: &str,
    name: &str,
) -> Result<User, Failure> {
    let body = json!({
        "type": "m.login.application_service",
        "username": name,
        "inhibit_login": true,
    });
    let url = format!("{base}/_matrix/client/v3/register");
    let answer = call(
        http,
        reqwest::Method::POST,
        url,
        Some(as_token),
        Some(&body),
    )
    .await?;
    let user_id = answer["user_id"]
        .as_str()
        .ok_or_else(|| format!("registration of {name} named no user: {answer}"))?;
    Ok(User {
        http: http.clone(),
        base: base.to_owned(),
        token: as_token.to_owned(),
        acts_as: Some(user_id.to_owned()),
    })
}

impl User {
    /// The user `user_id` an application service's token acts as, at `base`: for a set-up
    /// made earlier (by another run, or loaded into the server's database).
    pub fn acting_as(http: &reqwest::Client, base: &str, as_token: &str, user_id: &str) -> User {
        User {
            http: http.clone(),
            base: base.to_owned(),
            token: as_token.to_owned(),
            acts_as: Some(user_id.to_owned()),
        }
    }

    async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, Failure> {
        call(&self.http, method, self.url(path), Some(&self.token), body).await
    }

    /// The same user (same token) making its requests to another process of the server, at
    /// `base` (a scale-out's processes share sessions).
    pub fn on_process(&self, base: &str) -> User {
        User {
            base: base.to_owned(),
            ..self.clone()
        }
    }

    /// The user an application service's token acts as (`None` for a logged-in user).
    pub fn appservice_user_id(&self) -> Option<&str> {
        self.acts_as.as_deref()
    }

    fn url(&self, path: &str) -> String {
        let mut url = format!("{}{path}", self.base);
        if let Some(user_id) = &self.acts_as {
            let separator = if path.contains('?') { '&' } else { '?' };
            url.push_str(&format!("{separator}user_id={}", enc(user_id)));
        }
        url
    }

    /// `GET` of a path, with the time until the whole answer arrived.
    pub async fn get_timed(&self, path: &str) -> Result<(Value, Duration), Failure> {
        let url = self.url(path);
        call_timed(
            &self.http,
            reqwest::Method::GET,
            url,
            Some(&self.token),
            None,
        )
        .await
    }

    /// `GET` of a path under the server's base URL.
    pub async fn get(&self, path: &str) -> Result<Value, Failure> {
        self.request(reqwest::Method::GET, path, None).await
    }

    /// `POST` of a JSON body to a path under the server's base URL.
    pub async fn post(&self, path: &str, body: &Value) -> Result<Value, Failure> {
        self.request(reqwest::Method::POST, path, Some(body)).await
    }

    /// `POST /createRoom`.
    pub async fn create_room(&self, body: Value) -> Result<String, Failure> {
        let answer = self
            .request(
                reqwest::Method::POST,
                "/_matrix/client/v3/createRoom",
                Some(&body),
            )
            .await?;
        Ok(answer["room_id"].as_str().unwrap_or_default().to_owned())
    }

    /// `POST /join/{room}`.
    pub async fn join(&self, room_id: &str) -> Result<(), Failure> {
        let path = format!("/_matrix/client/v3/join/{}", enc(room_id));
        self.request(reqwest::Method::POST, &path, Some(&json!({})))
            .await
            .map(drop)
    }

    /// Sends a text message; returns its event ID.
    pub async fn send(&self, room_id: &str, txn: &str, body: &str) -> Result<String, Failure> {
        let path = format!(
            "/_matrix/client/v3/rooms/{}/send/m.room.message/{}",
            enc(room_id),
            enc(txn)
        );
        let content = json!({ "msgtype": "m.text", "body": body });
        let answer = self
            .request(reqwest::Method::PUT, &path, Some(&content))
            .await?;
        Ok(answer["event_id"].as_str().unwrap_or_default().to_owned())
    }

    /// One `/sync`.
    pub async fn sync(
        &self,
        since: Option<&str>,
        timeout: Duration,
        filter: Option<&str>,
    ) -> Result<Value, Failure> {
        self.get(&sync_path(since, timeout, filter)).await
    }

    /// One simplified sliding sync request (MSC4186, the unstable path clients use).
    pub async fn sliding_sync(
        &self,
        pos: Option<&str>,
        timeout: Duration,
        body: &Value,
    ) -> Result<Value, Failure> {
        let mut path = format!(
            "/_matrix/client/unstable/org.matrix.simplified_msc3575/sync?timeout={}",
            timeout.as_millis()
        );
        if let Some(pos) = pos {
            path.push_str(&format!("&pos={}", enc(pos)));
        }
        self.request(reqwest::Method::POST, &path, Some(body)).await
    }

    /// One `/messages` page backwards.
    pub async fn messages(
        &self,
        room_id: &str,
        from: Option<&str>,
        limit: u32,
    ) -> Result<Value, Failure> {
        let mut path = format!(
            "/_matrix/client/v3/rooms/{}/messages?dir=b&limit={limit}",
            enc(room_id)
        );
        if let Some(from) = from {
            path.push_str(&format!("&from={}", enc(from)));
        }
        self.request(reqwest::Method::GET, &path, None).await
    }
}

/// A sync response's `next_batch`, where the next sync starts.
pub fn next_batch(sync: &Value) -> String {
    sync["next_batch"].as_str().unwrap_or_default().to_owned()
}

/// The timeline events of every joined room in a sync response: `(room, event_id, body)`.
pub fn timeline_events(sync: &Value) -> Vec<(String, String, String)> {
    let mut found = Vec::new();
    if let Some(rooms) = sync["rooms"]["join"].as_object() {
        for (room_id, room) in rooms {
            for event in room["timeline"]["events"].as_array().into_iter().flatten() {
                if event["type"] == "m.room.message" {
                    found.push((
                        room_id.clone(),
                        event["event_id"].as_str().unwrap_or_default().to_owned(),
                        event["content"]["body"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                    ));
                }
            }
        }
    }
    found
}

/// The filter of a new client's first sync: one no earlier request used (`nonce` names an
/// event type that never occurs), so a server's cache of recent responses stays out of it.
pub fn first_sync_filter(timeline_limit: u32, lazy_members: bool, nonce: &str) -> String {
    json!({ "room": {
        "timeline": { "limit": timeline_limit, "not_types": [format!("bench.never.{nonce}")] },
        "state": { "lazy_load_members": lazy_members },
    } })
    .to_string()
}

/// The path of a `/sync` request.
pub fn sync_path(since: Option<&str>, timeout: Duration, filter: Option<&str>) -> String {
    let mut path = format!("/_matrix/client/v3/sync?timeout={}", timeout.as_millis());
    if let Some(since) = since {
        path.push_str(&format!("&since={}", enc(since)));
    }
    if let Some(filter) = filter {
        path.push_str(&format!("&filter={}", enc(filter)));
    }
    path
}
