//! Access and refresh tokens: issuing, resolving (with an LRU cache) and revoking.
//!
//! Tokens are 256 random bits; only their SHA-256 is stored. Revocation removes the hash
//! from the cache in the same call that deletes it from the database, so a logged-out token
//! stops working at once in this process; a `NOTIFY` tells the other server processes to
//! drop it too. Cached entries also expire after [`CACHE_TTL`], which bounds the damage if
//! that notification is lost.

use std::{
    num::NonZeroUsize,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine};
use lru::LruCache;
use rand::RngCore;
use ruma::{OwnedDeviceId, OwnedUserId};
use sha2::{Digest, Sha256};

use super::appservice::Registration;
use crate::{
    config::Config,
    error::{Error, Result},
    storage::{devices, now_ms, Db},
};

/// How long a cached token lookup is trusted before the database is asked again.
pub const CACHE_TTL: Duration = Duration::from_secs(10);

/// The authenticated caller of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The user.
    pub user_id: OwnedUserId,
    /// The device the token belongs to. An application service acting without
    /// `?device_id=` gets a stand-in (see `has_device`).
    pub device_id: OwnedDeviceId,
    /// Whether `device_id` is a real device (false for an appservice acting without one).
    pub has_device: bool,
    /// The application service making the request (its `as_token` authenticated it).
    pub appservice: Option<Arc<Registration>>,
    /// Whether the user is a server administrator.
    pub is_admin: bool,
    /// Whether the user is shadow-banned: what they send that others would see (typing,
    /// receipts, presence, to-device) is accepted and dropped. Known as of the token lookup;
    /// a change drops the user's cached lookups in every process.
    pub shadow_banned: bool,
}

/// Freshly issued tokens for a device.
#[derive(Debug, Clone)]
pub struct IssuedTokens {
    /// The access token.
    pub access_token: String,
    /// The refresh token, when one was asked for.
    pub refresh_token: Option<String>,
    /// Lifetime of the access token, when it expires.
    pub expires_in_ms: Option<u64>,
}

type TokenHash = [u8; 32];

struct CachedOwner {
    owner: devices::TokenOwner,
    fetched: Instant,
}

/// Token issuing and lookup.
pub struct Sessions {
    db: Db,
    config: Arc<Config>,
    cache: Mutex<LruCache<TokenHash, CachedOwner>>,
    /// Counts evictions (revocations, changed users): a lookup that read the database before
    /// one of them is not cached, lest it put back what was just evicted.
    evictions: AtomicU64,
}

/// Generates a new random token with a readable prefix.
pub fn generate_token(prefix: &str) -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("{prefix}_{}", URL_SAFE_NO_PAD.encode(bytes))
}

/// SHA-256 of a token: the only form in which tokens are stored.
pub fn hash_token(token: &str) -> TokenHash {
    Sha256::digest(token.as_bytes()).into()
}

impl Sessions {
    /// Creates the service with an empty cache.
    pub fn new(db: Db, config: Arc<Config>) -> Self {
        Sessions {
            db,
            config,
            cache: Mutex::new(LruCache::new(NonZeroUsize::new(10_000).expect("non-zero"))),
            evictions: AtomicU64::new(0),
        }
    }

    /// Issues tokens for an existing device inside the caller's transaction.
    pub async fn issue_tokens(
        &self,
        conn: &diesel_async::AsyncPgConnection,
        user_id: &str,
        device_id: &str,
        refreshable: bool,
    ) -> Result<IssuedTokens> {
        let now = now_ms();
        let access_token = generate_token("myl");
        let (refresh_token, refresh_hash, expires_in_ms) = if refreshable {
            let token = generate_token("mylr");
            let hash = hash_token(&token);
            devices::insert_refresh_token(conn, &hash, user_id, device_id, now).await?;
            (
                Some(token),
                Some(hash),
                Some(self.config.refreshable_access_token_lifetime_ms),
            )
        } else {
            (None, None, None)
        };
        let expires_ts = expires_in_ms.map(|ms| now + ms as i64);
        devices::insert_access_token(
            conn,
            &hash_token(&access_token),
            user_id,
            device_id,
            expires_ts,
            refresh_hash.as_ref().map(|h| h.as_slice()),
            now,
        )
        .await?;
        Ok(IssuedTokens {
            access_token,
            refresh_token,
            expires_in_ms,
        })
    }

    /// Resolves an access token to its caller, or fails with `M_UNKNOWN_TOKEN`.
    /// A database lookup (at most once per [`CACHE_TTL`] per token) also records device use.
    pub async fn authenticate(&self, token: &str, ip: Option<&str>) -> Result<Caller> {
        let hash = hash_token(token);
        let cached = {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            match cache.get(&hash) {
                Some(entry) if entry.fetched.elapsed() < CACHE_TTL => Some(entry.owner.clone()),
                Some(_) => {
                    cache.pop(&hash);
                    None
                }
                None => None,
            }
        };
        crate::metrics::metrics().cache("access_tokens", cached.is_some());
        let owner = match cached {
            Some(owner) => owner,
            None => {
                let evictions_before = self.evictions.load(Ordering::SeqCst);
                let conn = self.db.conn().await?;
                let owner = devices::get_token_owner(&conn, &hash)
                    .await?
                    .ok_or(Error::unknown_token(false))?;
                devices::touch_device(&conn, &owner.user_id, &owner.device_id, now_ms(), ip)
                    .await?;
                let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
                // Evictions take the cache lock too: none can slip between this check and the put.
                if self.evictions.load(Ordering::SeqCst) == evictions_before {
                    cache.put(
                        hash,
                        CachedOwner {
                            owner: owner.clone(),
                            fetched: Instant::now(),
                        },
                    );
                }
                owner
            }
        };
        if owner.expires_ts.is_some_and(|expiry| expiry <= now_ms()) {
            return Err(Error::unknown_token(true));
        }
        Ok(Caller {
            user_id: OwnedUserId::try_from(owner.user_id).map_err(Error::internal)?,
            device_id: owner.device_id.into(),
            has_device: true,
            appservice: None,
            is_admin: owner.is_admin,
            shadow_banned: owner.shadow_banned,
        })
    }

