//! The admin API's view of rooms: the room list with its facts derived from current state,
//! blocked rooms, and the record of background room deletions.

use diesel::{
    prelude::*,
    sql_types::{BigInt, Bool, Nullable, Text},
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::Value;

use super::schema::{admin_room_deletions, blocked_rooms, room_aliases, room_memberships, rooms};

/// One room as the admin API lists it.
#[derive(Debug, Clone, QueryableByName)]
pub struct AdminRoomRow {
    /// Room ID.
    #[diesel(sql_type = Text)]
    pub room_id: String,
    /// `m.room.name`.
    #[diesel(sql_type = Nullable<Text>)]
    pub name: Option<String>,
    /// `m.room.topic`.
    #[diesel(sql_type = Nullable<Text>)]
    pub topic: Option<String>,
    /// `m.room.avatar`.
    #[diesel(sql_type = Nullable<Text>)]
    pub avatar: Option<String>,
    /// `m.room.canonical_alias`.
    #[diesel(sql_type = Nullable<Text>)]
    pub canonical_alias: Option<String>,
    /// Joined members.
    #[diesel(sql_type = BigInt)]
    pub joined_members: i64,
    /// Joined members with an account here.
    #[diesel(sql_type = BigInt)]
    pub joined_local_members: i64,
    /// Room version.
    #[diesel(sql_type = Text)]
    pub version: String,
    /// Creator.
    #[diesel(sql_type = Text)]
    pub creator: String,
    /// The encryption algorithm, when encrypted.
    #[diesel(sql_type = Nullable<Text>)]
    pub encryption: Option<String>,
    /// Whether other servers may join (`m.federate`).
    #[diesel(sql_type = Bool)]
    pub federatable: bool,
    /// Published in the room directory.
    #[diesel(sql_type = Bool)]
    pub public: bool,
    /// `m.room.join_rules`.
    #[diesel(sql_type = Nullable<Text>)]
    pub join_rules: Option<String>,
    /// `m.room.guest_access`.
    #[diesel(sql_type = Nullable<Text>)]
    pub guest_access: Option<String>,
    /// `m.room.history_visibility`.
    #[diesel(sql_type = Nullable<Text>)]
    pub history_visibility: Option<String>,
    /// Current state events.
    #[diesel(sql_type = BigInt)]
    pub state_events: i64,
    /// The room type from `m.room.create`.
    #[diesel(sql_type = Nullable<Text>)]
    pub room_type: Option<String>,
    /// The replacement room, when tombstoned.
    #[diesel(sql_type = Nullable<Text>)]
    pub replacement_room: Option<String>,
}

/// Column a room list is ordered by (then by room ID).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoomOrder {
    /// The room name (Synapse's default; `alphabetical` is its old spelling).
    Name,
    /// The canonical alias.
    CanonicalAlias,
    /// Joined members (`size` is its old spelling).
    JoinedMembers,
    /// Joined local members.
    JoinedLocalMembers,
    /// Room version.
    Version,
    /// Creator.
    Creator,
    /// Encryption algorithm.
    Encryption,
    /// Federatable.
    Federatable,
    /// Published.
    Public,
    /// Join rule.
    JoinRules,
    /// Guest access.
    GuestAccess,
    /// History visibility.
    HistoryVisibility,
    /// Number of state events.
    StateEvents,
}

impl RoomOrder {
    /// Parses Synapse's `order_by` values.
    pub fn parse(value: &str) -> Option<Self> {
        Some(match value {
            "name" | "alphabetical" => RoomOrder::Name,
            "canonical_alias" => RoomOrder::CanonicalAlias,
            "joined_members" | "size" => RoomOrder::JoinedMembers,
            "joined_local_members" => RoomOrder::JoinedLocalMembers,
            "version" => RoomOrder::Version,
            "creator" => RoomOrder::Creator,
            "encryption" => RoomOrder::Encryption,
            "federatable" => RoomOrder::Federatable,
            "public" => RoomOrder::Public,
            "join_rules" => RoomOrder::JoinRules,
            "guest_access" => RoomOrder::GuestAccess,
            "history_visibility" => RoomOrder::HistoryVisibility,
            "state_events" => RoomOrder::StateEvents,
            _ => return None,
        })
    }

