//! Application-service registrations: the YAML files bridges generate (spec: Application
//! Service API, "Registration"), read once at start from `MYELIN_APPSERVICES`.
//!
//! Parsed as Synapse does, since registrations are written against it: `url` must be present
//! (a string, or `null` for "send me nothing"), `exclusive` must be a bool, `rate_limited`
//! defaults to true, and namespace regexes are case-sensitive and matched at the start of the
//! name only (Python's `re.match`; bridges anchor their own `$`). Any problem stops the start
//! with one line naming the file.

use std::{collections::HashSet, path::Path};

use regex::Regex;
use ruma::{OwnedUserId, ServerName, UserId};
use serde::Deserialize;

/// One namespace entry: a regex and whether the appservice claims its names alone.
#[derive(Debug, Clone)]
pub struct Namespace {
    /// The regex as written.
    pub source: String,
    /// It, anchored at the start.
    regex: Regex,
    /// Whether nobody else may take names it matches.
    pub exclusive: bool,
}

impl Namespace {
    /// Whether `name` matches (from its start, like Python's `re.match`).
    pub fn matches(&self, name: &str) -> bool {
        self.regex.is_match(name)
    }
}

/// The three kinds of namespace.
#[derive(Debug, Clone, Default)]
pub struct Namespaces {
    /// User IDs.
    pub users: Vec<Namespace>,
    /// Room aliases.
    pub aliases: Vec<Namespace>,
    /// Room IDs.
    pub rooms: Vec<Namespace>,
}

/// Whether any namespace of a list matches `name` (only exclusive ones when `exclusive`).
fn any_match(namespaces: &[Namespace], name: &str, exclusive: bool) -> bool {
    namespaces
        .iter()
        .any(|ns| (!exclusive || ns.exclusive) && ns.matches(name))
}

/// A validated registration.
#[derive(Debug, Clone)]
pub struct Registration {
    /// Its unique ID (the `{appserviceId}` of the ping endpoint).
    pub id: String,
    /// Where transactions go; `None` for an appservice that only acts (double puppeting).
    pub url: Option<String>,
    /// The token the appservice authenticates with.
    pub as_token: String,
    /// The token we authenticate with towards the appservice.
    pub hs_token: String,
    /// The appservice's own user (`sender_localpart` on this server).
    pub sender: OwnedUserId,
    /// Its namespaces.
    pub namespaces: Namespaces,
    /// Whether the users it masquerades as are rate limited (the sender never is).
    pub rate_limited: bool,
    /// Whether transactions carry ephemeral events under `ephemeral` (`receive_ephemeral`).
    pub receive_ephemeral: bool,
    /// Whether they carry them under `de.sorunome.msc2409.ephemeral` (the MSC2409 name).
    pub receive_ephemeral_unstable: bool,
    /// MSC4190 device management: `/register` must inhibit login.
    pub msc4190: bool,
    /// MSC3202 (`org.matrix.msc3202`): transactions carry device-list changes and the key
    /// counts of its users' devices, for end-to-bridge encryption without `/sync`.
    pub msc3202: bool,
    /// Third-party protocols it serves.
    pub protocols: Vec<String>,
}

impl PartialEq for Registration {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for Registration {}

impl Registration {
    /// Whether `user_id` is the appservice's sender or in its users namespace: a user it may
    /// act as, and whose events it is sent.
    pub fn is_interested_in_user(&self, user_id: &str) -> bool {
        self.sender.as_str() == user_id || any_match(&self.namespaces.users, user_id, false)
    }

    /// Whether `user_id` is in one of its exclusive user namespaces.
    pub fn claims_user(&self, user_id: &str) -> bool {
        any_match(&self.namespaces.users, user_id, true)
    }

    /// Whether `alias` is in one of its alias namespaces (exclusive ones only when
    /// `exclusive`).
    pub fn matches_alias(&self, alias: &str, exclusive: bool) -> bool {
        any_match(&self.namespaces.aliases, alias, exclusive)
    }

