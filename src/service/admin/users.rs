//! Accounts through the admin API: the list, details, create or modify, deactivate (with
//! erase), password reset, admin flag, rate-limit overrides and sessions.

use ruma::UserId;
use serde_json::{json, Value};

use super::{page_bounds, Admin};
use crate::{
    error::{Error, Result},
    service::{passwords, rooms::Rooms, users::Users},
    storage::{
        admin_users::{self as store, AdminUserRow, UserQuery},
        devices,
    },
};

/// One page of the user list.
pub struct UserPage {
    /// The users, in the list's shape.
    pub users: Vec<Value>,
    /// How many users match.
    pub total: i64,
    /// The `from` of the next page, when there is one.
    pub next_token: Option<i64>,
}

/// What `PUT /_synapse/admin/v2/users/{userId}` may set; absent fields stay as they are.
#[derive(Debug, Default)]
pub struct UserUpdate {
    /// A new password.
    pub password: Option<String>,
    /// Whether setting a password logs out every device (default true).
    pub logout_devices: bool,
    /// A new display name (`""` removes it).
    pub displayname: Option<String>,
    /// A new avatar URL (`""` removes it).
    pub avatar_url: Option<String>,
    /// The admin flag.
    pub admin: Option<bool>,
    /// Deactivate (`true`) or reactivate (`false`, needs a password).
    pub deactivated: Option<bool>,
}

/// A user in the list's shape; `creation_ts` is in ms here (Synapse's list does that).
fn list_entry(row: &AdminUserRow) -> Value {
    json!({
        "name": row.user_id,
        "is_guest": false,
        "admin": row.is_admin,
        "user_type": null,
        "deactivated": row.deactivated,
        "erased": row.erased,
        "shadow_banned": row.shadow_banned,
        "displayname": row.displayname,
        "avatar_url": row.avatar_url,
        "creation_ts": row.created_ts,
        "last_seen_ts": row.last_seen_ts,
        "locked": false,
        "approved": true,
    })
}

/// A user in the details' shape; `creation_ts` is in seconds here, as Synapse serves it.
fn details(row: &AdminUserRow) -> Value {
    let mut entry = list_entry(row);
    entry["creation_ts"] = json!(row.created_ts / 1000);
    entry["threepids"] = json!([]);
    entry["external_ids"] = json!([]);
    entry["appservice_id"] = Value::Null;
    entry["consent_server_notice_sent"] = Value::Null;
    entry["consent_version"] = Value::Null;
    entry["consent_ts"] = Value::Null;
    entry["suspended"] = json!(false);
    entry
}

impl Admin {
    /// A page of the user list.
    pub async fn list_users(&self, query: &UserQuery, from: i64, limit: i64) -> Result<UserPage> {
        let (from, limit) = page_bounds(from, limit);
        let conn = self.db.conn().await?;
        let (rows, total) = store::list_users(&conn, query, from, limit).await?;
        let next = from + rows.len() as i64;
        Ok(UserPage {
            users: rows.iter().map(list_entry).collect(),
            total,
            next_token: (next < total && !rows.is_empty()).then_some(next),
        })
    }

    /// One user's details; 404 `M_NOT_FOUND` for unknown users.
    pub async fn get_user(&self, user_id: &UserId) -> Result<Value> {
        let conn = self.db.conn().await?;
        let row = store::get_user(&conn, user_id.as_str())
            .await?
            .ok_or_else(|| Error::not_found("User not found"))?;
        Ok(details(&row))
    }

    /// Fails with 400 unless `user_id` belongs to this server.
    pub fn ensure_local(&self, user_id: &UserId) -> Result<()> {
        if user_id.server_name() == self.config.server_name {
            Ok(())
        } else {
            Err(Error::invalid_param(
                "This endpoint can only be used with local users",
            ))
        }
    }

    /// Fails with 404 `M_NOT_FOUND` unless `user_id` is a local account.
    pub async fn ensure_exists(&self, user_id: &UserId) -> Result<()> {
        self.ensure_local(user_id)?;
        let conn = self.db.conn().await?;
        match crate::storage::users::get_user(&conn, user_id.as_str()).await? {
            Some(_) => Ok(()),
            None => Err(Error::not_found("User not found")),
        }
    }

