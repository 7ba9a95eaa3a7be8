//! The server's database connections, as the pool sets them up.

use diesel::QueryableByName;
use diesel_async::RunQueryDsl;
use myelin::storage::Db;

use crate::support::TestDb;

#[derive(QueryableByName)]
struct Setting {
    #[diesel(sql_type = diesel::sql_types::Text)]
    jit: String,
}

/// PostgreSQL's JIT compiles statements whose estimated cost is high, which a recursive
/// query's always is: 150 to 300 ms of compiling for a statement that runs in one. Every
/// pooled connection, of the shared pool and of the HTTP workers' pools alike, has it off.
#[tokio::test]
async fn pooled_connections_have_jit_off() {
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
                show_jit(&db).await
            })
        })
    };
    assert_eq!(show_jit(&db).await, "off", "shared pool");
    assert_eq!(on_worker.join().unwrap(), "off", "a worker's pool");
}

async fn show_jit(db: &Db) -> String {
    let mut conn = db.conn().await.unwrap();
    let setting: Setting = diesel::sql_query("SHOW jit")
        .get_result(&mut *conn)
        .await
        .unwrap();
    setting.jit
}
