//! Accounts: registration, login, passwords, deactivation, profiles and devices.

use std::sync::Arc;

use diesel_async::AsyncPgConnection;
use rand::{distr::Alphanumeric, Rng};
use ruma::{OwnedDeviceId, OwnedUserId, UserId};
use serde_json::Value;

use super::{
    e2ee::local_devices_changed,
    federation::sender::Sender,
    passwords,
    sessions::{IssuedTokens, Sessions},
    uia::{Completed, Uia},
};
use crate::{
    config::Config,
    error::{Error, Result},
    storage::{admin_users, delayed_events, devices, is_unique_violation, now_ms, users, Db},
};

/// Largest a whole profile may be, serialized as one JSON object (spec: 64 KiB).
pub const MAX_PROFILE_BYTES: usize = 64 * 1024;

/// What a new login (or registration with login) hands back to the client.
#[derive(Debug, Clone)]
pub struct LoginSession {
    /// The user.
    pub user_id: OwnedUserId,
    /// The device the tokens belong to.
    pub device_id: OwnedDeviceId,
    /// The tokens.
    pub tokens: IssuedTokens,
}

/// A device as the devices API shows it.
pub use devices::DeviceRow as Device;

/// Which device a login should use and whether it wants a refresh token.
#[derive(Debug, Clone, Default)]
pub struct DeviceRequest {
    /// Existing or desired device ID; generated when absent.
    pub device_id: Option<OwnedDeviceId>,
    /// Display name for a new device.
    pub display_name: Option<String>,
    /// Whether to issue a refresh token (and an expiring access token).
    pub refresh_token: bool,
}

/// Account management.
pub struct Users {
    db: Db,
    config: Arc<Config>,
    sessions: Arc<Sessions>,
    /// Tells the servers sharing a room with a user that their devices changed.
    federation: Arc<Sender>,
}

/// Generates a device ID like `ABCDEFGHIJ`.
fn generate_device_id() -> OwnedDeviceId {
    let id: String = rand::rng()
        .sample_iter(&Alphanumeric)
        .map(|c| (c as char).to_ascii_uppercase())
        .filter(char::is_ascii_uppercase)
        .take(10)
        .collect();
    id.into()
}

impl Users {
    /// Creates the service.
    pub fn new(
        db: Db,
        config: Arc<Config>,
        sessions: Arc<Sessions>,
        federation: Arc<Sender>,
    ) -> Self {
        Users {
            db,
            config,
            sessions,
            federation,
        }
    }

    /// Checks a requested localpart and turns it into a user ID on this server.
    pub fn user_id_for(&self, localpart: &str) -> Result<OwnedUserId> {
        if localpart.is_empty() {
            return Err(Error::invalid_username("User ID cannot be empty"));
        }
        if localpart.starts_with('_') {
            return Err(Error::invalid_username("User ID may not begin with _"));
        }
        let allowed =
            |c: char| matches!(c, 'a'..='z' | '0'..='9' | '.' | '_' | '=' | '-' | '/' | '+');
        if !localpart.chars().all(allowed) {
            return Err(Error::invalid_username(
                "User ID can only contain characters a-z, 0-9, or '=_-./+'",
            ));
        }
        let user_id = format!("@{localpart}:{}", self.config.server_name);
        if user_id.len() > 255 {
            return Err(Error::invalid_username("User ID is too long"));
        }
        UserId::parse(user_id).map_err(|_| Error::invalid_username("Invalid user ID"))
    }

    /// Whether a localpart is free to register.
    pub async fn check_available(&self, localpart: &str) -> Result<OwnedUserId> {
        let user_id = self.user_id_for(localpart)?;
        let conn = self.db.conn().await?;
        if users::localpart_exists(&conn, localpart).await? {
            return Err(Error::user_in_use());
        }
        Ok(user_id)
    }

    /// Picks an unused numeric localpart, as Synapse does when no username is given.
    pub async fn generate_localpart(&self) -> Result<String> {
        let conn = self.db.conn().await?;
        for _ in 0..10 {
            let candidate = rand::rng()
                .random_range(10_000_000u64..100_000_000)
                .to_string();
            if !users::localpart_exists(&conn, &candidate).await? {
                return Ok(candidate);
            }
        }
        Err(Error::internal("could not find a free localpart"))
    }

