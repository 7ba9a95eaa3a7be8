//! Transactions received from other servers: the answers given (for replays) and the
//! to-device message IDs seen (for duplicates sent in new transactions).

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::Value;

use super::schema::{federation_received_to_device, federation_received_txns};

/// Records `(origin, txn_id)` with its answer; false when it is already recorded. Inside a
/// transaction, a concurrent insert of the same key waits until the other one commits (then
/// false) or rolls back (then true): the effects of one transaction apply once.
pub async fn claim_txn(
    mut conn: &AsyncPgConnection,
    origin: &str,
    txn_id: &str,
    response: &Value,
    now: i64,
) -> QueryResult<bool> {
    diesel::insert_into(federation_received_txns::table)
        .values((
            federation_received_txns::origin.eq(origin),
            federation_received_txns::txn_id.eq(txn_id),
            federation_received_txns::response.eq(response),
            federation_received_txns::received_ts.eq(now),
        ))
        .on_conflict_do_nothing()
        .execute(&mut conn)
        .await
        .map(|n| n == 1)
}

/// The answer given to `(origin, txn_id)`.
pub async fn get_txn_response(
    mut conn: &AsyncPgConnection,
    origin: &str,
    txn_id: &str,
) -> QueryResult<Option<Value>> {
    federation_received_txns::table
        .find((origin, txn_id))
        .select(federation_received_txns::response)
        .first(&mut conn)
        .await
        .optional()
}

/// Records a to-device `message_id` from `origin`; false when it was seen before.
pub async fn claim_to_device_message(
    mut conn: &AsyncPgConnection,
    origin: &str,
    message_id: &str,
    now: i64,
) -> QueryResult<bool> {
    diesel::insert_into(federation_received_to_device::table)
        .values((
            federation_received_to_device::origin.eq(origin),
            federation_received_to_device::message_id.eq(message_id),
            federation_received_to_device::received_ts.eq(now),
        ))
        .on_conflict_do_nothing()
        .execute(&mut conn)
        .await
        .map(|n| n == 1)
}

/// Forgets transactions and message IDs received before `before`.
pub async fn delete_received_before(mut conn: &AsyncPgConnection, before: i64) -> QueryResult<()> {
    diesel::delete(
        federation_received_txns::table.filter(federation_received_txns::received_ts.lt(before)),
    )
    .execute(&mut conn)
    .await?;
    diesel::delete(
        federation_received_to_device::table
            .filter(federation_received_to_device::received_ts.lt(before)),
    )
    .execute(&mut conn)
    .await
    .map(drop)
}
