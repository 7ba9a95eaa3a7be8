//! Event relations: edits, reactions, thread replies and references.

use diesel::{
    prelude::*,
    sql_types::{Array, BigInt, Bool, Text},
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::{
    rooms::{served, SERVED_TO_CLIENTS},
    schema::{event_relations, events},
};

/// Whether the relating event of an `event_relations` row is served to clients: reads that
/// list or count children ignore the others, whatever wrote their rows.
#[diesel::dsl::auto_type]
fn child_served() -> _ {
    diesel::dsl::exists(
        events::table
            .filter(events::event_id.eq(event_relations::event_id))
            .filter(served()),
    )
}

/// [`child_served`] in SQL, for a query that names `event_relations` as `r`.
fn child_served_sql() -> String {
    format!(
        "EXISTS (SELECT 1 FROM events WHERE events.event_id = r.event_id AND {SERVED_TO_CLIENTS})"
    )
}

/// One relation.
#[derive(Debug, Clone, Queryable, Selectable, Insertable)]
#[diesel(table_name = event_relations)]
pub struct RelationRow {
    /// The relating event.
    pub event_id: String,
    /// The event it relates to.
    pub relates_to: String,
    /// `m.replace`, `m.annotation`, `m.thread`, `m.reference`, ...
    pub rel_type: String,
    /// Room.
    pub room_id: String,
    /// Sender of the relating event.
    pub sender: String,
    /// Type of the relating event.
    pub event_type: String,
    /// Reactions: the key.
    pub aggregation_key: Option<String>,
    /// Position of the relating event.
    pub stream_ordering: i64,
}

/// Records a relation inside the relating event's transaction, at the position it just took
/// (see [`super::streams::TAKEN_EVENT_POSITION`]), or at the event's provisional one.
pub async fn insert_relation(
    mut conn: &AsyncPgConnection,
    row: &RelationRow,
    provisional: Option<i64>,
) -> QueryResult<()> {
    fn sql(position: &str) -> String {
        format!(
            "INSERT INTO event_relations (event_id, relates_to, rel_type, room_id, sender, \
             event_type, aggregation_key, stream_ordering) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, {position}) ON CONFLICT DO NOTHING"
        )
    }
    static AT_TAKEN: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| sql(super::streams::TAKEN_EVENT_POSITION));
    static AT_PROVISIONAL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| sql("$8"));
    let query = super::cached_sql(match provisional {
        Some(_) => AT_PROVISIONAL.as_str(),
        None => AT_TAKEN.as_str(),
    })
    .bind::<Text, _>(&row.event_id)
    .bind::<Text, _>(&row.relates_to)
    .bind::<Text, _>(&row.rel_type)
    .bind::<Text, _>(&row.room_id)
    .bind::<Text, _>(&row.sender)
    .bind::<Text, _>(&row.event_type)
    .bind::<diesel::sql_types::Nullable<Text>, _>(&row.aggregation_key);
    match provisional {
        Some(position) => {
            query
                .bind::<diesel::sql_types::BigInt, _>(position)
                .execute(&mut conn)
                .await
        }
        None => query.execute(&mut conn).await,
    }
    .map(drop)
}