    /// Whether the order reads largest first unless `dir=b` reverses it (counts and the
    /// room version, as Synapse orders them).
    pub fn descending_by_default(self) -> bool {
        matches!(
            self,
            RoomOrder::JoinedMembers
                | RoomOrder::JoinedLocalMembers
                | RoomOrder::Version
                | RoomOrder::StateEvents
        )
    }

    fn column(self) -> &'static str {
        match self {
            RoomOrder::Name => "name",
            RoomOrder::CanonicalAlias => "canonical_alias",
            RoomOrder::JoinedMembers => "joined_members",
            RoomOrder::JoinedLocalMembers => "joined_local_members",
            RoomOrder::Version => "version",
            RoomOrder::Creator => "creator",
            RoomOrder::Encryption => "encryption",
            RoomOrder::Federatable => "federatable",
            RoomOrder::Public => "public",
            RoomOrder::JoinRules => "join_rules",
            RoomOrder::GuestAccess => "guest_access",
            RoomOrder::HistoryVisibility => "history_visibility",
            RoomOrder::StateEvents => "state_events",
        }
    }
}

/// The facts of every room, one row each, from current state and memberships.
const ROOM_FACTS: &str = "WITH facts AS (SELECT r.room_id, \
       (SELECT e.pdu #>> '{content,name}' FROM room_current_state s JOIN events e ON e.event_id = s.event_id \
         WHERE s.room_id = r.room_id AND s.event_type = 'm.room.name' AND s.state_key = '') AS name, \
       (SELECT e.pdu #>> '{content,topic}' FROM room_current_state s JOIN events e ON e.event_id = s.event_id \
         WHERE s.room_id = r.room_id AND s.event_type = 'm.room.topic' AND s.state_key = '') AS topic, \
       (SELECT e.pdu #>> '{content,url}' FROM room_current_state s JOIN events e ON e.event_id = s.event_id \
         WHERE s.room_id = r.room_id AND s.event_type = 'm.room.avatar' AND s.state_key = '') AS avatar, \
       (SELECT e.pdu #>> '{content,alias}' FROM room_current_state s JOIN events e ON e.event_id = s.event_id \
         WHERE s.room_id = r.room_id AND s.event_type = 'm.room.canonical_alias' AND s.state_key = '') AS canonical_alias, \
       COALESCE((SELECT c.members FROM room_member_counts c WHERE c.room_id = r.room_id AND c.membership = 'join'), 0) AS joined_members, \
       (SELECT count(*) FROM room_memberships m JOIN users u ON u.user_id = m.user_id \
         WHERE m.room_id = r.room_id AND m.membership = 'join') AS joined_local_members, \
       r.room_version AS version, r.creator, \
       (SELECT e.pdu #>> '{content,algorithm}' FROM room_current_state s JOIN events e ON e.event_id = s.event_id \
         WHERE s.room_id = r.room_id AND s.event_type = 'm.room.encryption' AND s.state_key = '') AS encryption, \
       COALESCE((SELECT (e.pdu #> '{content,m.federate}') <> 'false'::jsonb FROM room_current_state s \
         JOIN events e ON e.event_id = s.event_id \
         WHERE s.room_id = r.room_id AND s.event_type = 'm.room.create' AND s.state_key = ''), TRUE) AS federatable, \
       r.is_public AS public, \
       (SELECT e.pdu #>> '{content,join_rule}' FROM room_current_state s JOIN events e ON e.event_id = s.event_id \
         WHERE s.room_id = r.room_id AND s.event_type = 'm.room.join_rules' AND s.state_key = '') AS join_rules, \
       (SELECT e.pdu #>> '{content,guest_access}' FROM room_current_state s JOIN events e ON e.event_id = s.event_id \
         WHERE s.room_id = r.room_id AND s.event_type = 'm.room.guest_access' AND s.state_key = '') AS guest_access, \
       (SELECT e.pdu #>> '{content,history_visibility}' FROM room_current_state s JOIN events e ON e.event_id = s.event_id \
         WHERE s.room_id = r.room_id AND s.event_type = 'm.room.history_visibility' AND s.state_key = '') AS history_visibility, \
       (SELECT count(*) FROM room_current_state s WHERE s.room_id = r.room_id) AS state_events, \
       (SELECT e.pdu #>> '{content,type}' FROM room_current_state s JOIN events e ON e.event_id = s.event_id \
         WHERE s.room_id = r.room_id AND s.event_type = 'm.room.create' AND s.state_key = '') AS room_type, \
       (SELECT e.pdu #>> '{content,replacement_room}' FROM room_current_state s JOIN events e ON e.event_id = s.event_id \
         WHERE s.room_id = r.room_id AND s.event_type = 'm.room.tombstone' AND s.state_key = '') AS replacement_room \
     FROM rooms r WHERE $1::text IS NULL OR r.room_id = $1) ";

