//! Migrations: every `down.sql` undoes exactly what its `up.sql` did, and
//! `src/storage/schema.rs` (kept by hand) declares exactly the tables and columns they build.
//!
//! The schema is compared through PostgreSQL's catalogs, not `pg_dump`, so the tests need no
//! binary beyond the server they connect to (`TEST_DATABASE_URL` may point anywhere).

use std::collections::{BTreeMap, BTreeSet};

use diesel::migration::MigrationSource;
use diesel::{sql_types::Text, Connection, QueryableByName};
use diesel_async::{
    async_connection_wrapper::AsyncConnectionWrapper, AsyncConnection, AsyncPgConnection,
    RunQueryDsl,
};
use diesel_migrations::MigrationHarness;
use myelin::storage::MIGRATIONS;

use crate::support::TestDb;

/// A blocking connection, as diesel's migration harness needs.
type SyncConn = AsyncConnectionWrapper<AsyncPgConnection>;

#[derive(QueryableByName)]
struct Line {
    #[diesel(sql_type = Text)]
    line: String,
}

/// Objects outside PostgreSQL's own schemas and other than diesel's bookkeeping table
/// (`__diesel_schema_migrations`, its key, index and row type). `{ns}` is the namespace's
/// alias, `{name}` the object's name column.
fn ours(ns: &str, name: &str) -> String {
    format!(
        "{ns}.nspname !~ '^pg_' AND {ns}.nspname <> 'information_schema' \
         AND position('diesel_schema_migrations' in {name}) = 0"
    )
}

/// The catalog queries a schema snapshot is made of; each returns lines named `line`.
fn catalog_queries() -> Vec<String> {
    let relation = ours("n", "c.relname");
    vec![
        format!(
            "SELECT 'schema ' || n.nspname AS line FROM pg_namespace n WHERE {}",
            ours("n", "n.nspname")
        ),
        "SELECT 'extension ' || extname || ' ' || extversion AS line FROM pg_extension".into(),
        format!(
            "SELECT 'relation ' || n.nspname || '.' || c.relname || ' kind ' || c.relkind::text \
             || ' persistence ' || c.relpersistence::text AS line \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE {relation}"
        ),
        // Columns by their position among the live ones: a column dropped and added again
        // leaves a hole in `attnum` but reads the same.
        format!(
            "SELECT 'column ' || n.nspname || '.' || c.relname || ' #' \
             || row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum) || ' ' || a.attname \
             || ' ' || format_type(a.atttypid, a.atttypmod) \
             || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END \
             || COALESCE(' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid), '') \
             || CASE WHEN a.attidentity <> '' THEN ' IDENTITY ' || a.attidentity::text ELSE '' END \
             || CASE WHEN a.attgenerated <> '' THEN ' GENERATED' ELSE '' END AS line \
             FROM pg_attribute a \
             JOIN pg_class c ON c.oid = a.attrelid \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum \
             WHERE a.attnum > 0 AND NOT a.attisdropped AND c.relkind IN ('r', 'p', 'v', 'm', 'f') \
             AND {relation}"
        ),
        format!(
            "SELECT 'constraint ' || n.nspname || '.' || c.relname || ' ' || con.conname || ' ' \
             || pg_get_constraintdef(con.oid) AS line \
             FROM pg_constraint con \
             JOIN pg_class c ON c.oid = con.conrelid \
             JOIN pg_namespace n ON n.oid = c.relnamespace WHERE {relation}"
        ),
        format!(
            "SELECT 'index ' || pg_get_indexdef(i.indexrelid) AS line \
             FROM pg_index i \
             JOIN pg_class c ON c.oid = i.indexrelid \
             JOIN pg_namespace n ON n.oid = c.relnamespace WHERE {relation}"
        ),
        format!(
            "SELECT 'sequence ' || n.nspname || '.' || c.relname || ' ' \
             || format_type(s.seqtypid, NULL) || ' start ' || s.seqstart \
             || ' increment ' || s.seqincrement || ' min ' || s.seqmin || ' max ' || s.seqmax \
             || ' cycle ' || s.seqcycle AS line \
             FROM pg_sequence s \
             JOIN pg_class c ON c.oid = s.seqrelid \
             JOIN pg_namespace n ON n.oid = c.relnamespace WHERE {relation}"
        ),
        // Which column owns a sequence (`BIGSERIAL`, `OWNED BY`, identity columns).
        format!(
            "SELECT 'owned ' || n.nspname || '.' || c.relname || ' by ' || t.relname || '.' \
             || a.attname || ' ' || dep.deptype::text AS line \
             FROM pg_depend dep \
             JOIN pg_class c ON c.oid = dep.objid AND c.relkind = 'S' \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             JOIN pg_class t ON t.oid = dep.refobjid \
             JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = dep.refobjsubid \
             WHERE dep.classid = 'pg_class'::regclass AND dep.refclassid = 'pg_class'::regclass \
             AND dep.deptype IN ('a', 'i') AND {relation}"
        ),
        format!(
            "SELECT 'view ' || n.nspname || '.' || c.relname || ' ' || pg_get_viewdef(c.oid) AS line \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.relkind IN ('v', 'm') AND {relation}"
        ),
        format!(
            "SELECT 'function ' || p.oid::regprocedure::text || ' ' || pg_get_functiondef(p.oid) \
             AS line FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
             WHERE p.prokind IN ('f', 'p') AND {}",
            ours("n", "p.proname")
        ),
        format!(
            "SELECT 'trigger ' || pg_get_triggerdef(t.oid) AS line \
             FROM pg_trigger t \
             JOIN pg_class c ON c.oid = t.tgrelid \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE NOT t.tgisinternal AND {relation}"
        ),
        format!(
            "SELECT 'type ' || n.nspname || '.' || t.typname || ' ' || t.typtype::text AS line \
             FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE {}",
            ours("n", "t.typname")
        ),
        format!(
            "SELECT 'enum ' || n.nspname || '.' || t.typname || ' ' \
             || string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder) AS line \
             FROM pg_enum e \
             JOIN pg_type t ON t.oid = e.enumtypid \
             JOIN pg_namespace n ON n.oid = t.typnamespace \
             WHERE {} GROUP BY n.nspname, t.typname",
            ours("n", "t.typname")
        ),
    ]
}

