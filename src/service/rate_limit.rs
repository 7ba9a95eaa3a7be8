//! Token-bucket rate limits keyed by action and by IP address or user.

use std::{num::NonZeroUsize, sync::Mutex, time::Instant};

use lru::LruCache;

use crate::{
    config::{Config, RateLimit},
    error::{Error, Result},
};

/// What is being limited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// `POST /login`, per IP and per account.
    Login,
    /// `POST /register`, per IP.
    Registration,
}

struct Bucket {
    tokens: f64,
    updated: Instant,
}

/// Rate limiter; a bounded LRU keeps memory flat under a flood of distinct keys.
pub struct RateLimiter {
    enabled: bool,
    login: RateLimit,
    registration: RateLimit,
    buckets: Mutex<LruCache<(Action, String), Bucket>>,
}

impl RateLimiter {
    /// Builds the limiter from the configuration.
    pub fn new(config: &Config) -> Self {
        RateLimiter {
            enabled: config.rate_limits_enabled,
            login: config.rate_limit_login,
            registration: config.rate_limit_registration,
            buckets: Mutex::new(LruCache::new(NonZeroUsize::new(100_000).expect("non-zero"))),
        }
    }

    /// Takes one token from the bucket of `(action, key)` or fails with `M_LIMIT_EXCEEDED`.
    pub fn check(&self, action: Action, key: &str) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        let limit = match action {
            Action::Login => self.login,
            Action::Registration => self.registration,
        };
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let bucket = buckets.get_or_insert_mut((action, key.to_owned()), || Bucket {
            tokens: limit.burst,
            updated: now,
        });
        let elapsed = now.duration_since(bucket.updated).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * limit.per_second).min(limit.burst);
        bucket.updated = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            let wait_ms = ((1.0 - bucket.tokens) / limit.per_second * 1000.0).ceil() as u64;
            Err(Error::limit_exceeded(wait_ms))
        }
    }
}
