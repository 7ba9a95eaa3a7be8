//! Registration tokens that admins create for `m.login.registration_token`.

use rand::{distr::Alphanumeric, Rng};

use crate::{
    error::{Error, Result},
    storage::{is_unique_violation, now_ms, registration as store, Db},
};

pub use store::RegistrationTokenRow as RegistrationToken;

/// Registration token management.
pub struct RegistrationTokens {
    db: Db,
}

impl RegistrationTokens {
    /// Creates the service.
    pub fn new(db: Db) -> Self {
        RegistrationTokens { db }
    }

    /// Creates a token (random 16 characters when `token` is `None`).
    pub async fn create(
        &self,
        token: Option<String>,
        uses_allowed: Option<i32>,
        expiry_ts: Option<i64>,
    ) -> Result<RegistrationToken> {
        let token = token.unwrap_or_else(|| {
            rand::rng()
                .sample_iter(&Alphanumeric)
                .take(16)
                .map(char::from)
                .collect()
        });
        let valid_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '~' | '-');
        if token.is_empty() || token.len() > 64 || !token.chars().all(valid_char) {
            return Err(Error::invalid_param(
                "Token must be 1-64 characters from [A-Za-z0-9._~-]",
            ));
        }
        if uses_allowed.is_some_and(|n| n < 0) {
            return Err(Error::invalid_param(
                "uses_allowed must be a non-negative integer",
            ));
        }
        let now = now_ms();
        if expiry_ts.is_some_and(|ts| ts <= now) {
            return Err(Error::invalid_param("expiry_time must be in the future"));
        }
        let conn = self.db.conn().await?;
        store::insert_registration_token(&conn, &token, uses_allowed, expiry_ts, now)
            .await
            .map_err(|e| {
                if is_unique_violation(&e) {
                    Error::invalid_param("Token already exists")
                } else {
                    e.into()
                }
            })
    }

    /// Lists every token.
    pub async fn list(&self) -> Result<Vec<RegistrationToken>> {
        let conn = self.db.conn().await?;
        Ok(store::get_registration_tokens(&conn).await?)
    }

    /// Deletes a token; `M_NOT_FOUND` when unknown.
    pub async fn delete(&self, token: &str) -> Result<()> {
        let conn = self.db.conn().await?;
        if store::delete_registration_token(&conn, token).await? {
            Ok(())
        } else {
            Err(Error::not_found("No such registration token"))
        }
    }

    /// Whether a token could be used right now (`/register/m.login.registration_token/validity`).
    pub async fn is_valid(&self, token: &str) -> Result<bool> {
        let conn = self.db.conn().await?;
        let Some(row) = store::get_registration_token(&conn, token).await? else {
            return Ok(false);
        };
        let unexpired = row.expiry_ts.is_none_or(|ts| ts > now_ms());
        let uses_left = row
            .uses_allowed
            .is_none_or(|n| n > row.pending + row.completed);
        Ok(unexpired && uses_left)
    }
}
