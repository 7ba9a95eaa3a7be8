//! `storage::transaction`: the transaction whose `BEGIN` goes out with the body's first
//! statements (every send runs in one). Its statements must land inside it, a failure must
//! leave nothing, and a body dropped half-way must not hand an open transaction to the pool.
//! The notifications its body asks for go out after its `COMMIT`, and only when it commits.

use std::time::Duration;

use diesel::{
    sql_types::{BigInt, Text},
    QueryableByName,
};
use diesel_async::{
    AnsiTransactionManager, AsyncConnection, AsyncPgConnection, RunQueryDsl, TransactionManager,
};
use futures_util::StreamExt;
use myelin::{
    error::Error,
    storage::{
        rooms::{get_current_state_events, notify},
        transaction::{room_write, transaction},
    },
};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio_postgres::{AsyncMessage, NoTls};

use crate::support::TestDb;

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

async fn rows(conn: &mut AsyncPgConnection) -> i64 {
    let count: Count = diesel::sql_query("SELECT count(*) AS n FROM probe")
        .get_result(conn)
        .await
        .unwrap();
    count.n
}

/// What the pool looks at when a connection comes back: inside a transaction, it is dropped.
fn depth(conn: &mut AsyncPgConnection) -> Option<u32> {
    AnsiTransactionManager::transaction_manager_status_mut(conn)
        .transaction_depth()
        .unwrap()
        .map(|depth| depth.get())
}

async fn insert(mut conn: &AsyncPgConnection, n: i64) -> diesel::QueryResult<usize> {
    diesel::sql_query("INSERT INTO probe (n) VALUES ($1)")
        .bind::<BigInt, _>(n)
        .execute(&mut conn)
        .await
}

/// A fresh database with an empty `probe` table, and a connection to it.
async fn probe_database() -> (TestDb, AsyncPgConnection) {
    let db = TestDb::new().await;
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    diesel::sql_query("CREATE TABLE probe (n BIGINT NOT NULL UNIQUE)")
        .execute(&mut conn)
        .await
        .unwrap();
    (db, conn)
}

#[tokio::test]
async fn statements_commit_together_roll_back_together_and_a_dropped_body_is_never_reused() {
    let (db, mut conn) = probe_database().await;

    // Two statements in one pipeline with `BEGIN`: both are committed.
    let value = transaction(&mut conn, async |conn| {
        let (a, b) = tokio::try_join!(insert(conn, 1), insert(conn, 2))?;
        Ok(a + b)
    })
    .await
    .unwrap();
    assert_eq!(value, 2);
    assert_eq!(rows(&mut conn).await, 2);
    assert_eq!(depth(&mut conn), None, "committed: out of the transaction");

    // The first statement succeeds and the second fails (a duplicate): neither stays. Had
    // `BEGIN` gone out after the first statement, it would have been committed on its own.
    let failed = transaction(&mut conn, async |conn| {
        tokio::try_join!(insert(conn, 3), insert(conn, 1))?;
        Ok(())
    })
    .await;
    assert!(failed.is_err());
    assert_eq!(
        rows(&mut conn).await,
        2,
        "the failed transaction left a row"
    );
    assert_eq!(
        depth(&mut conn),
        None,
        "rolled back: out of the transaction"
    );

    // The body fails on its own after writing: its write is rolled back too.
    let refused: Result<(), Error> = transaction(&mut conn, async |conn| {
        insert(conn, 4).await?;
        Err(Error::forbidden("refused after writing"))
    })
    .await;
    assert!(refused.is_err());
    assert_eq!(rows(&mut conn).await, 2);

    // A body dropped while its statements run (a client gone): the connection still counts as
    // inside a transaction, so a pool discards it instead of handing its open transaction on.
    let dropped = tokio::time::timeout(
        Duration::from_millis(200),
        transaction(&mut conn, async |mut conn| {
            insert(conn, 5).await?;
            diesel::sql_query("SELECT pg_sleep(5)")
                .execute(&mut conn)
                .await?;
            Ok(())
        }),
    )
    .await;
    assert!(dropped.is_err(), "the body should still have been running");
    assert_eq!(depth(&mut conn), Some(1));
    let mut other = AsyncPgConnection::establish(&db.url).await.unwrap();
    assert_eq!(
        rows(&mut other).await,
        2,
        "an unfinished transaction's row is visible"
    );
}

/// A connection listening on `channel`, and the payloads that arrive on it.
async fn listen(url: &str, channel: &str) -> (tokio_postgres::Client, UnboundedReceiver<String>) {
    let (client, mut connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    let (arrived, payloads) = unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let AsyncMessage::Notification(notification) = message {
                let _ = arrived.send(notification.payload().to_owned());
            }
        }
    });
    client
        .batch_execute(&format!("LISTEN {channel}"))
        .await
        .unwrap();
    (client, payloads)
}

/// The next payload within `wait`, if one arrives.
async fn next(payloads: &mut UnboundedReceiver<String>, wait: Duration) -> Option<String> {
    tokio::time::timeout(wait, payloads.recv())
        .await
        .ok()
        .flatten()
}

