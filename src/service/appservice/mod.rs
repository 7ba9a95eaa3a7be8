//! Application services (bridges and bots): who they are, what they may do as whom, and
//! what they are sent.
//!
//! - [`registration`]: the YAML registration files, validated at start.
//! - This module: the registry, identity assertion (`?user_id=`, `?device_id=`), the
//!   exclusive-namespace checks other services call, and the ping.
//! - [`sender`]: transactions to each appservice, exactly once and in order.
//! - [`interest`]: which events an appservice is sent; [`ephemeral`]: typing, receipts and
//!   presence; [`to_device`]: to-device messages (MSC2409/MSC4203); [`e2ee`]: device lists
//!   and key counts (MSC3202).
//! - [`thirdparty`]: the `/thirdparty` lookups, answered by the appservices' protocols.

pub mod e2ee;
pub mod ephemeral;
pub mod interest;
pub mod registration;
pub mod sender;
pub mod thirdparty;
pub mod to_device;

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use actix_web::http::StatusCode;
use ruma::{OwnedDeviceId, OwnedUserId, RoomAliasId, UserId};
use serde_json::json;

pub use registration::Registration;

use super::{
    outbound::{Outbound, OutboundError},
    sessions::{hash_token, Caller},
};
use crate::{
    error::{Error, Result},
    storage::{devices, users, Db},
};

/// How long a ping waits for the appservice (Synapse's is about as long).
const PING_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a user or alias query waits (a client waits for it).
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);
/// Most of an appservice's answer that is read.
pub(crate) const MAX_ANSWER: usize = 1024 * 1024;

/// The configured application services.
pub struct Appservices {
    db: Db,
    outbound: Arc<Outbound>,
    all: Vec<Arc<Registration>>,
    by_token: HashMap<[u8; 32], Arc<Registration>>,
    protocols_seen: thirdparty::ProtocolCache,
}

/// `400 M_EXCLUSIVE`.
fn exclusive(message: &str) -> Error {
    Error::matrix(StatusCode::BAD_REQUEST, "M_EXCLUSIVE", message)
}

impl Appservices {
    /// Builds the registry from the validated registrations.
    pub fn new(db: Db, outbound: Arc<Outbound>, registrations: &[Registration]) -> Self {
        let all: Vec<Arc<Registration>> = registrations.iter().cloned().map(Arc::new).collect();
        let by_token = all
            .iter()
            .map(|r| (hash_token(&r.as_token), r.clone()))
            .collect();
        Appservices {
            db,
            outbound,
            all,
            by_token,
            protocols_seen: Default::default(),
        }
    }

    /// Every registration.
    pub fn all(&self) -> &[Arc<Registration>] {
        &self.all
    }

    /// The appservice whose `as_token` this is.
    pub fn by_token(&self, token: &str) -> Option<Arc<Registration>> {
        if self.all.is_empty() {
            return None;
        }
        self.by_token.get(&hash_token(token)).cloned()
    }

    /// Refuses, with `M_EXCLUSIVE`, a name an appservice other than `caller` claims
    /// exclusively (an ordinary registration, or another appservice's).
    pub fn check_user_unclaimed(
        &self,
        user_id: &UserId,
        caller: Option<&Registration>,
    ) -> Result<()> {
        let claimed = self
            .all
            .iter()
            .any(|r| Some(&**r) != caller && r.claims_user(user_id.as_str()));
        if claimed {
            return Err(exclusive(
                "This user ID is reserved by an application service",
            ));
        }
        Ok(())
    }

    /// Refuses, with `M_EXCLUSIVE`, an alias another appservice claims exclusively.
    pub fn check_alias_unclaimed(&self, alias: &str, caller: Option<&Registration>) -> Result<()> {
        let claimed = self
            .all
            .iter()
            .any(|r| Some(&**r) != caller && r.matches_alias(alias, true));
        if claimed {
            return Err(exclusive(
                "This alias is reserved by an application service",
            ));
        }
        Ok(())
    }

