//! Plain client-server API calls for the parts of the scenario that are not the SDK under test:
//! registering users, and the other users and devices whose actions the SDK must see.

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

#[derive(Clone)]
pub struct Http {
    base: String,
    client: reqwest::Client,
}

/// A user (or one of its devices) driven over plain HTTP.
#[derive(Clone)]
pub struct Session {
    pub user_id: String,
    pub token: String,
}

impl Http {
    pub fn new(base: &str) -> Self {
        Http {
            base: base.trim_end_matches('/').to_owned(),
            client: reqwest::Client::new(),
        }
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> Result<Value> {
        let url = format!("{}{}", self.base, path);
        let mut request = self.client.request(method.clone(), &url);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("{method} {path}"))?;
        let status = response.status();
        let value: Value = response
            .json()
            .await
            .with_context(|| format!("{method} {path}: body"))?;
        if !status.is_success() {
            bail!("{method} {path}: {status} {value}");
        }
        Ok(value)
    }

    /// Registers `localpart` with the m.login.dummy flow (MYELIN_REGISTRATION=open).
    pub async fn register(&self, localpart: &str, password: &str) -> Result<Session> {
        let body = json!({
            "username": localpart,
            "password": password,
            "auth": {"type": "m.login.dummy"},
            "initial_device_display_name": format!("{localpart} setup"),
        });
        let value = self
            .call(
                reqwest::Method::POST,
                "/_matrix/client/v3/register",
                None,
                Some(body),
            )
            .await?;
        session(&value)
    }

    pub async fn create_room(&self, who: &Session, body: Value) -> Result<String> {
        let value = self
            .call(
                reqwest::Method::POST,
                "/_matrix/client/v3/createRoom",
                Some(&who.token),
                Some(body),
            )
            .await?;
        str_field(&value, "room_id")
    }

    pub async fn join(&self, who: &Session, room_id: &str) -> Result<()> {
        let path = format!("/_matrix/client/v3/rooms/{}/join", enc(room_id));
        self.call(
            reqwest::Method::POST,
            &path,
            Some(&who.token),
            Some(json!({})),
        )
        .await?;
        Ok(())
    }

    /// Sends a text message and returns its event ID.
    pub async fn send_text(&self, who: &Session, room_id: &str, body: &str) -> Result<String> {
        let txn = format!(
            "t{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_nanos()
        );
        let path = format!(
            "/_matrix/client/v3/rooms/{}/send/m.room.message/{txn}",
            enc(room_id)
        );
        let content = json!({"msgtype": "m.text", "body": body});
        let value = self
            .call(reqwest::Method::PUT, &path, Some(&who.token), Some(content))
            .await?;
        str_field(&value, "event_id")
    }

    /// Sends a message that mentions `user_id` (intentional mentions: a highlight for them).
    pub async fn send_mention(
        &self,
        who: &Session,
        room_id: &str,
        body: &str,
        user_id: &str,
    ) -> Result<String> {
        let txn = format!(
            "m{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_nanos()
        );
        let path = format!(
            "/_matrix/client/v3/rooms/{}/send/m.room.message/{txn}",
            enc(room_id)
        );
        let content =
            json!({"msgtype": "m.text", "body": body, "m.mentions": {"user_ids": [user_id]}});
        let value = self
            .call(reqwest::Method::PUT, &path, Some(&who.token), Some(content))
            .await?;
        str_field(&value, "event_id")
    }

    pub async fn read_receipt(&self, who: &Session, room_id: &str, event_id: &str) -> Result<()> {
        let path = format!(
            "/_matrix/client/v3/rooms/{}/receipt/m.read/{}",
            enc(room_id),
            enc(event_id)
        );
        self.call(
            reqwest::Method::POST,
            &path,
            Some(&who.token),
            Some(json!({})),
        )
        .await?;
        Ok(())
    }

    /// The event as the server stores it (for an encrypted room: still encrypted).
    pub async fn event(&self, who: &Session, room_id: &str, event_id: &str) -> Result<Value> {
        let path = format!(
            "/_matrix/client/v3/rooms/{}/event/{}",
            enc(room_id),
            enc(event_id)
        );
        self.call(reqwest::Method::GET, &path, Some(&who.token), None)
            .await
    }
}

fn session(value: &Value) -> Result<Session> {
    Ok(Session {
        user_id: str_field(value, "user_id")?,
        token: str_field(value, "access_token")?,
    })
}

fn str_field(value: &Value, field: &str) -> Result<String> {
    value[field]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| anyhow!("no {field} in {value}"))
}

/// Percent-encodes a path segment (room and event IDs carry `!`, `$`, `:`).
fn enc(segment: &str) -> String {
    let mut out = String::new();
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}
