//! A small typed HTTP client for the Client-Server API.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

/// An HTTP client, optionally logged in.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    /// Base URL of the server.
    pub base: String,
    /// Access token, once logged in.
    pub token: Option<String>,
    /// User ID, once logged in.
    pub user_id: String,
    /// Device ID, once logged in.
    pub device_id: String,
    /// Headers sent with every request (e.g. a forged `X-Forwarded-For`).
    headers: Vec<(&'static str, String)>,
}

/// A response: status and JSON body (`Value::Null` when the body is not JSON).
#[derive(Debug)]
pub struct Response {
    /// HTTP status.
    pub status: StatusCode,
    /// Parsed JSON body.
    pub body: Value,
    /// Response headers.
    pub headers: reqwest::header::HeaderMap,
}

impl Response {
    /// Asserts a 200 and returns the body.
    #[track_caller]
    pub fn ok(self) -> Value {
        assert_eq!(
            self.status,
            StatusCode::OK,
            "expected 200, got {}: {}",
            self.status,
            self.body
        );
        self.body
    }

    /// Asserts a Matrix error with this status and errcode.
    #[track_caller]
    pub fn assert_error(&self, status: u16, errcode: &str) {
        assert_eq!(
            self.status.as_u16(),
            status,
            "unexpected status; body: {}",
            self.body
        );
        assert_eq!(
            self.body["errcode"], errcode,
            "unexpected errcode; body: {}",
            self.body
        );
        assert!(
            self.body["error"].is_string(),
            "error text missing: {}",
            self.body
        );
    }
}

impl Client {
    /// A client for `base` without a token.
    pub fn new(base: &str) -> Self {
        // Idle connections are dropped before the server's keep-alive (5 s) closes them: a
        // request sent on a connection the server is closing fails with `IncompleteMessage`.
        let http = reqwest::Client::builder()
            .pool_idle_timeout(std::time::Duration::from_secs(2))
            .build()
            .expect("an HTTP client");
        Client {
            http,
            base: base.to_owned(),
            token: None,
            user_id: String::new(),
            device_id: String::new(),
            headers: Vec::new(),
        }
    }

    /// This client, sending `name: value` with every request from now on.
    pub fn with_header(&self, name: &'static str, value: &str) -> Client {
        let mut client = self.clone();
        client.headers.push((name, value.to_owned()));
        client
    }

    /// Sends a request with an optional JSON body.
    pub async fn request(&self, method: Method, path: &str, body: Option<Value>) -> Response {
        let mut request = self.http.request(method, format!("{}{}", self.base, path));
        for (name, value) in &self.headers {
            request = request.header(*name, value);
        }
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("request failed");
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.bytes().await.unwrap_or_default();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Response {
            status,
            body,
            headers,
        }
    }

    /// Sends raw bytes (for malformed-input tests).
    pub async fn raw(&self, method: Method, path: &str, body: Vec<u8>) -> Response {
        let mut request = self
            .http
            .request(method, format!("{}{}", self.base, path))
            .body(body);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.expect("request failed");
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.bytes().await.unwrap_or_default();
        Response {
            status,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            headers,
        }
    }

    /// `GET`.
    pub async fn get(&self, path: &str) -> Response {
        self.request(Method::GET, path, None).await
    }

    /// `POST` with JSON.
    pub async fn post(&self, path: &str, body: Value) -> Response {
        self.request(Method::POST, path, Some(body)).await
    }

    /// `PUT` with JSON.
    pub async fn put(&self, path: &str, body: Value) -> Response {
        self.request(Method::PUT, path, Some(body)).await
    }

    /// `DELETE` with JSON.
    pub async fn delete(&self, path: &str, body: Value) -> Response {
        self.request(Method::DELETE, path, Some(body)).await
    }

    /// This client logged in as the session in a login/register response.
    pub fn with_session(&self, body: &Value) -> Client {
        let mut client = self.clone();
        client.token = body["access_token"].as_str().map(str::to_owned);
        client.user_id = body["user_id"].as_str().unwrap_or_default().to_owned();
        client.device_id = body["device_id"].as_str().unwrap_or_default().to_owned();
        client
    }

    /// Registers with `m.login.dummy` and returns the logged-in client.
    pub async fn register(&self, localpart: &str, password: &str) -> Client {
        let body = self
            .post(
                "/_matrix/client/v3/register",
                json!({ "username": localpart, "password": password, "auth": { "type": "m.login.dummy" } }),
            )
            .await
            .ok();
        self.with_session(&body)
    }

    /// Logs in with a password and returns the logged-in client.
    pub async fn login(&self, user: &str, password: &str) -> Client {
        let body = self.login_response(user, password).await.ok();
        self.with_session(&body)
    }

    /// The raw response of a password login.
    pub async fn login_response(&self, user: &str, password: &str) -> Response {
        self.post(
            "/_matrix/client/v3/login",
            json!({
                "type": "m.login.password",
                "identifier": { "type": "m.id.user", "user": user },
                "password": password,
            }),
        )
        .await
    }

