//! A transaction whose `BEGIN` travels with its first statements.
//!
//! Diesel's `transaction` sends `BEGIN` alone and waits for it: one round trip that carries
//! nothing else. Here `BEGIN` is the first request of the body's first pipeline, so a send
//! (whose first pipeline takes the room's lock and reads its state) saves that round trip.

use diesel::connection::TransactionDepthChange;
use diesel_async::{
    AnsiTransactionManager, AsyncPgConnection, SimpleAsyncConnection, TransactionManager,
};

use crate::error::{Error, Result};

/// Runs `body` in one transaction: commits when it succeeds, rolls back when it fails.
///
/// The body's statements must go out on the connection it is given, concurrently polled
/// futures included: `BEGIN` is sent first, so every one of them lands inside the
/// transaction. The connection counts as inside a transaction from before `BEGIN` is sent:
/// a future dropped half-way (a client gone) never hands an open transaction back to the pool,
/// which discards such connections.
pub async fn transaction<T>(
    conn: &mut AsyncPgConnection,
    body: impl AsyncFnOnce(&AsyncPgConnection) -> Result<T>,
) -> Result<T> {
    AnsiTransactionManager::transaction_manager_status_mut(conn)
        .transaction_state()?
        .change_transaction_depth(TransactionDepthChange::IncreaseDepth)?;
    let (began, result) = {
        let shared: &AsyncPgConnection = conn;
        let mut begin_conn = shared;
        // `join!` polls in order, so `BEGIN` is on the wire before the body's first statement.
        tokio::join!(begin_conn.batch_execute("BEGIN"), body(shared))
    };
    // The body's error first: a `BEGIN` that failed failed the body's statements too.
    match result.and_then(|value| began.map(|()| value).map_err(Error::from)) {
        Ok(value) => {
            AnsiTransactionManager::commit_transaction(conn).await?;
            Ok(value)
        }
        Err(err) => {
            // A failed rollback leaves the transaction manager broken, and the pool then
            // discards the connection: the body's error is the one worth reporting.
            let _ = AnsiTransactionManager::rollback_transaction(conn).await;
            Err(err)
        }
    }
}