/// Which rooms a list shows and in what order.
#[derive(Debug, Clone, Default)]
pub struct RoomQuery {
    /// Only rooms whose name, canonical alias or ID contains this (case-insensitively).
    pub search_term: Option<String>,
    /// Only (`Some(true)`) or no (`Some(false)`) published rooms.
    pub public_rooms: Option<bool>,
    /// Only (`Some(true)`) or no (`Some(false)`) rooms without joined members.
    pub empty_rooms: Option<bool>,
    /// The order, and whether `dir=b` reverses it.
    pub order: Option<(RoomOrder, bool)>,
}

// The search term matches within the name, within the alias's localpart, or the whole room ID.
const ROOM_FILTERS: &str = " WHERE ($2::text IS NULL OR name ILIKE $2 \
       OR canonical_alias ILIKE '#' || $2 || ':%' OR room_id = $5) \
     AND ($3::bool IS NULL OR public = $3) \
     AND ($4::bool IS NULL OR (joined_members = 0) = $4)";

/// A page of rooms matching `query` and how many match in all.
pub async fn list_rooms(
    mut conn: &AsyncPgConnection,
    query: &RoomQuery,
    from: i64,
    limit: i64,
) -> QueryResult<(Vec<AdminRoomRow>, i64)> {
    let search = query.search_term.as_deref().map(super::like_contains);
    let (order, reverse) = query.order.unwrap_or((RoomOrder::Name, false));
    let direction = if order.descending_by_default() != reverse {
        "DESC"
    } else {
        "ASC"
    };
    let page_sql = format!(
        "{ROOM_FACTS}SELECT * FROM facts{ROOM_FILTERS} \
         ORDER BY {column} {direction}, room_id {direction} OFFSET $6 LIMIT $7",
        column = order.column()
    );
    let rows = diesel::sql_query(page_sql)
        .bind::<Nullable<Text>, _>(None::<&str>)
        .bind::<Nullable<Text>, _>(search.as_deref())
        .bind::<Nullable<Bool>, _>(query.public_rooms)
        .bind::<Nullable<Bool>, _>(query.empty_rooms)
        .bind::<Nullable<Text>, _>(query.search_term.as_deref())
        .bind::<BigInt, _>(from)
        .bind::<BigInt, _>(limit)
        .load::<AdminRoomRow>(&mut conn)
        .await?;
    #[derive(QueryableByName)]
    struct Total {
        #[diesel(sql_type = BigInt)]
        total: i64,
    }
    let total = diesel::sql_query(format!(
        "{ROOM_FACTS}SELECT count(*) AS total FROM facts{ROOM_FILTERS}"
    ))
    .bind::<Nullable<Text>, _>(None::<&str>)
    .bind::<Nullable<Text>, _>(search.as_deref())
    .bind::<Nullable<Bool>, _>(query.public_rooms)
    .bind::<Nullable<Bool>, _>(query.empty_rooms)
    .bind::<Nullable<Text>, _>(query.search_term.as_deref())
    .get_result::<Total>(&mut conn)
    .await?
    .total;
    Ok((rows, total))
}

/// One room's facts.
pub async fn get_room(
    mut conn: &AsyncPgConnection,
    room_id: &str,
) -> QueryResult<Option<AdminRoomRow>> {
    diesel::sql_query(format!("{ROOM_FACTS}SELECT * FROM facts"))
        .bind::<Nullable<Text>, _>(Some(room_id))
        .get_result(&mut conn)
        .await
        .optional()
}

