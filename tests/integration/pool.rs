//! The server's database connections, as the pool sets them up.

use diesel::QueryableByName;
use diesel_async::RunQueryDsl;
use myelin::storage::Db;

use crate::support::TestDb;

#[derive(QueryableByName)]
struct Settings {
    #[diesel(sql_type = diesel::sql_types::Text)]
    jit: String,
    #[diesel(sql_type = diesel::sql_types::Text)]
    parallel_setup_cost: String,
}

/// PostgreSQL's JIT compiles statements whose estimated cost is high, which a recursive
/// query's always is: 150 to 300 ms of compiling for a statement that runs in one; and it
/// starts parallel workers (milliseconds) for a full-text match it guesses at thousands of
/// rows when a rare word finds ten. Every pooled connection, of the shared pool and of the
/// HTTP workers' pools alike, has JIT off and parallel workers priced for big scans only.
#[tokio::test]
async fn pooled_connections_have_jit_off_and_parallel_workers_for_big_scans_only() {
    let test_db = TestDb::new().await;
    let db = Db::connect(&test_db.url, 4, 1).unwrap();
    let on_worker = {
        let db = db.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                db.adopt_for_this_thread();
                show_settings(&db).await
            })
        })
    };
    let wanted = ("off".to_owned(), "20000".to_owned());
    assert_eq!(show_settings(&db).await, wanted, "shared pool");
    assert_eq!(on_worker.join().unwrap(), wanted, "a worker's pool");
}

async fn show_settings(db: &Db) -> (String, String) {
    let mut conn = db.conn().await.unwrap();
    let settings: Settings = diesel::sql_query(
        "SELECT current_setting('jit') AS jit, \
                current_setting('parallel_setup_cost') AS parallel_setup_cost",
    )
    .get_result(&mut *conn)
    .await
    .unwrap();
    (settings.jit, settings.parallel_setup_cost)
}