fn load_lines(conn: &mut SyncConn, sql: &str) -> Vec<String> {
    diesel::RunQueryDsl::load::<Line>(diesel::sql_query(sql), conn)
        .unwrap_or_else(|e| panic!("{e}: {sql}"))
        .into_iter()
        .map(|l| l.line)
        .collect()
}

/// Everything a migration can create or seed: relations, columns, constraints, indexes,
/// sequences, views, functions, triggers, types, and each table's rows (count and digest;
/// migrations seed rows such as `stream_positions`).
fn snapshot(conn: &mut SyncConn) -> BTreeSet<String> {
    let mut lines = BTreeSet::new();
    for sql in catalog_queries() {
        lines.extend(load_lines(conn, &sql));
    }
    let tables = load_lines(
        conn,
        &format!(
            "SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname) AS line \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.relkind IN ('r', 'p') AND {}",
            ours("n", "c.relname")
        ),
    );
    for table in tables {
        lines.extend(load_lines(
            conn,
            &format!(
                "SELECT 'rows {table} ' || count(*) || ' ' \
                 || COALESCE(md5(string_agg(r::text, ',' ORDER BY r::text)), '') AS line \
                 FROM {table} r"
            ),
        ));
    }
    lines
}

/// Fails with the lines one snapshot has and the other lacks.
#[track_caller]
fn assert_same_schema(expected: &BTreeSet<String>, actual: &BTreeSet<String>, context: &str) {
    let missing: Vec<_> = expected.difference(actual).collect();
    let unexpected: Vec<_> = actual.difference(expected).collect();
    assert!(
        missing.is_empty() && unexpected.is_empty(),
        "{context}\nexpected but missing: {missing:#?}\npresent but not expected: {unexpected:#?}"
    );
}

/// Runs `check` with a blocking connection to a new, empty database.
async fn with_empty_database(check: impl FnOnce(&mut SyncConn) + Send + 'static) {
    let db = TestDb::empty().await;
    let url = db.url.clone();
    let outcome = tokio::task::spawn_blocking(move || {
        let mut conn =
            <SyncConn as Connection>::establish(&url).expect("connect to the test database");
        check(&mut conn);
    })
    .await;
    drop(db);
    if let Err(e) = outcome {
        std::panic::resume_unwind(e.into_panic());
    }
}

fn migration_count() -> usize {
    MigrationSource::<diesel::pg::Pg>::migrations(&MIGRATIONS)
        .unwrap()
        .len()
}