/// The `mxc://` URIs the room's events point at (`url` and `info.thumbnail_url` of their
/// content), newest first.
pub async fn get_media_uris(
    mut conn: &AsyncPgConnection,
    room_id: &str,
) -> QueryResult<Vec<String>> {
    #[derive(QueryableByName)]
    struct Uri {
        #[diesel(sql_type = Text)]
        uri: String,
    }
    let rows: Vec<Uri> = super::cached_sql(
        "SELECT v.uri FROM events e, \
           LATERAL (VALUES (e.pdu #>> '{content,url}'), \
                           (e.pdu #>> '{content,info,thumbnail_url}')) AS v (uri) \
         WHERE e.room_id = $1 AND NOT e.outlier AND v.uri LIKE 'mxc://%' \
         ORDER BY e.stream_ordering DESC",
    )
    .bind::<Text, _>(room_id)
    .load(&mut conn)
    .await?;
    Ok(rows.into_iter().map(|r| r.uri).collect())
}

/// How many devices the room's joined local members have.
pub async fn count_joined_local_devices(
    mut conn: &AsyncPgConnection,
    room_id: &str,
) -> QueryResult<i64> {
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        count: i64,
    }
    Ok(super::cached_sql(
        "SELECT count(*) AS count FROM devices d JOIN room_memberships m ON m.user_id = d.user_id \
         WHERE m.room_id = $1 AND m.membership = 'join'",
    )
    .bind::<Text, _>(room_id)
    .get_result::<Count>(&mut conn)
    .await?
    .count)
}

/// Who blocked a room, if it is blocked.
pub async fn get_block(mut conn: &AsyncPgConnection, room_id: &str) -> QueryResult<Option<String>> {
    blocked_rooms::table
        .find(room_id)
        .select(blocked_rooms::blocked_by)
        .first(&mut conn)
        .await
        .optional()
}

/// Blocks a room (keeping the first blocker) or lifts the block.
pub async fn set_block(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    blocked_by: Option<&str>,
    now: i64,
) -> QueryResult<()> {
    match blocked_by {
        Some(by) => diesel::insert_into(blocked_rooms::table)
            .values((
                blocked_rooms::room_id.eq(room_id),
                blocked_rooms::blocked_by.eq(by),
                blocked_rooms::created_ts.eq(now),
            ))
            .on_conflict_do_nothing()
            .execute(&mut conn)
            .await
            .map(drop),
        None => diesel::delete(blocked_rooms::table.find(room_id))
            .execute(&mut conn)
            .await
            .map(drop),
    }
}

/// Deletes the room's local aliases and takes it out of the room directory; returns the
/// aliases removed.
pub async fn delete_aliases_and_unpublish(
    mut conn: &AsyncPgConnection,
    room_id: &str,
) -> QueryResult<Vec<String>> {
    let aliases = diesel::delete(room_aliases::table.filter(room_aliases::room_id.eq(room_id)))
        .returning(room_aliases::room_alias)
        .get_results(&mut conn)
        .await?;
    diesel::update(rooms::table.find(room_id))
        .set(rooms::is_public.eq(false))
        .execute(&mut conn)
        .await?;
    Ok(aliases)
}

/// Points the room's local aliases at `new_room_id` and takes the old room out of the room
/// directory; returns the aliases moved.
pub async fn move_aliases_and_unpublish(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    new_room_id: &str,
) -> QueryResult<Vec<String>> {
    let aliases = diesel::update(room_aliases::table.filter(room_aliases::room_id.eq(room_id)))
        .set(room_aliases::room_id.eq(new_room_id))
        .returning(room_aliases::room_alias)
        .get_results(&mut conn)
        .await?;
    diesel::update(rooms::table.find(room_id))
        .set(rooms::is_public.eq(false))
        .execute(&mut conn)
        .await?;
    Ok(aliases)
}

/// The room's members with one of `memberships`, as `(user ID, membership)`.
pub async fn get_memberships_in(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    memberships: &[&str],
) -> QueryResult<Vec<(String, String)>> {
    room_memberships::table
        .filter(room_memberships::room_id.eq(room_id))
        .filter(room_memberships::membership.eq_any(memberships))
        .select((room_memberships::user_id, room_memberships::membership))
        .load(&mut conn)
        .await
}