    /// Creates an account (and, unless `device` is `None`, a device with tokens).
    /// `uia` is consumed in the same transaction.
    pub async fn register(
        &self,
        user_id: &UserId,
        password: Option<String>,
        is_admin: bool,
        uia: Option<(&Uia, &Completed)>,
        device: Option<DeviceRequest>,
    ) -> Result<Option<LoginSession>> {
        let password_hash = match password {
            Some(p) => Some(passwords::hash_password(p).await?),
            None => None,
        };
        let mut conn = self.db.conn().await?;
        let created = crate::storage::transaction::transaction(&mut conn, async |conn| {
            if let Some((uia, completed)) = uia {
                uia.finish(conn, completed).await?;
            }
            let new_user = users::NewUser {
                user_id: user_id.as_str(),
                localpart: user_id.localpart(),
                password_hash: password_hash.as_deref(),
                is_admin,
                created_ts: now_ms(),
            };
            users::insert_user(conn, &new_user).await.map_err(|e| {
                if is_unique_violation(&e) {
                    Error::user_in_use()
                } else {
                    e.into()
                }
            })?;
            users::set_profile_field(
                conn,
                user_id.as_str(),
                "displayname",
                &Value::from(user_id.localpart()),
            )
            .await?;
            match device {
                Some(device) => Ok(Some(self.open_session(conn, user_id, device).await?)),
                None => Ok(None),
            }
        })
        .await;
        if created.is_err() {
            // Nothing was created, so a token use the UIA session reserved goes back.
            if let Some((uia, completed)) = uia {
                if let Err(err) = uia.release_token(completed).await {
                    tracing::warn!("could not release a registration token use: {err}");
                }
            }
        }
        created
    }

    /// Creates (or reuses) a device and issues tokens for it inside a transaction.
    /// Reusing a device ID revokes the tokens it had before, as the spec requires.
    async fn open_session(
        &self,
        conn: &AsyncPgConnection,
        user_id: &UserId,
        device: DeviceRequest,
    ) -> Result<LoginSession> {
        let device_id = device.device_id.unwrap_or_else(generate_device_id);
        devices::upsert_device(
            conn,
            user_id.as_str(),
            device_id.as_str(),
            device.display_name.as_deref(),
            now_ms(),
        )
        .await?;
        let revoked =
            devices::delete_device_tokens(conn, user_id.as_str(), device_id.as_str()).await?;
        self.sessions.forget_cached(&revoked);
        let tokens = self
            .sessions
            .issue_tokens(
                conn,
                user_id.as_str(),
                device_id.as_str(),
                device.refresh_token,
            )
            .await?;
        Ok(LoginSession {
            user_id: user_id.to_owned(),
            device_id,
            tokens,
        })
    }

