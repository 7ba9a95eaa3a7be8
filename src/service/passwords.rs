//! Password hashing with argon2id, off the async executor.

use std::sync::LazyLock;

use argon2::{
    password_hash::{phc::PasswordHash, PasswordHasher, PasswordVerifier},
    Argon2,
};

use tokio::sync::Semaphore;

use crate::error::{Error, Result};

/// Hashes running at once. Each argon2id hash takes 19 MiB; without a bound a burst of logins
/// or registrations would take that much per request, so a burst queues here instead of
/// swelling memory (the buffer goes back to the system when freed: see
/// [`crate::allocator`]).
static HASHING: LazyLock<Semaphore> = LazyLock::new(|| {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    Semaphore::new(cores.clamp(1, 4))
});

/// Hashes a password into a PHC string (argon2id, random salt).
pub async fn hash_password(password: String) -> Result<String> {
    let _permit = HASHING.acquire().await.map_err(Error::internal)?;
    tokio::task::spawn_blocking(move || {
        Argon2::default()
            .hash_password(password.as_bytes())
            .map(|hash| hash.to_string())
            .map_err(Error::internal)
    })
    .await
    .map_err(Error::internal)?
}

/// Checks a password against a stored PHC string; a malformed hash never matches.
pub async fn verify_password(password: String, phc: String) -> Result<bool> {
    let _permit = HASHING.acquire().await.map_err(Error::internal)?;
    tokio::task::spawn_blocking(move || {
        let Ok(hash) = PasswordHash::new(&phc) else {
            return false;
        };
        Argon2::default()
            .verify_password(password.as_bytes(), &hash)
            .is_ok()
    })
    .await
    .map_err(Error::internal)
}