/// Forgets the relation of a redacted event.
pub async fn delete_relation(mut conn: &AsyncPgConnection, event_id: &str) -> QueryResult<()> {
    diesel::delete(event_relations::table.find(event_id))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// The relation an event makes, if any.
pub async fn get_relation(
    mut conn: &AsyncPgConnection,
    event_id: &str,
) -> QueryResult<Option<RelationRow>> {
    event_relations::table
        .find(event_id)
        .select(RelationRow::as_select())
        .first(&mut conn)
        .await
        .optional()
}

/// Whether a user already reacted to an event with this key.
pub async fn has_annotation(
    mut conn: &AsyncPgConnection,
    relates_to: &str,
    sender: &str,
    event_type: &str,
    key: &str,
) -> QueryResult<bool> {
    let existing = event_relations::table
        .filter(event_relations::relates_to.eq(relates_to))
        .filter(event_relations::rel_type.eq("m.annotation"))
        .filter(event_relations::sender.eq(sender))
        .filter(event_relations::event_type.eq(event_type))
        .filter(event_relations::aggregation_key.eq(key))
        .filter(child_served());
    diesel::select(diesel::dsl::exists(existing))
        .get_result(&mut conn)
        .await
}

/// A thread's summary.
#[derive(Debug, Clone)]
pub struct ThreadSummary {
    /// The root.
    pub root: String,
    /// Replies.
    pub count: i64,
    /// The newest reply.
    pub latest: String,
    /// Whether the user replied.
    pub participated: bool,
}

/// The relations bundled with events served to clients.
#[derive(Debug, Default)]
pub struct Bundled {
    /// The latest replacement of each event: `(original, replacement)`.
    pub edits: Vec<(String, String)>,
    /// Summaries of the threads rooted at the events.
    pub threads: Vec<ThreadSummary>,
    /// References to the events: `(referenced, referencing)`, oldest first.
    pub references: Vec<(String, String)>,
}

impl Bundled {
    /// The part of these relations whose parent is one of `parents` (a sync reads them for
    /// many rooms' timelines at once, and bundles them room by room).
    pub fn of_parents(&self, parents: &std::collections::HashSet<&str>) -> Bundled {
        let pairs = |pairs: &[(String, String)]| {
            pairs
                .iter()
                .filter(|(parent, _)| parents.contains(parent.as_str()))
                .cloned()
                .collect()
        };
        Bundled {
            edits: pairs(&self.edits),
            threads: self
                .threads
                .iter()
                .filter(|thread| parents.contains(thread.root.as_str()))
                .cloned()
                .collect(),
            references: pairs(&self.references),
        }
    }
}

/// The edits, thread summaries and references of the given events, in one statement (it is
/// read for every timeline served: a sync reads it once for many rooms).
pub async fn get_bundled(
    mut conn: &AsyncPgConnection,
    parents: &[String],
    user_id: &str,
) -> QueryResult<Bundled> {
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = Text)]
        rel_type: String,
        #[diesel(sql_type = Text)]
        relates_to: String,
        /// The edit, the thread's newest reply or the reference.
        #[diesel(sql_type = Text)]
        event_id: String,
        #[diesel(sql_type = BigInt)]
        stream_ordering: i64,
        /// Thread replies.
        #[diesel(sql_type = BigInt)]
        count: i64,
        /// Whether the user replied in the thread.
        #[diesel(sql_type = Bool)]
        participated: bool,
    }
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let served = child_served_sql();
        format!(
            "(SELECT DISTINCT ON (r.relates_to) r.rel_type, r.relates_to, r.event_id, \
                     r.stream_ordering, 0::BIGINT AS count, false AS participated \
              FROM event_relations r \
              WHERE r.relates_to = ANY($1) AND r.rel_type = 'm.replace' AND {served} \
              ORDER BY r.relates_to, r.stream_ordering DESC) \
             UNION ALL \
             (SELECT 'm.thread', r.relates_to, \
                     (ARRAY_AGG(r.event_id ORDER BY r.stream_ordering DESC))[1], \
                     MAX(r.stream_ordering), COUNT(*), BOOL_OR(r.sender = $2) \
              FROM event_relations r \
              WHERE r.relates_to = ANY($1) AND r.rel_type = 'm.thread' AND {served} \
              GROUP BY r.relates_to) \
             UNION ALL \
             (SELECT r.rel_type, r.relates_to, r.event_id, r.stream_ordering, 0, false \
              FROM event_relations r \
              WHERE r.relates_to = ANY($1) AND r.rel_type = 'm.reference' AND {served})"
        )
    });
    let mut rows: Vec<Row> = crate::storage::cached_sql(SQL.as_str())
        .bind::<Array<Text>, _>(parents)
        .bind::<Text, _>(user_id)
        .load(&mut conn)
        .await?;
    rows.sort_by_key(|r| r.stream_ordering);
    let mut bundled = Bundled::default();
    for row in rows {
        match row.rel_type.as_str() {
            "m.replace" => bundled.edits.push((row.relates_to, row.event_id)),
            "m.thread" => bundled.threads.push(ThreadSummary {
                root: row.relates_to,
                count: row.count,
                latest: row.event_id,
                participated: row.participated,
            }),
            _ => bundled.references.push((row.relates_to, row.event_id)),
        }
    }
    Ok(bundled)
}

