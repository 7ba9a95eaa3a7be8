//! Token-bucket rate limits: requests per client IP address, failed password attempts per
//! account, and the events a user's client sends (Synapse's `rc_message`).
//!
//! Each kind lives in its own LRU, so a flood of requests from many (or forged) addresses
//! cannot evict the per-account buckets and reset an account's failure count.

use std::{hash::Hash, net::IpAddr, num::NonZeroUsize, sync::Mutex, time::Instant};

use lru::LruCache;
use ruma::UserId;

use crate::{
    config::{Config, RateLimit},
    error::{Error, Result},
};

/// Buckets kept per kind; the least recently used one is dropped beyond this.
const MAX_BUCKETS: usize = 100_000;

/// What is being limited per client IP address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// `POST /login`.
    Login,
    /// `POST /register` and the registration probes.
    Registration,
}

/// Which failed password attempts are being limited per account.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Failure {
    /// A wrong password at `POST /login`.
    Login,
    /// A wrong password in an `m.login.password` UIA stage.
    UiaPassword,
}

struct Bucket {
    tokens: f64,
    updated: Instant,
}

/// A bounded LRU of token buckets.
struct Buckets<K: Hash + Eq>(Mutex<LruCache<K, Bucket>>);

impl<K: Hash + Eq> Buckets<K> {
    fn new() -> Self {
        Buckets(Mutex::new(LruCache::new(
            NonZeroUsize::new(MAX_BUCKETS).expect("non-zero"),
        )))
    }

    /// Refills the bucket of `key`, then takes a token if `spend`; fails when less than one
    /// token is left (before spending).
    fn take(&self, key: K, limit: RateLimit, spend: bool) -> Result<()> {
        let now = Instant::now();
        let mut buckets = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let bucket = buckets.get_or_insert_mut(key, || Bucket {
            tokens: limit.burst,
            updated: now,
        });
        let elapsed = now.duration_since(bucket.updated).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * limit.per_second).min(limit.burst);
        bucket.updated = now;
        if bucket.tokens >= 1.0 {
            if spend {
                bucket.tokens -= 1.0;
            }
            Ok(())
        } else {
            let wait_ms = ((1.0 - bucket.tokens) / limit.per_second * 1000.0).ceil() as u64;
            Err(Error::limit_exceeded(wait_ms))
        }
    }
}

/// A user's own message rate, set through the admin API's `override_ratelimit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageOverride {
    /// Events per second; 0 lifts the limit altogether (as in Synapse).
    pub messages_per_second: i64,
    /// Events at once.
    pub burst_count: i64,
}

/// Rate limiter; bounded LRUs keep memory flat under a flood of distinct keys.
pub struct RateLimiter {
    enabled: bool,
    login: RateLimit,
    registration: RateLimit,
    message: RateLimit,
    by_ip: Buckets<(Action, IpAddr)>,
    by_account: Buckets<(Failure, String)>,
    by_sender: Buckets<String>,
}

impl RateLimiter {
    /// Builds the limiter from the configuration.
    pub fn new(config: &Config) -> Self {
        RateLimiter {
            enabled: config.rate_limits_enabled,
            login: config.rate_limit_login,
            registration: config.rate_limit_registration,
            message: config.rate_limit_message,
            by_ip: Buckets::new(),
            by_account: Buckets::new(),
            by_sender: Buckets::new(),
        }
    }

    /// Whether limits are enforced at all (`MYELIN_RATE_LIMITS`).
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Takes one token from the sender's message bucket or fails with `M_LIMIT_EXCEEDED`:
    /// the configured rate, or the user's override (0 messages per second: unlimited).
    pub fn check_message(&self, user_id: &UserId, limit: Option<MessageOverride>) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        let limit = match limit {
            Some(o) if o.messages_per_second <= 0 => return Ok(()),
            Some(o) => RateLimit {
                per_second: o.messages_per_second as f64,
                burst: o.burst_count.max(0) as f64,
            },
            None => self.message,
        };
        self.by_sender.take(user_id.to_string(), limit, true)
    }

    /// Takes one token from the bucket of `(action, ip)` or fails with `M_LIMIT_EXCEEDED`.
    pub fn check(&self, action: Action, ip: IpAddr) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        let limit = match action {
            Action::Login => self.login,
            Action::Registration => self.registration,
        };
        self.by_ip.take((action, ip), limit, true)
    }

    /// Fails with `M_LIMIT_EXCEEDED` while `user_id` has used up its failed attempts of this
    /// kind; takes nothing, so only [`record_failure`](Self::record_failure) spends.
    pub fn check_failures(&self, kind: Failure, user_id: &UserId) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        self.by_account
            .take((kind, user_id.to_string()), self.login, false)
    }

    /// Counts one failed password attempt against `user_id`.
    pub fn record_failure(&self, kind: Failure, user_id: &UserId) {
        if self.enabled {
            // An empty bucket stays empty; the next check refuses.
            let _ = self
                .by_account
                .take((kind, user_id.to_string()), self.login, true);
        }
    }

    /// Runs a password check for `user_id`: refused while its failures are used up, and a
    /// failure (`M_FORBIDDEN`) is counted.
    pub async fn guard_password<T>(
        &self,
        kind: Failure,
        user_id: &UserId,
        check: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        self.check_failures(kind, user_id)?;
        let result = check.await;
        if matches!(
            &result,
            Err(Error::Matrix {
                errcode: "M_FORBIDDEN",
                ..
            })
        ) {
            self.record_failure(kind, user_id);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::HashMap, net::Ipv4Addr};

    use super::*;

    #[test]
    fn messages_are_limited_after_the_burst_unless_overridden() {
        let config = Config::load_from(None, HashMap::new()).unwrap();
        let limiter = RateLimiter::new(&config);
        let user = UserId::parse("@chatty:localhost").unwrap();
        for _ in 0..10 {
            limiter.check_message(&user, None).unwrap();
        }
        assert!(limiter.check_message(&user, None).is_err());
        let unlimited = MessageOverride {
            messages_per_second: 0,
            burst_count: 0,
        };
        for _ in 0..100 {
            limiter.check_message(&user, Some(unlimited)).unwrap();
        }
    }

    #[test]
    fn a_flood_of_addresses_does_not_evict_account_buckets() {
        let config = Config::load_from(None, HashMap::new()).unwrap();
        let limiter = RateLimiter::new(&config);
        let user = UserId::parse("@victim:localhost").unwrap();
        for _ in 0..3 {
            limiter.record_failure(Failure::Login, &user);
        }
        assert!(limiter.check_failures(Failure::Login, &user).is_err());
        for n in 0..=MAX_BUCKETS as u32 {
            let _ = limiter.check(Action::Login, IpAddr::V4(Ipv4Addr::from(n)));
        }
        assert!(
            limiter.check_failures(Failure::Login, &user).is_err(),
            "the account's failures were forgotten"
        );
    }
}