    /// Whether an appservice may log in as `user_id` (`m.login.application_service`): a
    /// registered user (else 403 `M_FORBIDDEN`) in its namespace (else `M_EXCLUSIVE`).
    pub async fn check_login(&self, registration: &Registration, user_id: &UserId) -> Result<()> {
        if !registration.is_interested_in_user(user_id.as_str()) {
            return Err(exclusive(
                "This user is not in the application service's namespace",
            ));
        }
        let conn = self.db.conn().await?;
        match users::get_user(&conn, user_id.as_str()).await? {
            Some(user) if !user.deactivated => Ok(()),
            Some(_) => Err(Error::user_deactivated()),
            None => Err(Error::forbidden(
                "Application service has not registered this user",
            )),
        }
    }

    /// The caller an appservice's request acts as: its sender, or `user_id` (`?user_id=`)
    /// when that user is in its namespaces and registered (on `/register` the user need not
    /// exist yet: `unregistered_ok`), on `device_id` (`?device_id=`) when given, which must be
    /// one of that user's devices.
    pub async fn caller(
        &self,
        registration: Arc<Registration>,
        user_id: Option<&str>,
        device_id: Option<&str>,
        unregistered_ok: bool,
    ) -> Result<Caller> {
        let user_id = match user_id {
            None => registration.sender.clone(),
            Some(user) => OwnedUserId::try_from(user)
                .map_err(|_| Error::invalid_param(format!("{user} is not a valid user ID")))?,
        };
        if !registration.is_interested_in_user(user_id.as_str()) {
            return Err(Error::forbidden(
                "Application service cannot masquerade as this user",
            ));
        }
        let conn = self.db.conn().await?;
        let user = users::get_user(&conn, user_id.as_str()).await?;
        // The sender acts before it exists: bridges ask /whoami and ping first.
        let known = user.is_some() || user_id == registration.sender;
        if !known && !unregistered_ok {
            return Err(Error::forbidden(
                "Application service has not registered this user",
            ));
        }
        let shadow_banned = match &user {
            Some(_) => users::is_shadow_banned(&conn, user_id.as_str()).await?,
            None => false,
        };
        let device = match device_id {
            Some(device) => {
                if devices::get_device(&conn, user_id.as_str(), device)
                    .await?
                    .is_none()
                {
                    return Err(Error::matrix(
                        StatusCode::BAD_REQUEST,
                        "M_UNKNOWN_DEVICE",
                        "No such device for the asserted user",
                    ));
                }
                Some(OwnedDeviceId::from(device))
            }
            None => None,
        };
        Ok(Caller {
            device_id: device
                .clone()
                .unwrap_or_else(|| pseudo_device(&registration)),
            has_device: device.is_some(),
            is_admin: user.is_some_and(|u| u.is_admin),
            shadow_banned,
            user_id,
            appservice: Some(registration),
        })
    }

    /// Asks the appservices whose alias namespace holds `alias` about it (`GET
    /// /_matrix/app/v1/rooms/{alias}`), when a client looks up one that does not exist: true
    /// when one answered 2xx, meaning it has created it now.
    pub async fn query_alias(&self, alias: &RoomAliasId) -> bool {
        let path = format!("rooms/{}", encode(alias.as_str()));
        self.query(|r| r.matches_alias(alias.as_str(), false), &path)
            .await
    }

    /// Asks the appservices whose users namespace holds `user_id` about it (`GET
    /// /_matrix/app/v1/users/{userId}`), when a client looks up a local user that does not
    /// exist: true when one answered 2xx, meaning it has registered the user now.
    pub async fn query_user(&self, user_id: &UserId) -> bool {
        let path = format!("users/{}", encode(user_id.as_str()));
        self.query(|r| r.is_interested_in_user(user_id.as_str()), &path)
            .await
    }