    /// An access token for `user_id` on a new hidden device (an admin acting as the user):
    /// not listed among the user's devices, gone with them on logout-all or deactivation;
    /// `valid_until_ms` ends it early.
    pub async fn open_hidden_session(
        &self,
        user_id: &UserId,
        valid_until_ms: Option<i64>,
    ) -> Result<String> {
        let mut conn = self.db.conn().await?;
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            let device_id = generate_device_id();
            devices::insert_hidden_device(conn, user_id.as_str(), device_id.as_str(), now_ms())
                .await?;
            let tokens = self
                .sessions
                .issue_tokens(conn, user_id.as_str(), device_id.as_str(), false)
                .await?;
            if let Some(until) = valid_until_ms {
                let hash = super::sessions::hash_token(&tokens.access_token);
                devices::set_access_token_expiry(conn, &hash, until).await?;
            }
            Ok(tokens.access_token)
        })
        .await
    }

    /// Logs a user in on a (new or existing) device.
    pub async fn login(&self, user_id: &UserId, device: DeviceRequest) -> Result<LoginSession> {
        let mut conn = self.db.conn().await?;
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            self.open_session(conn, user_id, device).await
        })
        .await
    }

    /// Resolves an `m.id.user` identifier (localpart or full ID) to a local user ID.
    pub fn resolve_identifier(&self, user: &str) -> Result<OwnedUserId> {
        let forbidden = || Error::forbidden("Invalid username or password");
        if user.starts_with('@') {
            // Localparts are stored lowercased; server names compare without case (DNS), and
            // the configured one's spelling is the one in IDs (lowercasing the whole ID broke
            // names like `Example.org`).
            let user_id = UserId::parse(user).map_err(|_| forbidden())?;
            let server_name = user_id.server_name().as_str();
            if !server_name.eq_ignore_ascii_case(self.config.server_name.as_str()) {
                return Err(forbidden());
            }
            self.user_id_for(&user_id.localpart().to_lowercase())
                .map_err(|_| forbidden())
        } else {
            self.user_id_for(&user.to_lowercase())
                .map_err(|_| forbidden())
        }
    }

    /// Checks a password login; every failure looks the same to the client.
    pub async fn check_password(&self, user_id: &UserId, password: &str) -> Result<()> {
        let forbidden = || Error::forbidden("Invalid username or password");
        let conn = self.db.conn().await?;
        let user = users::get_user(&conn, user_id.as_str())
            .await?
            .ok_or_else(forbidden)?;
        if user.deactivated {
            return Err(Error::user_deactivated());
        }
        let hash = user.password_hash.ok_or_else(forbidden)?;
        if passwords::verify_password(password.to_owned(), hash).await? {
            Ok(())
        } else {
            Err(forbidden())
        }
    }

    /// Validates a JWT (`org.matrix.login.jwt`) and returns the user it names, creating the
    /// account on first login as Synapse does.
    pub async fn check_jwt(&self, token: &str) -> Result<OwnedUserId> {
        let jwt = self
            .config
            .jwt
            .as_ref()
            .ok_or_else(|| Error::unknown("JWT login is not enabled"))?;
        let mut validation = jsonwebtoken::Validation::new(jwt.algorithm);
        validation.required_spec_claims.clear();
        validation.required_spec_claims.insert("sub".into());
        if jwt.require_exp {
            validation.required_spec_claims.insert("exp".into());
        }
        validation.validate_nbf = true;
        match &jwt.issuer {
            Some(iss) => validation.set_issuer(&[iss]),
            None => validation.iss = None,
        }
        match &jwt.audience {
            Some(aud) => validation.set_audience(&[aud]),
            None => validation.validate_aud = false,
        }
        #[derive(serde::Deserialize)]
        struct Claims {
            sub: String,
        }
        let claims = jsonwebtoken::decode::<Claims>(token, &jwt.key, &validation)
            .map_err(|e| Error::forbidden(format!("JWT validation failed: {e}")))?
            .claims;
        let user_id = self.resolve_identifier(&claims.sub)?;
        let conn = self.db.conn().await?;
        match users::get_user(&conn, user_id.as_str()).await? {
            Some(user) if user.deactivated => Err(Error::user_deactivated()),
            Some(_) => Ok(user_id),
            None => {
                drop(conn);
                self.user_id_for(user_id.localpart())?;
                match self.register(&user_id, None, false, None, None).await {
                    Ok(_) => Ok(user_id),
                    // Two first logins raced; the account exists now, which is all we need.
                    Err(Error::Matrix {
                        errcode: "M_USER_IN_USE",
                        ..
                    }) => Ok(user_id),
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// Sets a new password; optionally logs out every other device.
    pub async fn change_password(
        &self,
        user_id: &UserId,
        new_password: String,
        logout_devices: bool,
        keep_device: Option<&str>,
        uia: Option<(&Uia, &Completed)>,
    ) -> Result<()> {
        let hash = passwords::hash_password(new_password).await?;
        let mut conn = self.db.conn().await?;
        let revoked = crate::storage::transaction::transaction(&mut conn, async |conn| {
            if let Some((uia, completed)) = uia {
                uia.finish(conn, completed).await?;
            }
            users::set_password_hash(conn, user_id.as_str(), Some(&hash)).await?;
            if logout_devices {
                let keep = keep_device.map(|d| vec![d.to_owned()]).unwrap_or_default();
                let others: Vec<String> = devices::get_device_ids(conn, user_id.as_str())
                    .await?
                    .into_iter()
                    .filter(|d| !keep.contains(d))
                    .collect();
                let mut revoked = devices::delete_devices(conn, user_id.as_str(), &others).await?;
                local_devices_changed(conn, &self.federation, user_id, &others).await?;
                revoked.extend(
                    devices::delete_user_tokens(conn, user_id.as_str(), keep_device).await?,
                );
                Ok(revoked)
            } else {
                Ok(Vec::new())
            }
        })
        .await?;
        self.sessions.forget_cached(&revoked);
        Ok(())
    }

    /// Deactivates an account: no more logins, every device and token gone. With `erase` (the
    /// client's and the admin API's flag) the profile goes too and the account is marked
    /// erased; without it the profile stays, as in Synapse.
    pub async fn deactivate(
        &self,
        user_id: &UserId,
        uia: Option<(&Uia, &Completed)>,
        erase: bool,
    ) -> Result<()> {
        let mut conn = self.db.conn().await?;
        let revoked = crate::storage::transaction::transaction(&mut conn, async |conn| {
            if let Some((uia, completed)) = uia {
                uia.finish(conn, completed).await?;
            }
            users::deactivate_user(conn, user_id.as_str()).await?;
            if erase {
                users::delete_profile_fields(conn, user_id.as_str(), None).await?;
                admin_users::set_erased(conn, user_id.as_str()).await?;
            }
            // Nothing is sent in the account's name later (MSC4140, as Synapse).
            delayed_events::cancel_all_for_user(conn, user_id.as_str(), now_ms()).await?;
            let all = devices::get_device_ids(conn, user_id.as_str()).await?;
            let revoked = devices::delete_devices(conn, user_id.as_str(), &all).await?;
            local_devices_changed(conn, &self.federation, user_id, &all).await?;
            Ok(revoked)
        })
        .await?;
        self.sessions.forget_cached(&revoked);
        Ok(())
    }

    /// Drops every cached lookup of the user's tokens, here and in the other server processes
    /// (after a change to what a lookup says of them).
    pub fn forget_cached_sessions(&self, user_id: &UserId) {
        self.sessions.forget_user(user_id.as_str());
    }

    /// Sets or lifts a shadow ban; `M_NOT_FOUND` for unknown users.
    pub async fn set_shadow_banned(&self, user_id: &UserId, banned: bool) -> Result<()> {
        let conn = self.db.conn().await?;
        if users::set_shadow_banned(&conn, user_id.as_str(), banned).await? {
            // Cached token lookups carry the ban: it applies at once, in every process.
            self.sessions.forget_user(user_id.as_str());
            Ok(())
        } else {
            Err(Error::not_found("Unknown user"))
        }
    }

    /// The user's profile fields; `M_NOT_FOUND` when the user does not exist.
    pub async fn get_profile(&self, user_id: &UserId) -> Result<Vec<(String, Value)>> {
        let conn = self.db.conn().await?;
        let user = users::get_user(&conn, user_id.as_str()).await?;
        if user.is_none() || user_id.server_name() != self.config.server_name {
            return Err(Error::not_found("Profile not found"));
        }
        Ok(users::get_profile(&conn, user_id.as_str()).await?)
    }

    /// One profile field; `M_NOT_FOUND` when the user or the field does not exist.
    pub async fn get_profile_field(&self, user_id: &UserId, field: &str) -> Result<Value> {
        let conn = self.db.conn().await?;
        if users::get_user(&conn, user_id.as_str()).await?.is_none() {
            return Err(Error::not_found("Profile not found"));
        }
        users::get_profile_field(&conn, user_id.as_str(), field)
            .await?
            .ok_or_else(|| Error::not_found("Profile field not set"))
    }

    /// Sets (or with `None` deletes) one of the caller's own profile fields.
    pub async fn set_profile_field(
        &self,
        user_id: &UserId,
        field: &str,
        value: Option<&Value>,
    ) -> Result<()> {
        let mut conn = self.db.conn().await?;
        let Some(value) = value else {
            users::delete_profile_fields(&conn, user_id.as_str(), Some(field)).await?;
            return Ok(());
        };
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            users::lock_user(conn, user_id.as_str()).await?;
            let mut profile: serde_json::Map<String, Value> =
                users::get_profile(conn, user_id.as_str())
                    .await?
                    .into_iter()
                    .collect();
            profile.insert(field.to_owned(), value.clone());
            if serde_json::to_vec(&profile).map_or(usize::MAX, |v| v.len()) > MAX_PROFILE_BYTES {
                return Err(Error::matrix(
                    actix_web::http::StatusCode::BAD_REQUEST,
                    "M_PROFILE_TOO_LARGE",
                    "The profile would be larger than 64 KiB",
                ));
            }
            Ok(users::set_profile_field(conn, user_id.as_str(), field, value).await?)
        })
        .await
    }

    /// All devices of a user.
    pub async fn get_devices(&self, user_id: &UserId) -> Result<Vec<Device>> {
        let conn = self.db.conn().await?;
        Ok(devices::get_devices(&conn, user_id.as_str()).await?)
    }

    /// One device; `M_NOT_FOUND` when the user has no such device.
    pub async fn get_device(&self, user_id: &UserId, device_id: &str) -> Result<Device> {
        let conn = self.db.conn().await?;
        devices::get_device(&conn, user_id.as_str(), device_id)
            .await?
            .ok_or_else(|| Error::not_found("Unknown device"))
    }

    /// Creates a device with no token (an appservice's, MSC4190, or an admin's
    /// `POST .../devices`); false when it exists, which is left as it is.
    pub async fn create_device(
        &self,
        user_id: &UserId,
        device_id: &str,
        name: Option<&str>,
    ) -> Result<bool> {
        let conn = self.db.conn().await?;
        if devices::get_device(&conn, user_id.as_str(), device_id)
            .await?
            .is_some()
        {
            return Ok(false);
        }
        devices::upsert_device(&conn, user_id.as_str(), device_id, name, now_ms()).await?;
        Ok(true)
    }

    /// Renames a device; `M_NOT_FOUND` when it does not exist.
    pub async fn rename_device(
        &self,
        user_id: &UserId,
        device_id: &str,
        name: Option<&str>,
    ) -> Result<()> {
        let conn = self.db.conn().await?;
        if devices::rename_device(&conn, user_id.as_str(), device_id, name).await? {
            Ok(())
        } else {
            Err(Error::not_found("Unknown device"))
        }
    }

    /// Deletes devices and revokes their tokens at once (`uia`: the session that allowed it,
    /// `None` when an admin does it).
    pub async fn delete_devices(
        &self,
        user_id: &UserId,
        device_ids: &[String],
        uia: Option<(&Uia, &Completed)>,
    ) -> Result<()> {
        let mut conn = self.db.conn().await?;
        let revoked = crate::storage::transaction::transaction(&mut conn, async |conn| {
            if let Some((uia, completed)) = uia {
                uia.finish(conn, completed).await?;
            }
            let revoked = devices::delete_devices(conn, user_id.as_str(), device_ids).await?;
            local_devices_changed(conn, &self.federation, user_id, device_ids).await?;
            Ok(revoked)
        })
        .await?;
        self.sessions.forget_cached(&revoked);
        Ok(())
    }

    /// Logs out every device of the user (`/logout/all`): tokens die, devices are removed.
    pub async fn logout_all(&self, user_id: &UserId) -> Result<()> {
        let mut conn = self.db.conn().await?;
        let revoked = crate::storage::transaction::transaction(&mut conn, async |conn| {
            let all = devices::get_device_ids(conn, user_id.as_str()).await?;
            let revoked = devices::delete_devices(conn, user_id.as_str(), &all).await?;
            local_devices_changed(conn, &self.federation, user_id, &all).await?;
            Ok(revoked)
        })
        .await?;
        self.sessions.forget_cached(&revoked);
        Ok(())
    }

    /// Logs out one device (`/logout`): its tokens die and the device is removed, as Synapse does.
    pub async fn logout(&self, user_id: &UserId, device_id: &str) -> Result<()> {
        let mut conn = self.db.conn().await?;
        let revoked = crate::storage::transaction::transaction(&mut conn, async |conn| {
            let gone = [device_id.to_owned()];
            let revoked = devices::delete_devices(conn, user_id.as_str(), &gone).await?;
            local_devices_changed(conn, &self.federation, user_id, &gone).await?;
            Ok(revoked)
        })
        .await?;
        self.sessions.forget_cached(&revoked);
        Ok(())
    }
}