    /// Whether `room_id` is in one of its room namespaces.
    pub fn matches_room(&self, room_id: &str) -> bool {
        any_match(&self.namespaces.rooms, room_id, false)
    }

    /// Whether transactions carry ephemeral events at all (and to-device messages, which
    /// either flag asks for, as in Synapse).
    pub fn wants_ephemeral(&self) -> bool {
        self.receive_ephemeral || self.receive_ephemeral_unstable
    }
}

/// The file's shape; keys the spec does not define (Synapse's `ip_range_whitelist`, ...) are
/// ignored.
#[derive(Deserialize)]
struct FileRegistration {
    id: String,
    url: Option<String>,
    as_token: String,
    hs_token: String,
    sender_localpart: String,
    #[serde(default)]
    namespaces: FileNamespaces,
    rate_limited: Option<bool>,
    #[serde(default)]
    receive_ephemeral: bool,
    #[serde(default, rename = "de.sorunome.msc2409.push_ephemeral")]
    push_ephemeral: bool,
    #[serde(default, rename = "io.element.msc4190")]
    msc4190: bool,
    #[serde(default, rename = "org.matrix.msc3202")]
    msc3202: bool,
    #[serde(default)]
    protocols: Option<Vec<String>>,
}

#[derive(Deserialize, Default)]
struct FileNamespaces {
    #[serde(default)]
    users: Option<Vec<FileNamespace>>,
    #[serde(default)]
    aliases: Option<Vec<FileNamespace>>,
    #[serde(default)]
    rooms: Option<Vec<FileNamespace>>,
}

#[derive(Deserialize)]
struct FileNamespace {
    regex: String,
    exclusive: bool,
}

fn namespaces(list: Option<Vec<FileNamespace>>) -> Result<Vec<Namespace>, String> {
    list.unwrap_or_default()
        .into_iter()
        .map(|ns| {
            let regex = Regex::new(&format!("^(?:{})", ns.regex))
                .map_err(|e| format!("namespace regex '{}': {e}", ns.regex))?;
            Ok(Namespace {
                source: ns.regex,
                regex,
                exclusive: ns.exclusive,
            })
        })
        .collect()
}

/// Parses one registration file's text.
pub fn parse(text: &str, server_name: &ServerName) -> Result<Registration, String> {
    let value: serde_norway::Value = serde_norway::from_str(text).map_err(|e| e.to_string())?;
    // `url: null` is allowed, a missing `url` is not (as Synapse): it is a likely typo.
    if value.get("url").is_none() {
        return Err(
            "missing field `url` (write `url: null` for an appservice that is sent nothing)".into(),
        );
    }
    let file: FileRegistration = serde_norway::from_value(value).map_err(|e| e.to_string())?;
    if file.id.is_empty() || file.as_token.is_empty() || file.hs_token.is_empty() {
        return Err("id, as_token and hs_token must not be empty".into());
    }
    if let Some(url) = &file.url {
        let parsed = reqwest::Url::parse(url).map_err(|e| format!("url '{url}': {e}"))?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
            return Err(format!("url '{url}' is not an http(s) URL"));
        }
    }
    let sender = UserId::parse_with_server_name(file.sender_localpart.as_str(), server_name)
        .map_err(|e| format!("sender_localpart '{}': {e}", file.sender_localpart))?;
    Ok(Registration {
        id: file.id,
        url: file.url.map(|u| u.trim_end_matches('/').to_owned()),
        as_token: file.as_token,
        hs_token: file.hs_token,
        sender,
        namespaces: Namespaces {
            users: namespaces(file.namespaces.users)?,
            aliases: namespaces(file.namespaces.aliases)?,
            rooms: namespaces(file.namespaces.rooms)?,
        },
        rate_limited: file.rate_limited.unwrap_or(true),
        receive_ephemeral: file.receive_ephemeral,
        receive_ephemeral_unstable: file.push_ephemeral,
        msc4190: file.msc4190,
        msc3202: file.msc3202,
        protocols: file.protocols.unwrap_or_default(),
    })
}