    /// UIA password auth object for this user.
    pub fn password_auth(&self, password: &str, session: Option<&str>) -> Value {
        let mut auth = json!({
            "type": "m.login.password",
            "identifier": { "type": "m.id.user", "user": self.user_id },
            "password": password,
        });
        if let Some(session) = session {
            auth["session"] = json!(session);
        }
        auth
    }
}

/// Percent-encodes a path segment (room IDs, aliases and event IDs carry `!`, `#`, `$`, `:`).
pub fn enc(segment: &str) -> String {
    percent_encoding::utf8_percent_encode(segment, percent_encoding::NON_ALPHANUMERIC).to_string()
}

impl Client {
    /// Creates a room and returns its ID.
    pub async fn create_room(&self, body: Value) -> String {
        let created = self.post("/_matrix/client/v3/createRoom", body).await.ok();
        created["room_id"].as_str().expect("room_id").to_owned()
    }

    /// Sends an `m.text` message and returns the raw response.
    pub async fn send_text(&self, room_id: &str, txn_id: &str, text: &str) -> Response {
        let path = format!(
            "/_matrix/client/v3/rooms/{}/send/m.room.message/{}",
            enc(room_id),
            enc(txn_id)
        );
        self.put(&path, json!({ "msgtype": "m.text", "body": text }))
            .await
    }

    /// Joins a room by ID or alias.
    pub async fn join(&self, room: &str) -> Response {
        self.post(&format!("/_matrix/client/v3/join/{}", enc(room)), json!({}))
            .await
    }

    /// `POST /rooms/{roomId}/{action}` (invite, kick, ban, unban, leave, forget).
    pub async fn room_action(&self, room_id: &str, action: &str, body: Value) -> Response {
        self.post(
            &format!("/_matrix/client/v3/rooms/{}/{action}", enc(room_id)),
            body,
        )
        .await
    }

    /// Sets a state event.
    pub async fn put_state(
        &self,
        room_id: &str,
        kind: &str,
        state_key: &str,
        content: Value,
    ) -> Response {
        let path = format!(
            "/_matrix/client/v3/rooms/{}/state/{kind}/{}",
            enc(room_id),
            enc(state_key)
        );
        self.put(&path, content).await
    }

    /// Fetches one event.
    pub async fn get_event(&self, room_id: &str, event_id: &str) -> Response {
        self.get(&format!(
            "/_matrix/client/v3/rooms/{}/event/{}",
            enc(room_id),
            enc(event_id)
        ))
        .await
    }
}

impl Client {
    /// One `/sync` call; `since` and `timeout_ms` are optional.
    pub async fn sync(&self, since: Option<&str>, timeout_ms: u64, filter: Option<&str>) -> Value {
        let mut path = format!("/_matrix/client/v3/sync?timeout={timeout_ms}");
        if let Some(since) = since {
            path.push_str(&format!("&since={}", enc(since)));
        }
        if let Some(filter) = filter {
            path.push_str(&format!("&filter={}", enc(filter)));
        }
        self.get(&path).await.ok()
    }

    /// The `next_batch` of an initial `/sync` with no filter: a token from which later
    /// syncs see only what comes after now.
    pub async fn next_batch(&self) -> String {
        self.sync(None, 0, None).await["next_batch"]
            .as_str()
            .expect("next_batch")
            .to_owned()
    }
}

/// The timeline events of one joined room in a sync response.
pub fn timeline<'a>(sync: &'a Value, room_id: &str) -> Vec<&'a Value> {
    sync["rooms"]["join"][room_id]["timeline"]["events"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

impl Client {
    /// Creates `count` rooms, the i-th named "Room i" with `i % 4` messages ("room i message
    /// n", transaction IDs "ti-n"), and returns their IDs in creation order.
    pub async fn rooms_with_messages(&self, count: usize) -> Vec<String> {
        let mut rooms = Vec::with_capacity(count);
        for i in 0..count {
            let room = self
                .create_room(json!({ "name": format!("Room {i}") }))
                .await;
            for n in 0..i % 4 {
                self.send_text(
                    &room,
                    &format!("t{i}-{n}"),
                    &format!("room {i} message {n}"),
                )
                .await
                .ok();
            }
            rooms.push(room);
        }
        rooms
    }

    /// Pages `/messages` backwards from `from` (down to `to`, if given) with pages of `limit`
    /// until the end, returning the events oldest first.
    pub async fn page_back(
        &self,
        room_id: &str,
        from: Option<&str>,
        to: Option<&str>,
        limit: u32,
    ) -> Vec<Value> {
        let mut events = Vec::new();
        let mut from = from.map(str::to_owned);
        loop {
            let mut path = format!(
                "/_matrix/client/v3/rooms/{}/messages?dir=b&limit={limit}",
                enc(room_id)
            );
            if let Some(from) = &from {
                path.push_str(&format!("&from={}", enc(from)));
            }
            if let Some(to) = to {
                path.push_str(&format!("&to={}", enc(to)));
            }
            let page = self.get(&path).await.ok();
            let chunk = page["chunk"].as_array().cloned().unwrap_or_default();
            let done = chunk.is_empty();
            events.extend(chunk);
            match page["end"].as_str() {
                Some(end) if !done => from = Some(end.to_owned()),
                _ => break,
            }
        }
        events.reverse();
        events
    }
}