#[tokio::test]
async fn notifications_go_out_once_committed_and_never_for_a_failed_body() {
    let (db, mut conn) = probe_database().await;
    let (_listening, mut payloads) = listen(&db.url, "probe_channel").await;

    // Asked for among the body's writes, twice, and once more: sent once each, after the
    // commit, when the rows are there to read.
    let mut reader = AsyncPgConnection::establish(&db.url).await.unwrap();
    transaction(&mut conn, async |conn| {
        tokio::try_join!(
            insert(conn, 1),
            notify(conn, "probe_channel", "first"),
            notify(conn, "probe_channel", "first"),
        )?;
        insert(conn, 2).await?;
        notify(conn, "probe_channel", "second").await?;
        Ok(())
    })
    .await
    .unwrap();
    let wait = Duration::from_secs(5);
    assert_eq!(next(&mut payloads, wait).await.as_deref(), Some("first"));
    assert_eq!(rows(&mut reader).await, 2, "announced before its rows");
    assert_eq!(next(&mut payloads, wait).await.as_deref(), Some("second"));
    assert_eq!(depth(&mut conn), None, "committed: out of the transaction");

    // A body that fails after asking: nothing is announced.
    let refused: Result<(), Error> = transaction(&mut conn, async |conn| {
        notify(conn, "probe_channel", "refused").await?;
        insert(conn, 3).await?;
        Err(Error::forbidden("refused after asking"))
    })
    .await;
    assert!(refused.is_err());
    // A failed statement after asking: nothing either.
    let failed = transaction(&mut conn, async |conn| {
        notify(conn, "probe_channel", "duplicate").await?;
        insert(conn, 1).await?;
        Ok(())
    })
    .await;
    assert!(failed.is_err());
    assert_eq!(
        depth(&mut conn),
        None,
        "rolled back: out of the transaction"
    );

    // Outside such a transaction a notification goes out at once; the next one to arrive is
    // that, not one of the failed bodies'.
    notify(&conn, "probe_channel", "alone").await.unwrap();
    assert_eq!(next(&mut payloads, wait).await.as_deref(), Some("alone"));
    assert_eq!(next(&mut payloads, Duration::from_millis(500)).await, None);
}

/// There are no nested transactions: one begun on a connection already inside a transaction
/// is refused before anything is sent, rather than its `COMMIT` ending the outer one early.
#[tokio::test]
async fn a_transaction_inside_another_is_refused_and_the_outer_one_stays_whole() {
    let (_db, mut conn) = probe_database().await;
    AnsiTransactionManager::begin_transaction(&mut conn)
        .await
        .unwrap();
    insert(&conn, 1).await.unwrap();
    // With a notification, its `COMMIT` goes out as such, not as diesel's savepoint release.
    let inner = transaction(&mut conn, async |conn| {
        insert(conn, 2).await?;
        notify(conn, "probe", "nested").await?;
        Ok(())
    })
    .await;
    assert!(inner.is_err(), "a nested transaction ran");
    assert_eq!(
        depth(&mut conn),
        Some(1),
        "the outer transaction is still open"
    );
    AnsiTransactionManager::rollback_transaction(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        rows(&mut conn).await,
        0,
        "the outer transaction's rollback undid its insert"
    );
}

#[derive(QueryableByName, Debug, PartialEq)]
struct Plans {
    #[diesel(sql_type = BigInt)]
    generic_plans: i64,
    #[diesel(sql_type = BigInt)]
    custom_plans: i64,
}

/// How often this connection's prepared statement containing `fragment` ran with a plan made
/// once (generic) and with one made for the call's values (custom).
async fn plans(conn: &mut AsyncPgConnection, fragment: &str) -> Plans {
    diesel::sql_query(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements \
         WHERE strpos(statement, $1) > 0",
    )
    .bind::<Text, _>(fragment)
    .get_result(conn)
    .await
    .unwrap()
}

/// The room state's lookup takes its keys as arrays, so PostgreSQL, left to choose, plans it
/// again at every call; in a room write (every send) it is planned once per connection. The
/// setting ends with the room write's transaction.
#[tokio::test]
async fn a_room_writes_statements_are_planned_once_and_other_transactions_as_postgresql_chooses() {
    let db = TestDb::new().await;
    let lookup = async |conn: &AsyncPgConnection| {
        get_current_state_events(conn, "!room:localhost:8448", &[("m.room.create", "")]).await?;
        Ok::<_, Error>(())
    };
    let statement = "unnest($2::TEXT[], $3::TEXT[])";

    let mut writer = AsyncPgConnection::establish(&db.url).await.unwrap();
    for _ in 0..8 {
        room_write(&mut writer, lookup).await.unwrap();
    }
    assert_eq!(
        plans(&mut writer, statement).await,
        Plans {
            generic_plans: 8,
            custom_plans: 0
        },
        "a room write's statement planned at every call"
    );
    #[derive(QueryableByName)]
    struct Setting {
        #[diesel(sql_type = Text)]
        plan_cache_mode: String,
    }
    let after: Setting =
        diesel::sql_query("SELECT current_setting('plan_cache_mode') AS plan_cache_mode")
            .get_result(&mut writer)
            .await
            .unwrap();
    assert_eq!(
        after.plan_cache_mode, "auto",
        "the setting outlived the room write"
    );

    let mut other = AsyncPgConnection::establish(&db.url).await.unwrap();
    for _ in 0..8 {
        transaction(&mut other, lookup).await.unwrap();
    }
    assert_eq!(
        plans(&mut other, statement).await.custom_plans,
        8,
        "PostgreSQL's own choice: a plan for each call's values"
    );
}