/// One page of an event's children for `/relations`: event IDs and positions, newest first
/// (`backwards`) or oldest first, strictly beyond `from` and up to `to` inclusive (a page's
/// `next_batch` is the position of its last event, so from one page's `next_batch` to the
/// next one's is exactly that next page, in either direction).
#[allow(clippy::too_many_arguments)]
pub async fn page_children(
    mut conn: &AsyncPgConnection,
    parent: &str,
    rel_type: Option<&str>,
    event_type: Option<&str>,
    from: Option<i64>,
    to: Option<i64>,
    backwards: bool,
    limit: i64,
) -> QueryResult<Vec<(String, i64)>> {
    let mut query = event_relations::table
        .filter(event_relations::relates_to.eq(parent))
        .filter(child_served())
        .select((event_relations::event_id, event_relations::stream_ordering))
        .limit(limit)
        .into_boxed();
    if let Some(rel_type) = rel_type {
        query = query.filter(event_relations::rel_type.eq(rel_type));
    }
    if let Some(event_type) = event_type {
        query = query.filter(event_relations::event_type.eq(event_type));
    }
    if backwards {
        if let Some(from) = from {
            query = query.filter(event_relations::stream_ordering.lt(from));
        }
        if let Some(to) = to {
            query = query.filter(event_relations::stream_ordering.ge(to));
        }
        query = query.order(event_relations::stream_ordering.desc());
    } else {
        if let Some(from) = from {
            query = query.filter(event_relations::stream_ordering.gt(from));
        }
        if let Some(to) = to {
            query = query.filter(event_relations::stream_ordering.le(to));
        }
        query = query.order(event_relations::stream_ordering.asc());
    }
    query.load(&mut conn).await
}

/// Thread roots of a room by latest activity, newest first, active before `before`;
/// `participant`: only threads that user started or replied to.
pub async fn get_threads(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    participant: Option<&str>,
    before: i64,
    limit: i64,
) -> QueryResult<Vec<(String, i64)>> {
    #[derive(QueryableByName)]
    struct Thread {
        #[diesel(sql_type = Text)]
        root: String,
        #[diesel(sql_type = BigInt)]
        latest: i64,
    }
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "SELECT r.relates_to AS root, MAX(r.stream_ordering) AS latest
         FROM event_relations r
         WHERE r.room_id = $1 AND r.rel_type = 'm.thread' AND {}
         GROUP BY r.relates_to
         HAVING MAX(r.stream_ordering) < $3
            AND ($2::TEXT IS NULL OR BOOL_OR(r.sender = $2) OR EXISTS (
                SELECT 1 FROM events e WHERE e.event_id = r.relates_to AND e.sender = $2))
         ORDER BY latest DESC
         LIMIT $4",
            child_served_sql()
        )
    });
    let rows: Vec<Thread> = crate::storage::cached_sql(SQL.as_str())
        .bind::<Text, _>(room_id)
        .bind::<diesel::sql_types::Nullable<Text>, _>(participant)
        .bind::<BigInt, _>(before)
        .bind::<BigInt, _>(limit)
        .load(&mut conn)
        .await?;
    Ok(rows.into_iter().map(|r| (r.root, r.latest)).collect())
}
