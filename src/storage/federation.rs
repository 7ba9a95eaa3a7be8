//! Federation storage: other servers' signing keys.

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::schema::remote_server_keys;

/// One of another server's signing keys, as cached.
#[derive(Debug, Clone, Queryable)]
pub struct RemoteKey {
    /// `ed25519:abc`.
    pub key_id: String,
    /// Unpadded base64.
    pub public_key: String,
    /// Until when the server says the key may be used.
    pub valid_until_ts: i64,
    /// When the server retired it, if it has.
    pub expired_ts: Option<i64>,
}

/// Every cached key of `server`.
pub async fn get_server_keys(
    mut conn: &AsyncPgConnection,
    server: &str,
) -> QueryResult<Vec<RemoteKey>> {
    remote_server_keys::table
        .filter(remote_server_keys::server_name.eq(server))
        .select((
            remote_server_keys::key_id,
            remote_server_keys::public_key,
            remote_server_keys::valid_until_ts,
            remote_server_keys::expired_ts,
        ))
        .load(&mut conn)
        .await
}

/// Stores keys just fetched from `server`. A key's validity only ever grows (an older answer
/// arriving late must not shorten it), and a retirement, once known, is kept.
pub async fn store_server_keys(
    mut conn: &AsyncPgConnection,
    server: &str,
    keys: &[RemoteKey],
    now: i64,
) -> QueryResult<()> {
    use diesel::upsert::excluded;
    let rows: Vec<_> = keys
        .iter()
        .map(|k| {
            (
                remote_server_keys::server_name.eq(server),
                remote_server_keys::key_id.eq(&k.key_id),
                remote_server_keys::public_key.eq(&k.public_key),
                remote_server_keys::valid_until_ts.eq(k.valid_until_ts),
                remote_server_keys::expired_ts.eq(k.expired_ts),
                remote_server_keys::fetched_ts.eq(now),
            )
        })
        .collect();
    diesel::insert_into(remote_server_keys::table)
        .values(rows)
        .on_conflict((remote_server_keys::server_name, remote_server_keys::key_id))
        .do_update()
        .set((
            remote_server_keys::public_key.eq(excluded(remote_server_keys::public_key)),
            remote_server_keys::valid_until_ts.eq(diesel::dsl::sql::<diesel::sql_types::Int8>(
                "GREATEST(remote_server_keys.valid_until_ts, excluded.valid_until_ts)",
            )),
            remote_server_keys::expired_ts.eq(diesel::dsl::sql::<
                diesel::sql_types::Nullable<diesel::sql_types::Int8>,
            >(
                "COALESCE(remote_server_keys.expired_ts, excluded.expired_ts)",
            )),
            remote_server_keys::fetched_ts.eq(excluded(remote_server_keys::fetched_ts)),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}