#[tokio::test]
async fn each_down_sql_restores_exactly_the_schema_before_its_up_sql() {
    with_empty_database(|conn| {
        let mut before = snapshot(conn);
        let mut applied = 0;
        while conn.has_pending_migration(MIGRATIONS).unwrap() {
            let version = conn.run_next_migration(MIGRATIONS).unwrap().to_string();
            let after = snapshot(conn);
            assert_ne!(before, after, "migration {version} changed nothing");

            let reverted = conn.revert_last_migration(MIGRATIONS).unwrap().to_string();
            assert_eq!(reverted, version);
            assert_same_schema(
                &before,
                &snapshot(conn),
                &format!("{version}/down.sql does not undo exactly what its up.sql did"),
            );

            let again = conn.run_next_migration(MIGRATIONS).unwrap().to_string();
            assert_eq!(again, version);
            assert_same_schema(
                &after,
                &snapshot(conn),
                &format!("{version}/up.sql builds something else after its down.sql"),
            );
            before = after;
            applied += 1;
        }
        assert_eq!(applied, migration_count(), "every migration was checked");
    })
    .await;
}

#[tokio::test]
async fn all_migrations_revert_to_an_empty_database_and_reapply_to_the_same_schema() {
    with_empty_database(|conn| {
        let empty = snapshot(conn);
        let applied = conn.run_pending_migrations(MIGRATIONS).unwrap().len();
        assert_eq!(applied, migration_count());
        let migrated = snapshot(conn);
        assert!(
            migrated
                .iter()
                .any(|l| l.starts_with("relation public.events ")),
            "the snapshot sees the migrated tables"
        );

        // Newest first, each down.sql in turn.
        let reverted = conn.revert_all_migrations(MIGRATIONS).unwrap().len();
        assert_eq!(reverted, migration_count());
        assert_same_schema(
            &empty,
            &snapshot(conn),
            "reverting every migration leaves something behind",
        );

        conn.run_pending_migrations(MIGRATIONS).unwrap();
        assert_same_schema(
            &migrated,
            &snapshot(conn),
            "migrating again after reverting everything builds a different schema",
        );
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// src/storage/schema.rs against the migrated database

/// Tables the migrations create that `schema.rs` leaves out on purpose, with the reason.
/// (Everything the code reaches through diesel's DSL must be declared; tables queried only
/// with raw SQL may be listed here.)
const NOT_IN_SCHEMA_RS: &[(&str, &str)] = &[];

/// One `diesel::table!` block: primary key and `column -> type`.
#[derive(Debug, Default)]
struct DeclaredTable {
    primary_key: Vec<String>,
    columns: BTreeMap<String, String>,
}

/// A diesel SQL type written the one way this test compares: the names
/// `diesel print-schema` uses (`Int8`, not its alias `BigInt`), without a path, and arrays
/// without `Nullable` elements (print-schema writes `Array<Nullable<Text>>` because
/// PostgreSQL cannot declare array elements non-null; `Array<Text>` says the code never stores
/// NULL elements, which this test cannot check either way).
fn normalize_diesel_type(written: &str) -> String {
    let compact: String = written.chars().filter(|c| !c.is_whitespace()).collect();
    let compact = compact.replace("diesel::sql_types::", "");
    let mut out = String::new();
    let mut word = String::new();
    for c in compact.chars().map(Some).chain([None]) {
        if let Some(c) = c.filter(|c| c.is_alphanumeric() || *c == '_') {
            word.push(c);
            continue;
        }
        out.push_str(match word.as_str() {
            "BigInt" => "Int8",
            "Integer" => "Int4",
            "SmallInt" => "Int2",
            "Boolean" => "Bool",
            "Binary" => "Bytea",
            "Double" => "Float8",
            "Float" => "Float4",
            "VarChar" => "Varchar",
            other => other,
        });
        word.clear();
        out.extend(c);
    }
    // `Array<Nullable<T>>` -> `Array<T>` (T is one word).
    while let Some(at) = out.find("Array<Nullable<") {
        let element = at + "Array<Nullable<".len();
        let close = element + out[element..].find('>').expect("a closing `>`");
        out.replace_range(close..close + 1, "");
        out.replace_range(at + "Array<".len()..element, "");
    }
    out
}

/// The diesel type of a column from `information_schema.columns`.
fn diesel_type_of(udt_name: &str, nullable: bool) -> String {
    let scalar = |udt: &str| -> &'static str {
        match udt {
            "text" => "Text",
            "varchar" => "Varchar",
            "int2" => "Int2",
            "int4" => "Int4",
            "int8" => "Int8",
            "bool" => "Bool",
            "bytea" => "Bytea",
            "json" => "Json",
            "jsonb" => "Jsonb",
            "float4" => "Float4",
            "float8" => "Float8",
            "numeric" => "Numeric",
            "uuid" => "Uuid",
            "date" => "Date",
            "timestamp" => "Timestamp",
            "timestamptz" => "Timestamptz",
            "tsvector" => "Tsvector",
            other => panic!("no diesel type known here for the PostgreSQL type {other}: add it"),
        }
    };
    let base = match udt_name.strip_prefix('_') {
        Some(element) => format!("Array<{}>", scalar(element)),
        None => scalar(udt_name).to_owned(),
    };
    if nullable {
        format!("Nullable<{base}>")
    } else {
        base
    }
}

/// Reads the `diesel::table!` blocks and the `allow_tables_to_appear_in_same_query!` list of a
/// schema file in the layout `diesel print-schema` writes. Anything else inside a block fails
/// the test, so the parser cannot silently skip a column.
fn parse_schema_rs(text: &str) -> (BTreeMap<String, DeclaredTable>, BTreeSet<String>) {
    let mut tables = BTreeMap::new();
    let mut joinable = BTreeSet::new();
    let mut lines = text.lines().map(str::trim);
    while let Some(line) = lines.next() {
        if line.starts_with("diesel::allow_tables_to_appear_in_same_query!") {
            for line in lines.by_ref() {
                if line.starts_with(')') {
                    break;
                }
                joinable.insert(line.trim_end_matches(',').to_owned());
            }
            continue;
        }
        if line != "diesel::table! {" {
            continue;
        }
        let header = lines
            .by_ref()
            .find(|l| !l.is_empty() && !l.starts_with("use ") && !l.starts_with("//"))
            .expect("a table name after `diesel::table! {`");
        let header = header
            .strip_suffix('{')
            .unwrap_or_else(|| panic!("schema.rs: cannot read the table header `{header}`"))
            .trim();
        let (name, primary_key) = match header.split_once('(') {
            Some((name, key)) => (
                name.trim(),
                key.trim_end_matches(')')
                    .split(',')
                    .map(|c| c.trim().to_owned())
                    .collect(),
            ),
            None => (header, vec!["id".to_owned()]),
        };
        let mut table = DeclaredTable {
            primary_key,
            columns: BTreeMap::new(),
        };
        for line in lines.by_ref() {
            if line == "}" {
                break;
            }
            if line.is_empty() || line.starts_with("//") {
                continue;
            }
            let (column, sql_type) =
                line.trim_end_matches(',')
                    .split_once("->")
                    .unwrap_or_else(|| {
                        panic!("schema.rs: cannot read `{line}` in table {name}; teach this test")
                    });
            let previous = table
                .columns
                .insert(column.trim().to_owned(), normalize_diesel_type(sql_type));
            assert!(
                previous.is_none(),
                "schema.rs declares {name}.{column} twice"
            );
        }
        assert!(
            tables.insert(name.to_owned(), table).is_none(),
            "schema.rs declares the table {name} twice"
        );
    }
    (tables, joinable)
}

#[derive(QueryableByName)]
struct LiveColumn {
    #[diesel(sql_type = Text)]
    table_name: String,
    #[diesel(sql_type = Text)]
    column_name: String,
    #[diesel(sql_type = Text)]
    udt_name: String,
    #[diesel(sql_type = Text)]
    is_nullable: String,
}

#[derive(QueryableByName)]
struct KeyColumn {
    #[diesel(sql_type = Text)]
    table_name: String,
    #[diesel(sql_type = Text)]
    column_name: String,
}

/// Every table, column, type, nullability and primary key of the migrated database, compared
/// with what `schema.rs` declares (diesel checks queries against schema.rs at compile time, so
/// a wrong declaration compiles and fails at run time, or worse, reads a NULL as a value).
#[tokio::test]
async fn schema_rs_matches_the_migrated_database() {
    let db = TestDb::new().await;
    let mut conn = AsyncPgConnection::establish(&db.url).await.unwrap();
    let columns: Vec<LiveColumn> = diesel::sql_query(
        "SELECT table_name::text AS table_name, column_name::text AS column_name, \
                udt_name::text AS udt_name, is_nullable::text AS is_nullable \
         FROM information_schema.columns \
         WHERE table_schema = 'public' AND table_name <> '__diesel_schema_migrations' \
         ORDER BY table_name, ordinal_position",
    )
    .load(&mut conn)
    .await
    .unwrap();
    let keys: Vec<KeyColumn> = diesel::sql_query(
        "SELECT k.table_name::text AS table_name, k.column_name::text AS column_name \
         FROM information_schema.table_constraints t \
         JOIN information_schema.key_column_usage k \
           ON k.constraint_schema = t.constraint_schema AND k.constraint_name = t.constraint_name \
         WHERE t.constraint_type = 'PRIMARY KEY' AND t.table_schema = 'public' \
         ORDER BY k.table_name, k.ordinal_position",
    )
    .load(&mut conn)
    .await
    .unwrap();
    let mut live: BTreeMap<String, DeclaredTable> = BTreeMap::new();
    for c in columns {
        live.entry(c.table_name).or_default().columns.insert(
            c.column_name,
            diesel_type_of(&c.udt_name, c.is_nullable == "YES"),
        );
    }
    for k in keys {
        if let Some(table) = live.get_mut(&k.table_name) {
            table.primary_key.push(k.column_name);
        }
    }
    assert!(live.contains_key("events"), "the database is migrated");

    let (declared, joinable) = parse_schema_rs(include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/storage/schema.rs"
    )));
    assert!(declared.len() > 10, "schema.rs was read");

    let mut problems = Vec::new();
    let omitted: BTreeSet<&str> = NOT_IN_SCHEMA_RS.iter().map(|(t, _)| *t).collect();
    for table in &omitted {
        if !live.contains_key(*table) || declared.contains_key(*table) {
            problems.push(format!(
                "NOT_IN_SCHEMA_RS lists {table}, which is not a table schema.rs lacks"
            ));
        }
    }
    for (name, table) in &live {
        let Some(declared) = declared.get(name) else {
            if !omitted.contains(name.as_str()) {
                problems.push(format!("table {name} is not declared in schema.rs"));
            }
            continue;
        };
        if declared.primary_key != table.primary_key {
            problems.push(format!(
                "{name}: schema.rs says the primary key is ({}), the database has ({})",
                declared.primary_key.join(", "),
                table.primary_key.join(", ")
            ));
        }
        for (column, live_type) in &table.columns {
            match declared.columns.get(column) {
                None => problems.push(format!("{name}.{column} ({live_type}) is not in schema.rs")),
                Some(declared_type) if declared_type != live_type => problems.push(format!(
                    "{name}.{column}: schema.rs says {declared_type}, the database has {live_type}"
                )),
                Some(_) => {}
            }
        }
        for column in declared.columns.keys() {
            if !table.columns.contains_key(column) {
                problems.push(format!(
                    "{name}.{column} is in schema.rs but not in the database"
                ));
            }
        }
    }
    for name in declared.keys() {
        if !live.contains_key(name) {
            problems.push(format!(
                "schema.rs declares {name}, which no migration creates"
            ));
        }
    }
    let declared_names: BTreeSet<String> = declared.keys().cloned().collect();
    if joinable != declared_names {
        problems.push(format!(
            "allow_tables_to_appear_in_same_query! lists {:?} but the declared tables are {:?}",
            joinable.difference(&declared_names).collect::<Vec<_>>(),
            declared_names.difference(&joinable).collect::<Vec<_>>()
        ));
    }
    assert!(
        problems.is_empty(),
        "src/storage/schema.rs does not match the migrations:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn diesel_type_names_are_normalized() {
    assert_eq!(normalize_diesel_type("BigInt"), "Int8");
    assert_eq!(normalize_diesel_type("Nullable<BigInt>"), "Nullable<Int8>");
    assert_eq!(
        normalize_diesel_type("diesel::sql_types::Nullable<Integer>"),
        "Nullable<Int4>"
    );
    assert_eq!(
        normalize_diesel_type("Array<Nullable<Text>>"),
        "Array<Text>"
    );
    assert_eq!(
        normalize_diesel_type("Nullable<Array<Text>>"),
        "Nullable<Array<Text>>"
    );
    assert_eq!(diesel_type_of("_text", false), "Array<Text>");
    assert_eq!(diesel_type_of("int8", true), "Nullable<Int8>");
}