    /// Forgets cached lookups of tokens that were just deleted from the database, here and
    /// (through `NOTIFY`) in every other server process sharing the database.
    pub fn forget_cached(&self, hashes: &[Vec<u8>]) {
        let hex: Vec<String> = hashes
            .iter()
            .map(|h| h.iter().map(|b| format!("{b:02x}")).collect())
            .collect();
        self.forget_cached_hex(&hex);
        self.announce(hex);
    }

    /// Forgets every cached lookup of one user's tokens, here and in the other processes, so
    /// that a change to what a lookup says of them (admin flag, shadow ban) applies at once.
    pub fn forget_user(&self, user_id: &str) {
        self.forget_cached_hex(&[user_id.to_owned()]);
        self.announce(vec![user_id.to_owned()]);
    }

    /// Tells the other server processes to forget these cache entries ([`Self::forget_cached_hex`]).
    fn announce(&self, entries: Vec<String>) {
        if entries.is_empty() {
            return;
        }
        let db = self.db.clone();
        tokio::spawn(async move {
            let result = async {
                let conn = db.conn().await?;
                // NOTIFY payloads are limited to 8000 bytes: 100 hashes of 64 characters fit.
                for chunk in entries.chunks(100) {
                    crate::storage::rooms::notify(
                        &conn,
                        super::notifier::TOKEN_CHANNEL,
                        &chunk.join(","),
                    )
                    .await?;
                }
                Ok::<_, Error>(())
            }
            .await;
            if let Err(err) = result {
                tracing::warn!("could not tell other processes about revoked tokens: {err}");
            }
        });
    }

    /// Forgets cached lookups by hex-encoded token hash (revocations announced by other
    /// processes), or all of a user's when an entry is a user ID (user IDs start with `@`,
    /// hex never does; user IDs hold no `,`, the separator).
    pub fn forget_cached_hex(&self, entries: &[String]) {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        self.evictions.fetch_add(1, Ordering::SeqCst);
        for entry in entries {
            if entry.starts_with('@') {
                let hashes: Vec<TokenHash> = cache
                    .iter()
                    .filter(|(_, cached)| cached.owner.user_id == *entry)
                    .map(|(hash, _)| *hash)
                    .collect();
                for hash in hashes {
                    cache.pop(&hash);
                }
                continue;
            }
            let bytes: Option<Vec<u8>> = (0..entry.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(entry.get(i..i + 2)?, 16).ok())
                .collect();
            if let Some(hash) = bytes.and_then(|b| TokenHash::try_from(b.as_slice()).ok()) {
                cache.pop(&hash);
            }
        }
    }

    /// Exchanges a refresh token for new tokens; the old pair stops working at once.
    pub async fn refresh(&self, refresh_token: &str) -> Result<IssuedTokens> {
        let hash = hash_token(refresh_token);
        let mut conn = self.db.conn().await?;
        let (issued, revoked) = crate::storage::transaction::transaction(&mut conn, async |conn| {
            let (user_id, device_id, revoked) = devices::take_refresh_token(conn, &hash)
                .await?
                .ok_or_else(|| Error::unknown_token(false))?;
            let issued = self.issue_tokens(conn, &user_id, &device_id, true).await?;
            Ok((issued, revoked))
        })
        .await?;
        self.forget_cached(&revoked);
        Ok(issued)
    }
}

/// How long an OpenID token is good for (as Synapse).
pub const OPENID_TOKEN_LIFETIME: Duration = Duration::from_secs(3600);

impl Sessions {
    /// A new OpenID token for `user_id`, good for [`OPENID_TOKEN_LIFETIME`]; only its hash is
    /// stored.
    pub async fn create_openid_token(&self, user_id: &ruma::UserId) -> Result<String> {
        let token = generate_token("oid");
        let now = now_ms();
        let conn = self.db.conn().await?;
        crate::storage::openid::insert_openid_token(
            &conn,
            &hash_token(&token),
            user_id.as_str(),
            now + OPENID_TOKEN_LIFETIME.as_millis() as i64,
            now,
        )
        .await?;
        Ok(token)
    }

    /// The user an OpenID token was issued to; 401 `M_UNKNOWN_TOKEN` when it is unknown or
    /// has expired.
    pub async fn openid_user(&self, token: &str) -> Result<OwnedUserId> {
        let unknown = || {
            Error::matrix(
                actix_web::http::StatusCode::UNAUTHORIZED,
                "M_UNKNOWN_TOKEN",
                "Unknown or expired OpenID token",
            )
        };
        let conn = self.db.conn().await?;
        let user = crate::storage::openid::get_openid_user(&conn, &hash_token(token), now_ms())
            .await?
            .ok_or_else(unknown)?;
        OwnedUserId::try_from(user).map_err(Error::internal)
    }
}