/// Reads and checks every file: each must parse, and ids, tokens and exclusive regexes must
/// not repeat across them. The error is one line that names the file.
pub fn load(paths: &[&Path], server_name: &ServerName) -> Result<Vec<Registration>, String> {
    let mut registrations: Vec<Registration> = Vec::new();
    let mut tokens = HashSet::new();
    let mut exclusive = HashSet::new();
    for path in paths {
        let name = path.display();
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("{name}: cannot read it: {e}"))?;
        let registration = parse(&text, server_name).map_err(|e| format!("{name}: {e}"))?;
        if registrations.iter().any(|r| r.id == registration.id) {
            return Err(format!("{name}: id '{}' is used twice", registration.id));
        }
        for token in [&registration.as_token, &registration.hs_token] {
            if !tokens.insert(token.clone()) {
                return Err(format!("{name}: a token is used twice"));
            }
        }
        let namespaces = &registration.namespaces;
        for (kind, list) in [
            ("users", &namespaces.users),
            ("aliases", &namespaces.aliases),
            ("rooms", &namespaces.rooms),
        ] {
            for ns in list.iter().filter(|ns| ns.exclusive) {
                if !exclusive.insert((kind, ns.source.clone())) {
                    return Err(format!(
                        "{name}: the exclusive {kind} namespace '{}' is claimed twice",
                        ns.source
                    ));
                }
            }
        }
        registrations.push(registration);
    }
    Ok(registrations)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAUTRIX: &str = r#"
id: whatsapp
url: http://localhost:29318
as_token: at
hs_token: ht
sender_localpart: abcdef
rate_limited: false
receive_ephemeral: true
de.sorunome.msc2409.push_ephemeral: true
namespaces:
  users:
    - regex: ^@whatsappbot:example\.com$
      exclusive: true
    - regex: ^@whatsapp_.*:example\.com$
      exclusive: true
"#;

    fn server() -> &'static ServerName {
        <&ServerName>::try_from("example.com").unwrap()
    }

    #[test]
    fn a_mautrix_registration_parses() {
        let r = parse(MAUTRIX, server()).unwrap();
        assert_eq!(r.sender.as_str(), "@abcdef:example.com");
        assert!(!r.rate_limited && r.receive_ephemeral && r.receive_ephemeral_unstable);
        assert!(r.claims_user("@whatsapp_123:example.com"));
        assert!(!r.claims_user("@alice:example.com"));
        assert!(r.is_interested_in_user("@abcdef:example.com"));
    }

    #[test]
    fn the_msc3202_flag_is_read() {
        assert!(!parse(MAUTRIX, server()).unwrap().msc3202);
        let text = format!("{MAUTRIX}org.matrix.msc3202: true\n");
        assert!(parse(&text, server()).unwrap().msc3202);
    }

    #[test]
    fn regexes_match_from_the_start_only() {
        let text = MAUTRIX.replace(r"^@whatsapp_.*:example\.com$", "'@wa_'");
        let r = parse(&text, server()).unwrap();
        assert!(r.claims_user("@wa_1:example.com"));
        assert!(!r.claims_user("@x@wa_1:example.com"));
    }

    #[test]
    fn url_may_be_null_but_not_missing() {
        let null = MAUTRIX.replace("url: http://localhost:29318", "url: null");
        assert_eq!(parse(&null, server()).unwrap().url, None);
        let missing = MAUTRIX.replace("url: http://localhost:29318\n", "");
        assert!(parse(&missing, server()).unwrap_err().contains("url"));
        let text = MAUTRIX.replace("exclusive: true", "exclusive: maybe");
        assert!(parse(&text, server()).is_err());
        assert!(parse("id: [", server()).is_err());
    }
}
