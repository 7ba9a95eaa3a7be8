//! `storage::transaction`: the transaction whose `BEGIN` goes out with the body's first
//! statements (every send runs in one). Its statements must land inside it, a failure must
//! leave nothing, and a body dropped half-way must not hand an open transaction to the pool.

use std::time::Duration;

use diesel::{sql_types::BigInt, QueryableByName};
use diesel_async::{
    AnsiTransactionManager, AsyncConnection, AsyncPgConnection, RunQueryDsl, TransactionManager,
};
use myelin::{error::Error, storage::transaction::transaction};

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

#[tokio::test]
async fn statements_commit_together_roll_back_together_and_a_dropped_body_is_never_reused() {
    let db = TestDb::new().await;
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    diesel::sql_query("CREATE TABLE probe (n BIGINT NOT NULL UNIQUE)")
        .execute(&mut conn)
        .await
        .unwrap();

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