    /// Before a client invites `user_id` (`/invite`, `createRoom`): when it is a local user
    /// that does not exist, in the users namespace of an appservice that is sent things, the
    /// appservice is asked about it first, so it can register its ghost on demand (Synapse
    /// asks before it pushes an event that names an unknown user).
    pub async fn ask_about_unknown_user(&self, user_id: &UserId) -> Result<()> {
        let concerned = self.all.iter().any(|r| {
            r.url.is_some()
                && user_id.server_name() == r.sender.server_name()
                && r.is_interested_in_user(user_id.as_str())
        });
        if !concerned {
            return Ok(());
        }
        let known = {
            let conn = self.db.conn().await?;
            users::get_user(&conn, user_id.as_str()).await?.is_some()
        };
        if !known {
            self.query_user(user_id).await;
        }
        Ok(())
    }

    /// `GET {url}/_matrix/app/v1/{path}` of each appservice `concerned` picks, until one
    /// answers 2xx.
    async fn query(&self, concerned: impl Fn(&Registration) -> bool, path: &str) -> bool {
        for registration in self.all.iter().filter(|r| concerned(r)) {
            let Some(url) = &registration.url else {
                continue;
            };
            let answer = self
                .outbound
                .send_to_configured(
                    reqwest::Method::GET,
                    &format!("{url}/_matrix/app/v1/{path}"),
                    &registration.hs_token,
                    None,
                    QUERY_TIMEOUT,
                    MAX_ANSWER,
                )
                .await;
            match answer {
                Ok(response) if response.status.is_success() => return true,
                Ok(_) => {}
                Err(err) => {
                    tracing::warn!(appservice = %registration.id, %path, "query failed: {err}")
                }
            }
        }
        false
    }

    /// Calls the appservice's `POST /_matrix/app/v1/ping` and answers how long it took;
    /// the errors are the ones the Client-Server ping endpoint reports.
    pub async fn ping(
        &self,
        registration: &Registration,
        transaction_id: Option<&str>,
    ) -> Result<Duration> {
        let Some(url) = &registration.url else {
            return Err(Error::matrix(
                StatusCode::BAD_REQUEST,
                "M_URL_NOT_SET",
                "The application service has no URL",
            ));
        };
        let body = match transaction_id {
            Some(id) => json!({ "transaction_id": id }),
            None => json!({}),
        };
        let started = Instant::now();
        let answer = self
            .outbound
            .send_to_configured(
                reqwest::Method::POST,
                &format!("{url}/_matrix/app/v1/ping"),
                &registration.hs_token,
                Some(&body),
                PING_TIMEOUT,
                MAX_ANSWER,
            )
            .await;
        let elapsed = started.elapsed();
        match answer {
            Ok(response) if response.status.is_success() => Ok(elapsed),
            Ok(response) => Err(Error::matrix(
                StatusCode::BAD_GATEWAY,
                "M_BAD_STATUS",
                "The application service answered with an error",
            )
            .with("status", response.status.as_u16())
            .with("body", String::from_utf8_lossy(&response.body).into_owned())),
            Err(OutboundError::Http(err)) if err.is_timeout() => Err(Error::matrix(
                StatusCode::GATEWAY_TIMEOUT,
                "M_CONNECTION_TIMEOUT",
                "The application service did not answer in time",
            )),
            Err(err) => Err(Error::matrix(
                StatusCode::BAD_GATEWAY,
                "M_CONNECTION_FAILED",
                format!("Could not reach the application service: {err}"),
            )),
        }
    }
}

/// A path segment, percent-encoded (aliases carry `#` and `:`).
fn encode(segment: &str) -> String {
    percent_encoding::utf8_percent_encode(segment, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// The device an appservice request without `?device_id=` is recorded under (transaction IDs
/// of sends are kept per user and device).
fn pseudo_device(registration: &Registration) -> OwnedDeviceId {
    OwnedDeviceId::from(format!("_as_{}", registration.id).as_str())
}
