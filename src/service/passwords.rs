//! Password hashing with argon2id, off the async executor.

use argon2::{
    password_hash::{phc::PasswordHash, PasswordHasher, PasswordVerifier},
    Argon2,
};

use crate::error::{Error, Result};

/// Hashes a password into a PHC string (argon2id, random salt).
pub async fn hash_password(password: String) -> Result<String> {
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
