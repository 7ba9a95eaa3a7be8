//! User-interactive authentication (UIA): flows, stages and sessions kept in PostgreSQL.
//!
//! A call to [`Uia::check`] commits the stage it processed even when more stages remain
//! (the 401 that follows must not roll progress back). A session that completed a flow is
//! consumed by [`Uia::finish`] inside the protected operation's own transaction, so two
//! requests racing with one completed session cannot both succeed.
//!
//! A registration token stage reserves one use of the token (`pending`). The use is released
//! when the registration fails after UIA ([`Uia::release_token`]) and when the session expires
//! (a sweep at most once a minute), and a session never reserves twice.

use std::sync::{
    atomic::{AtomicI64, Ordering},
    Arc,
};

use actix_web::http::StatusCode;
use diesel_async::AsyncPgConnection;
use ruma::{
    api::client::uiaa::{AuthData, UserIdentifier},
    UserId,
};
use serde_json::{json, Value};

use super::{
    passwords,
    rate_limit::{Failure, RateLimiter},
    sessions::generate_token,
};
use crate::{
    config::{Config, RegistrationMode},
    error::{Error, Result},
    storage::{now_ms, registration, users, Db},
};

const DUMMY: &str = "m.login.dummy";
const PASSWORD: &str = "m.login.password";
const REGISTRATION_TOKEN: &str = "m.login.registration_token";

/// Sessions older than this are treated as unknown.
const SESSION_LIFETIME_MS: i64 = 60 * 60 * 1000;
/// How often expired sessions are swept (releasing their registration tokens).
const SWEEP_INTERVAL_MS: i64 = 60 * 1000;

/// What the authentication protects.
#[derive(Debug, Clone, Copy)]
pub enum Purpose<'a> {
    /// Creating an account.
    Register,
    /// A sensitive action on an existing account (password change, deactivation, device
    /// deletion, replacing cross-signing keys), named by its request (`METHOD path`): a
    /// session started for one request cannot authorise another.
    Account(&'a UserId, &'a str),
}

impl Purpose<'_> {
    /// The operation a session for this purpose is bound to.
    fn operation(&self) -> &str {
        match self {
            Purpose::Register => "POST /register",
            Purpose::Account(_, operation) => operation,
        }
    }
}

/// A completed UIA session, to be consumed with [`Uia::finish`].
#[derive(Debug, Clone)]
pub struct Completed {
    session_id: String,
    /// The registration token the session validated, if any.
    pub registration_token: Option<String>,
}

/// User-interactive authentication.
pub struct Uia {
    db: Db,
    config: Arc<Config>,
    rate_limit: Arc<RateLimiter>,
    last_sweep_ms: AtomicI64,
}

enum StageResult {
    Done,
    Failed(Error),
}

impl Uia {
    /// Creates the service.
    pub fn new(db: Db, config: Arc<Config>, rate_limit: Arc<RateLimiter>) -> Self {
        Uia {
            db,
            config,
            rate_limit,
            last_sweep_ms: AtomicI64::new(0),
        }
    }

