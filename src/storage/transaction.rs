//! A transaction whose `BEGIN` travels with its first statements, and whose notifications
//! travel with its `COMMIT`.
//!
//! Diesel's `transaction` sends `BEGIN` alone and waits for it: one round trip that carries
//! nothing else. Here `BEGIN` is the first request of the body's first pipeline, so a send
//! (whose first pipeline takes the room's lock and reads its state) saves that round trip.
//! Every transaction of the server is one of these.
//!
//! A `NOTIFY` inside a transaction makes its commit take a lock that every notifying commit of
//! the cluster shares, held until the commit is on the disk: such commits reach the disk one
//! at a time instead of together. So the notifications the body asks for
//! ([`super::rooms::notify`]) are sent right after the `COMMIT`, in its round trip, as a
//! statement of their own: a transaction that wrote nothing else, whose commit does not wait
//! for the disk.

use std::cell::RefCell;

use diesel::connection::TransactionDepthChange;
use diesel_async::{
    AnsiTransactionManager, AsyncPgConnection, SimpleAsyncConnection, TransactionManager,
};

use crate::error::{Error, Result};

/// Notifications asked for inside a body of [`transaction`], as (channel, payload).
type Pending = RefCell<Vec<(String, String)>>;

tokio::task_local! {
    static AFTER_COMMIT: Pending;
}

/// Keeps a notification for after the commit of the [`transaction`] this task is in; `false`
/// when it is in none, and the caller sends it.
pub(super) fn defer_notification(channel: &str, payload: &str) -> bool {
    AFTER_COMMIT
        .try_with(|pending| {
            let mut pending = pending.borrow_mut();
            let notification = (channel.to_owned(), payload.to_owned());
            if !pending.contains(&notification) {
                pending.push(notification);
            }
        })
        .is_ok()
}

/// Runs `body` in one transaction: commits when it succeeds, rolls back when it fails. The
/// notifications the body asks for are sent once it has committed, and only then. Every
/// transaction of the server goes through here; there are no nested ones (the body's
/// connection is shared, so it cannot begin another).
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
    run(conn, "BEGIN", body).await
}

/// A [`transaction`] that appends events to a room: its statements are planned once per
/// connection and the plan kept, instead of planned again at every call.
///
/// PostgreSQL plans a prepared statement afresh for each call's values until a plan made
/// without them is estimated no costlier. A statement that takes its keys as an array never
/// gets there: without the values it guesses ten elements, dearer than any real call's one
/// to five. So the room state's lookup, the push rules' audience and the push actions' insert
/// were planned at every send, 0.15 to 0.2 ms each, about as long as running them. The
/// write path's statements are lookups by key whose plan cannot differ with the values (each
/// key looked up through `LATERAL` with `LIMIT 1`), so a plan made once fits every call. Not
/// the server's default: a sync's unread counts, planned once from the statistics of a
/// skewed server, averaged 55 ms against 7. Nor yet federation's incoming events', whose
/// transactions also run state resolution's reads.
pub async fn room_write<T>(
    conn: &mut AsyncPgConnection,
    body: impl AsyncFnOnce(&AsyncPgConnection) -> Result<T>,
) -> Result<T> {
    run(
        conn,
        "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan",
        body,
    )
    .await
}

/// [`transaction`], beginning with `begin` (`BEGIN` and settings local to the transaction).
async fn run<T>(
    conn: &mut AsyncPgConnection,
    begin: &str,
    body: impl AsyncFnOnce(&AsyncPgConnection) -> Result<T>,
) -> Result<T> {
    let state = AnsiTransactionManager::transaction_manager_status_mut(conn).transaction_state()?;
    // `BEGIN` inside a transaction would be ignored and the `COMMIT` below end the outer one.
    if state.transaction_depth().is_some() {
        return Err(Error::internal("a transaction begun inside another"));
    }
    state.change_transaction_depth(TransactionDepthChange::IncreaseDepth)?;
    let (began, (result, notifications)) = {
        let shared: &AsyncPgConnection = conn;
        let mut begin_conn = shared;
        // `join!` polls in order, so `BEGIN` is on the wire before the body's first statement.
        tokio::join!(
            begin_conn.batch_execute(begin),
            AFTER_COMMIT.scope(Pending::default(), async {
                let result = body(shared).await;
                (result, AFTER_COMMIT.with(Pending::take))
            })
        )
    };
    // The body's error first: a `BEGIN` that failed failed the body's statements too.
    match result.and_then(|value| began.map(|()| value).map_err(Error::from)) {
        Ok(value) => {
            commit_then_notify(conn, &notifications).await?;
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

/// `COMMIT`, and in the same round trip the notifications, which go out after it and so run
/// as a transaction of their own. A notification that fails once the commit succeeded is
/// logged, not returned: what it announces is stored.
async fn commit_then_notify(
    conn: &mut AsyncPgConnection,
    notifications: &[(String, String)],
) -> Result<()> {
    if notifications.is_empty() {
        AnsiTransactionManager::commit_transaction(conn).await?;
        return Ok(());
    }
    // Until the `COMMIT` has answered, the transaction manager still counts the connection as
    // inside the transaction: dropped before that, it is discarded by the pool.
    let (committed, notified) = {
        let shared: &AsyncPgConnection = conn;
        let mut commit_conn = shared;
        tokio::join!(
            commit_conn.batch_execute("COMMIT"),
            super::rooms::notify_all(shared, notifications)
        )
    };
    match committed {
        Ok(()) => {
            match AnsiTransactionManager::transaction_manager_status_mut(conn)
                .transaction_state()?
                .change_transaction_depth(TransactionDepthChange::DecreaseDepth)
            {
                // As diesel's own commit: the connection may have seen the transaction end.
                Ok(()) | Err(diesel::result::Error::NotInTransaction) => {}
                Err(err) => return Err(err.into()),
            }
            if let Err(err) = notified {
                tracing::warn!("notifications after a commit: {err}");
            }
            Ok(())
        }
        Err(err) => {
            // PostgreSQL ends a transaction whose `COMMIT` failed; the rollback brings the
            // transaction manager back to no transaction (or breaks it, and the pool then
            // discards the connection).
            let _ = AnsiTransactionManager::rollback_transaction(conn).await;
            Err(err.into())
        }
    }
}