/// A background room deletion.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = admin_room_deletions)]
pub struct RoomDeletionRow {
    /// Its ID.
    pub delete_id: String,
    /// The room.
    pub room_id: String,
    /// `scheduled`, `active`, `complete` or `failed`.
    pub status: String,
    /// Why it failed.
    pub error: Option<String>,
    /// The shutdown result (kicked users, aliases removed).
    pub result: Option<Value>,
}

/// Records a new room deletion as scheduled.
pub async fn insert_room_deletion(
    mut conn: &AsyncPgConnection,
    delete_id: &str,
    room_id: &str,
    now: i64,
) -> QueryResult<()> {
    diesel::insert_into(admin_room_deletions::table)
        .values((
            admin_room_deletions::delete_id.eq(delete_id),
            admin_room_deletions::room_id.eq(room_id),
            admin_room_deletions::status.eq("scheduled"),
            admin_room_deletions::created_ts.eq(now),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Updates a room deletion's status (and result or error).
pub async fn update_room_deletion(
    mut conn: &AsyncPgConnection,
    delete_id: &str,
    status: &str,
    error: Option<&str>,
    result: Option<&Value>,
) -> QueryResult<()> {
    diesel::update(admin_room_deletions::table.find(delete_id))
        .set((
            admin_room_deletions::status.eq(status),
            admin_room_deletions::error.eq(error),
            admin_room_deletions::result.eq(result),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// One room deletion.
pub async fn get_room_deletion(
    mut conn: &AsyncPgConnection,
    delete_id: &str,
) -> QueryResult<Option<RoomDeletionRow>> {
    admin_room_deletions::table
        .find(delete_id)
        .select(RoomDeletionRow::as_select())
        .first(&mut conn)
        .await
        .optional()
}

/// The deletions of a room, oldest first.
pub async fn get_room_deletions(
    mut conn: &AsyncPgConnection,
    room_id: &str,
) -> QueryResult<Vec<RoomDeletionRow>> {
    admin_room_deletions::table
        .filter(admin_room_deletions::room_id.eq(room_id))
        .order(admin_room_deletions::created_ts)
        .select(RoomDeletionRow::as_select())
        .load(&mut conn)
        .await
}

/// Deletes everything this server keeps of a room: its events and their relations,
/// push actions and pending sends, state, memberships and their counts, receipts, room account
/// data, aliases, delayed events and sliding-sync rows. Reports and key backups stay (they are
/// the reporters' and the users' own records). Run inside the caller's transaction, under the
/// room's lock.
pub async fn purge_room(mut conn: &AsyncPgConnection, room_id: &str) -> QueryResult<()> {
    const STATEMENTS: &[&str] = &[
        "DELETE FROM event_txns WHERE event_id IN (SELECT event_id FROM events WHERE room_id = $1)",
        "DELETE FROM federation_outbox \
         WHERE event_id IN (SELECT event_id FROM events WHERE room_id = $1)",
        // By the events' positions: push actions have no index that starts with the room.
        "DELETE FROM event_push_actions \
         WHERE stream_ordering IN (SELECT stream_ordering FROM events WHERE room_id = $1)",
        "DELETE FROM receipts WHERE room_id = $1",
        "DELETE FROM unread_count_summaries \
         WHERE room_nid = (SELECT nid FROM rooms WHERE room_id = $1)",
        "DELETE FROM event_relations WHERE room_id = $1",
        "DELETE FROM delayed_events WHERE room_id = $1",
        "DELETE FROM sliding_sync_rooms WHERE room_id = $1",
        "DELETE FROM account_data WHERE room_id = $1",
        "DELETE FROM room_aliases WHERE room_id = $1",
        "DELETE FROM room_memberships WHERE room_id = $1",
        // Zero now: the triggers counted the deletions down.
        "DELETE FROM room_member_counts WHERE room_id = $1",
        "DELETE FROM room_current_state WHERE room_id = $1",
        "DELETE FROM events WHERE room_id = $1",
        // State groups (and by cascade their entries) go with the room.
        "DELETE FROM rooms WHERE room_id = $1",
    ];
    for statement in STATEMENTS {
        diesel::sql_query(*statement)
            .bind::<Text, _>(room_id)
            .execute(&mut conn)
            .await?;
    }
    Ok(())
}