    async fn flows(
        &self,
        conn: &AsyncPgConnection,
        purpose: Purpose<'_>,
    ) -> Result<Vec<Vec<&'static str>>> {
        Ok(match purpose {
            Purpose::Register => match self.config.registration {
                RegistrationMode::Open => vec![vec![DUMMY]],
                RegistrationMode::Token => vec![vec![REGISTRATION_TOKEN]],
                RegistrationMode::Closed => {
                    return Err(Error::forbidden("Registration is disabled"))
                }
            },
            Purpose::Account(user_id, _) => {
                let user = users::get_user(conn, user_id.as_str()).await?;
                // Accounts without a password (JWT logins) have nothing to re-authenticate
                // with, and holding their access token must not be enough (as Synapse).
                if user.and_then(|u| u.password_hash).is_none() {
                    return Err(Error::forbidden(
                        "This account has no password to confirm this action with; ask an \
                         administrator to set one, or set one up through your identity provider",
                    ));
                }
                vec![vec![PASSWORD]]
            }
        })
    }

    /// Processes the client's `auth` object. Returns the completed session, or a 401 UIA
    /// error listing the flows and what is completed so far.
    pub async fn check(&self, auth: Option<&AuthData>, purpose: Purpose<'_>) -> Result<Completed> {
        self.sweep_expired().await?;
        let mut conn = self.db.conn().await?;
        let flows = self.flows(&conn, purpose).await?;
        let outcome = crate::storage::transaction::transaction(&mut conn, async |conn| {
            self.process(conn, auth, purpose, &flows).await
        })
        .await?;
        match outcome {
            Ok(completed) => Ok(completed),
            Err((session_id, done, failure)) => Err(uia_error(&flows, &session_id, &done, failure)),
        }
    }

    /// Runs one stage inside a transaction. `Ok(Err(..))` means "not finished yet", with the
    /// progress committed.
    #[allow(clippy::type_complexity)]
    async fn process(
        &self,
        conn: &AsyncPgConnection,
        auth: Option<&AuthData>,
        purpose: Purpose<'_>,
        flows: &[Vec<&'static str>],
    ) -> Result<std::result::Result<Completed, (String, Vec<String>, Option<Error>)>> {
        let owner = match purpose {
            Purpose::Register => None,
            Purpose::Account(user_id, _) => Some(user_id.as_str()),
        };
        let existing = match auth.and_then(|a| a.session()) {
            Some(id) => {
                // An expired session still holding a token use waits for the sweep.
                let row = registration::get_uia_session_for_update(conn, id)
                    .await?
                    .filter(|row| row.created_ts + SESSION_LIFETIME_MS > now_ms())
                    .ok_or_else(|| {
                        Error::matrix(StatusCode::BAD_REQUEST, "M_UNKNOWN", "Unknown session ID")
                    })?;
                if row.user_id.as_deref() != owner {
                    return Err(Error::forbidden("This session belongs to another request"));
                }
                if row.operation.as_deref() != Some(purpose.operation()) {
                    return Err(Error::forbidden(
                        "Requested operation has changed during the UI authentication session",
                    ));
                }
                Some(row)
            }
            None => None,
        };
        let (session_id, mut done, mut token) = match existing {
            Some(row) => {
                let done: Vec<String> =
                    serde_json::from_value(row.completed_stages).unwrap_or_default();
                (row.session_id, done, row.registration_token)
            }
            None => {
                let id = generate_token("uia");
                registration::insert_uia_session(conn, &id, owner, purpose.operation(), now_ms())
                    .await?;
                (id, Vec::new(), None)
            }
        };

        let mut failure = None;
        if let Some(auth) = auth {
            match self
                .run_stage(conn, auth, purpose, flows, token.as_deref())
                .await?
            {
                StageResult::Done => {
                    let stage = auth
                        .auth_type()
                        .map(|t| t.as_str().to_owned())
                        .unwrap_or_default();
                    if let AuthData::RegistrationToken(t) = auth {
                        if let Some(previous) = token.as_deref().filter(|p| *p != t.token) {
                            // The session switched tokens: the old reservation goes back.
                            registration::release_registration_token(conn, previous).await?;
                        }
                        token = Some(t.token.clone());
                    }
                    if !done.contains(&stage) {
                        done.push(stage);
                    }
                    registration::update_uia_session(
                        conn,
                        &session_id,
                        &json!(done),
                        token.as_deref(),
                    )
                    .await?;
                }
                StageResult::Failed(err) => failure = Some(err),
            }
        }
        let finished = flows
            .iter()
            .any(|flow| flow.iter().all(|stage| done.iter().any(|d| d == stage)));
        if finished && failure.is_none() {
            Ok(Ok(Completed {
                session_id,
                registration_token: token,
            }))
        } else {
            Ok(Err((session_id, done, failure)))
        }
    }

    /// Runs one stage; `reserved` is the registration token the session already holds a use of.
    async fn run_stage(
        &self,
        conn: &AsyncPgConnection,
        auth: &AuthData,
        purpose: Purpose<'_>,
        flows: &[Vec<&'static str>],
        reserved: Option<&str>,
    ) -> Result<StageResult> {
        let stage = auth
            .auth_type()
            .map(|t| t.as_str().to_owned())
            .unwrap_or_default();
        if !flows.iter().flatten().any(|s| *s == stage) {
            let err = Error::matrix(
                StatusCode::UNAUTHORIZED,
                "M_UNRECOGNIZED",
                format!("Unsupported stage {stage}"),
            );
            return Ok(StageResult::Failed(err));
        }
        Ok(match auth {
            AuthData::Dummy(_) => StageResult::Done,
            AuthData::Password(password) => {
                let Purpose::Account(user_id, _) = purpose else {
                    return Ok(StageResult::Failed(Error::forbidden(
                        "Password authentication needs an account",
                    )));
                };
                let same_user = match &password.identifier {
                    UserIdentifier::Matrix(id) => {
                        id.user == user_id.as_str() || id.user.to_lowercase() == user_id.localpart()
                    }
                    _ => false,
                };
                // Guessing with a stolen access token is limited like guessing at /login.
                self.rate_limit
                    .check_failures(Failure::UiaPassword, user_id)?;
                let hash = users::get_user(conn, user_id.as_str())
                    .await?
                    .and_then(|u| u.password_hash);
                let valid = match (same_user, hash) {
                    (true, Some(hash)) => {
                        passwords::verify_password(password.password.clone(), hash).await?
                    }
                    _ => false,
                };
                if valid {
                    StageResult::Done
                } else {
                    self.rate_limit
                        .record_failure(Failure::UiaPassword, user_id);
                    StageResult::Failed(Error::forbidden("Invalid username or password"))
                }
            }
            // Submitting the stage again in the same session keeps the one reservation.
            AuthData::RegistrationToken(t) if reserved == Some(t.token.as_str()) => {
                StageResult::Done
            }
            AuthData::RegistrationToken(t) => {
                if registration::reserve_registration_token(conn, &t.token, now_ms()).await? {
                    StageResult::Done
                } else {
                    let err = Error::matrix(
                        StatusCode::UNAUTHORIZED,
                        "M_UNAUTHORIZED",
                        "Invalid registration token",
                    );
                    StageResult::Failed(err)
                }
            }
            _ => StageResult::Failed(Error::matrix(
                StatusCode::UNAUTHORIZED,
                "M_UNRECOGNIZED",
                "Unsupported stage",
            )),
        })
    }

    /// Consumes a completed session inside the protected operation's transaction.
    pub async fn finish(&self, conn: &AsyncPgConnection, completed: &Completed) -> Result<()> {
        if registration::get_uia_session_for_update(conn, &completed.session_id)
            .await?
            .is_none()
        {
            return Err(Error::forbidden(
                "This authentication session was already used",
            ));
        }
        registration::delete_uia_session(conn, &completed.session_id).await?;
        if let Some(token) = &completed.registration_token {
            registration::complete_registration_token(conn, token).await?;
        }
        Ok(())
    }
}

impl Uia {
    /// Gives back the registration-token use a completed session reserved, after the
    /// registration it authenticated failed. The session stays, without its token stage, so
    /// the client can submit the token again and retry.
    pub async fn release_token(&self, completed: &Completed) -> Result<()> {
        if completed.registration_token.is_none() {
            return Ok(());
        }
        let mut conn = self.db.conn().await?;
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            let Some(row) =
                registration::get_uia_session_for_update(conn, &completed.session_id).await?
            else {
                // Consumed or swept: its use was completed or released there.
                return Ok(());
            };
            let Some(token) = row.registration_token else {
                return Ok(());
            };
            let done: Vec<String> = serde_json::from_value::<Vec<String>>(row.completed_stages)
                .unwrap_or_default()
                .into_iter()
                .filter(|stage: &String| stage != REGISTRATION_TOKEN)
                .collect();
            registration::update_uia_session(conn, &completed.session_id, &json!(done), None)
                .await?;
            registration::release_registration_token(conn, &token)
                .await
                .map_err(Error::from)
        })
        .await
    }

    /// Deletes expired sessions and releases the registration-token uses they held; runs at
    /// most once per [`SWEEP_INTERVAL_MS`] per process.
    async fn sweep_expired(&self) -> Result<()> {
        let now = now_ms();
        let last = self.last_sweep_ms.load(Ordering::Relaxed);
        if now - last < SWEEP_INTERVAL_MS
            || self
                .last_sweep_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return Ok(());
        }
        let mut conn = self.db.conn().await?;
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            let tokens =
                registration::delete_expired_uia_sessions(conn, now - SESSION_LIFETIME_MS).await?;
            for token in tokens {
                registration::release_registration_token(conn, &token).await?;
            }
            Ok(())
        })
        .await
    }
}

fn uia_error(
    flows: &[Vec<&'static str>],
    session: &str,
    completed: &[String],
    failure: Option<Error>,
) -> Error {
    let mut body = json!({
        "flows": flows.iter().map(|stages| json!({ "stages": stages })).collect::<Vec<_>>(),
        "params": {},
        "session": session,
        "completed": completed,
    });
    if let Some(Error::Matrix {
        errcode, message, ..
    }) = failure
    {
        body["errcode"] = Value::from(errcode);
        body["error"] = Value::from(message);
    }
    Error::Uia(body)
}
