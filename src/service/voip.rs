//! TURN credentials for VoIP (`/voip/turnServer`): a shared secret gives time-limited
//! credentials in the form coturn's REST API checks (`use-auth-secret`): the username is
//! `expiry:user_id`, the password base64(HMAC-SHA1(secret, username)).

use base64::{engine::general_purpose::STANDARD, Engine};
use ruma::UserId;
use serde_json::{json, Value};

use crate::config::TurnConfig;

/// The `/voip/turnServer` answer for a user at `now_secs`: `{}` when no TURN server is set
/// up (or it has no credentials), as Synapse answers.
pub fn turn_server(config: &TurnConfig, user_id: &UserId, now_secs: u64) -> Value {
    if config.uris.is_empty() {
        return json!({});
    }
    let (username, password) = match (&config.shared_secret, &config.username, &config.password) {
        (Some(secret), _, _) => {
            let username = format!("{}:{}", now_secs + config.ttl_secs, user_id);
            let key =
                ring::hmac::Key::new(ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, secret.as_bytes());
            let tag = ring::hmac::sign(&key, username.as_bytes());
            (username, STANDARD.encode(tag.as_ref()))
        }
        (None, Some(username), Some(password)) => (username.clone(), password.clone()),
        _ => return json!({}),
    };
    json!({
        "username": username,
        "password": password,
        "uris": config.uris,
        "ttl": config.ttl_secs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_secret_credentials_are_coturns() {
        let config = TurnConfig {
            uris: vec!["turn:turn.example.org:3478?transport=udp".into()],
            shared_secret: Some("north".into()),
            ttl_secs: 600,
            ..Default::default()
        };
        let user = UserId::parse("@alice:example.org").unwrap();
        let answer = turn_server(&config, &user, 1_000);
        assert_eq!(answer["username"], "1600:@alice:example.org");
        // HMAC-SHA1("north", "1600:@alice:example.org"), by `openssl dgst -sha1 -hmac north -binary | base64`.
        assert_eq!(answer["password"], "XTFBvCaiOrUv4LIy4ECkqzuAtac=");
        assert_eq!(answer["ttl"], 600);
    }
}