    /// Creates the account when it does not exist, otherwise changes what `update` names.
    /// Returns whether it was created, and the user's details afterwards.
    pub async fn create_or_modify_user(
        &self,
        users: &Users,
        rooms: &Rooms,
        user_id: &UserId,
        update: UserUpdate,
    ) -> Result<(bool, Value)> {
        self.ensure_local(user_id)?;
        let existing = {
            let conn = self.db.conn().await?;
            crate::storage::users::get_user(&conn, user_id.as_str()).await?
        };
        let created = existing.is_none();
        match existing {
            None => {
                users.user_id_for(user_id.localpart())?;
                users
                    .register(
                        user_id,
                        update.password.clone(),
                        update.admin.unwrap_or(false),
                        None,
                        None,
                    )
                    .await?;
                if update.deactivated == Some(true) {
                    self.deactivate_user(users, rooms, user_id, false).await?;
                }
            }
            Some(row) => {
                match (row.deactivated, update.deactivated) {
                    (false, Some(true)) => {
                        self.deactivate_user(users, rooms, user_id, false).await?
                    }
                    (true, Some(false)) => {
                        let password = update.password.clone().ok_or_else(|| {
                            Error::invalid_param(
                                "Must provide a password to re-activate an account.",
                            )
                        })?;
                        let hash = passwords::hash_password(password).await?;
                        let conn = self.db.conn().await?;
                        store::reactivate(&conn, user_id.as_str(), &hash).await?;
                    }
                    _ => {}
                }
                if let Some(password) = update.password.clone() {
                    if !row.deactivated || update.deactivated != Some(false) {
                        users
                            .change_password(user_id, password, update.logout_devices, None, None)
                            .await?;
                    }
                }
                if let Some(admin) = update.admin {
                    let conn = self.db.conn().await?;
                    store::set_admin(&conn, user_id.as_str(), admin).await?;
                    users.forget_cached_sessions(user_id);
                }
            }
        }
        // The UIs send the whole record on every save: only a field that really changes is
        // written, so an unchanged save sends no member events into the user's rooms.
        let current = {
            let conn = self.db.conn().await?;
            store::get_user(&conn, user_id.as_str()).await?
        };
        let mut profile_changed = false;
        for (field, wanted, now) in [
            (
                "displayname",
                &update.displayname,
                current.as_ref().and_then(|u| u.displayname.clone()),
            ),
            (
                "avatar_url",
                &update.avatar_url,
                current.as_ref().and_then(|u| u.avatar_url.clone()),
            ),
        ] {
            let Some(wanted) = wanted else { continue };
            let value = (!wanted.is_empty()).then(|| wanted.clone());
            if value == now {
                continue;
            }
            users
                .set_profile_field(user_id, field, value.map(Value::from).as_ref())
                .await?;
            profile_changed = true;
        }
        if profile_changed && !created {
            rooms.propagate_profile(user_id).await?;
        }
        Ok((created, self.get_user(user_id).await?))
    }

    /// Deactivates an account through the account service's own path (devices, tokens,
    /// delayed events; with `erase` the profile, and the erased mark) and leaves its rooms
    /// through the normal membership path.
    pub async fn deactivate_user(
        &self,
        users: &Users,
        rooms: &Rooms,
        user_id: &UserId,
        erase: bool,
    ) -> Result<()> {
        self.ensure_exists(user_id).await?;
        users.deactivate(user_id, None, erase).await?;
        rooms.leave_all_rooms(user_id).await
    }

    /// Sets a new password; `logout_devices` logs out every device.
    pub async fn reset_password(
        &self,
        users: &Users,
        user_id: &UserId,
        new_password: String,
        logout_devices: bool,
    ) -> Result<()> {
        self.ensure_exists(user_id).await?;
        users
            .change_password(user_id, new_password, logout_devices, None, None)
            .await
    }

    /// An access token for `user_id`, for an admin to act as them; never for the admin's own
    /// account (as in Synapse), and not listed among the user's devices.
    pub async fn login_as(
        &self,
        users: &Users,
        admin: &UserId,
        user_id: &UserId,
        valid_until_ms: Option<i64>,
    ) -> Result<String> {
        if admin == user_id {
            return Err(Error::invalid_param(
                "Cannot use admin API to login as self",
            ));
        }
        self.ensure_exists(user_id).await?;
        users.open_hidden_session(user_id, valid_until_ms).await
    }

    /// Whether a local user is an admin.
    pub async fn is_admin(&self, user_id: &UserId) -> Result<bool> {
        self.ensure_local(user_id)?;
        let conn = self.db.conn().await?;
        crate::storage::users::get_user(&conn, user_id.as_str())
            .await?
            .map(|u| u.is_admin)
            .ok_or_else(|| Error::not_found("User not found"))
    }

