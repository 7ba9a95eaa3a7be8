//! OpenID tokens: what `/openid/userinfo` checks.

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::schema::openid_tokens;

/// Stores a token's hash for `user_id` until `expires_ts`, dropping expired tokens on the way.
pub async fn insert_openid_token(
    mut conn: &AsyncPgConnection,
    token_hash: &[u8],
    user_id: &str,
    expires_ts: i64,
    now: i64,
) -> QueryResult<()> {
    diesel::delete(openid_tokens::table.filter(openid_tokens::expires_ts.le(now)))
        .execute(&mut conn)
        .await?;
    diesel::insert_into(openid_tokens::table)
        .values((
            openid_tokens::token_hash.eq(token_hash),
            openid_tokens::user_id.eq(user_id),
            openid_tokens::expires_ts.eq(expires_ts),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// The user a token was issued to, while it has not expired.
pub async fn get_openid_user(
    mut conn: &AsyncPgConnection,
    token_hash: &[u8],
    now: i64,
) -> QueryResult<Option<String>> {
    openid_tokens::table
        .find(token_hash)
        .filter(openid_tokens::expires_ts.gt(now))
        .select(openid_tokens::user_id)
        .first(&mut conn)
        .await
        .optional()
}