    /// Sets a local user's admin flag.
    pub async fn set_admin(&self, users: &Users, user_id: &UserId, admin: bool) -> Result<()> {
        self.ensure_local(user_id)?;
        let conn = self.db.conn().await?;
        if store::set_admin(&conn, user_id.as_str(), admin).await? {
            // Cached token lookups carry the flag: a demoted admin loses it at once.
            users.forget_cached_sessions(user_id);
            Ok(())
        } else {
            Err(Error::not_found("User not found"))
        }
    }

    /// A user's rate-limit override as `{messages_per_second, burst_count}`, or `{}`.
    pub async fn get_ratelimit_override(&self, user_id: &UserId) -> Result<Value> {
        self.ensure_exists(user_id).await?;
        let conn = self.db.conn().await?;
        Ok(
            match store::get_ratelimit_override(&conn, user_id.as_str()).await? {
                Some((per_second, burst)) => {
                    json!({ "messages_per_second": per_second, "burst_count": burst })
                }
                None => json!({}),
            },
        )
    }

    /// Stores a user's rate-limit override (0 means unlimited, as in Synapse).
    pub async fn set_ratelimit_override(
        &self,
        user_id: &UserId,
        messages_per_second: i64,
        burst_count: i64,
    ) -> Result<Value> {
        self.ensure_exists(user_id).await?;
        if messages_per_second < 0 || burst_count < 0 {
            return Err(Error::invalid_param(
                "messages_per_second and burst_count must be positive integers",
            ));
        }
        let conn = self.db.conn().await?;
        store::set_ratelimit_override(&conn, user_id.as_str(), messages_per_second, burst_count)
            .await?;
        Ok(json!({ "messages_per_second": messages_per_second, "burst_count": burst_count }))
    }

    /// Removes a user's rate-limit override.
    pub async fn delete_ratelimit_override(&self, user_id: &UserId) -> Result<()> {
        self.ensure_exists(user_id).await?;
        let conn = self.db.conn().await?;
        Ok(store::delete_ratelimit_override(&conn, user_id.as_str()).await?)
    }

    /// Every room the user has a membership in and which, `{memberships}`.
    pub async fn user_memberships(&self, user_id: &UserId) -> Result<Value> {
        self.ensure_exists(user_id).await?;
        let conn = self.db.conn().await?;
        let memberships: serde_json::Map<String, Value> =
            crate::storage::memberships::get_user_memberships(&conn, user_id.as_str())
                .await?
                .into_iter()
                .map(|(room_id, membership, ..)| (room_id, Value::from(membership)))
                .collect();
        Ok(json!({ "memberships": memberships }))
    }

    /// The user's devices in the admin shape, `{devices, total}`.
    pub async fn list_devices(&self, users: &Users, user_id: &UserId) -> Result<Value> {
        self.ensure_exists(user_id).await?;
        let devices: Vec<Value> = users
            .get_devices(user_id)
            .await?
            .iter()
            .map(|d| device_entry(user_id, d))
            .collect();
        Ok(json!({ "total": devices.len(), "devices": devices }))
    }

    /// One device in the admin shape.
    pub async fn get_device(
        &self,
        users: &Users,
        user_id: &UserId,
        device_id: &str,
    ) -> Result<Value> {
        self.ensure_exists(user_id).await?;
        Ok(device_entry(
            user_id,
            &users.get_device(user_id, device_id).await?,
        ))
    }

    /// Where and when the user's devices were last used (Synapse's `whois` shape).
    pub async fn whois(&self, users: &Users, user_id: &UserId) -> Result<Value> {
        self.ensure_exists(user_id).await?;
        let connections: Vec<Value> = users
            .get_devices(user_id)
            .await?
            .iter()
            .filter(|d| d.last_seen_ip.is_some())
            .map(|d| {
                json!({
                    "ip": d.last_seen_ip,
                    "last_seen": d.last_seen_ts,
                    "user_agent": null,
                })
            })
            .collect();
        Ok(json!({
            "user_id": user_id,
            "devices": { "": { "sessions": [{ "connections": connections }] } },
        }))
    }
}

/// A device in the admin API's shape.
fn device_entry(user_id: &UserId, device: &devices::DeviceRow) -> Value {
    json!({
        "device_id": device.device_id,
        "display_name": device.display_name,
        "last_seen_ip": device.last_seen_ip,
        "last_seen_user_agent": null,
        "last_seen_ts": device.last_seen_ts,
        "user_id": user_id,
        "dehydrated": false,
    })
}
