//! Rooms, events, transaction IDs, forward extremities, current state, aliases and the
//! server's signing keys.

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::Value;

use super::schema::{
    event_txns, events, room_aliases, room_current_state, room_memberships, rooms,
    server_signing_keys,
};

/// SQL: the `events` row is served to clients. It is not an outlier (it has a place in the
/// timeline), not rejected (it passed authorisation) and not soft-failed (it passed the
/// current state too). Every client read of events by room, position or ID applies it (also
/// as [`served`]); the partial index `events_room_id_depth_stream_ordering_idx` is built on
/// exactly this text, and `myelin_room_history` (migration 000043) and `myelin_newest_events`
/// (migration 000045) repeat it, so keep them the same.
pub const SERVED_TO_CLIENTS: &str = "NOT outlier AND rejected_reason IS NULL AND NOT soft_failed";

/// [`SERVED_TO_CLIENTS`] in diesel's query builder: no bind parameters, so statements stay
/// prepared once and the partial index stays usable under a generic plan.
#[diesel::dsl::auto_type]
pub fn served() -> _ {
    diesel::dsl::not(events::outlier)
        .and(events::rejected_reason.is_null())
        .and(diesel::dsl::not(events::soft_failed))
}

/// The columns of [`EventRow`], for raw SQL.
pub(super) const EVENT_COLUMNS: &str = "event_id, room_id, stream_ordering, depth, sender, \
    event_type, state_key, pdu, state_group, redacted_by";

/// A row of `rooms`.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = rooms)]
pub struct RoomRow {
    /// Room ID.
    pub room_id: String,
    /// Room version.
    pub room_version: String,
    /// Whether the room is published in the room directory.
    pub is_public: bool,
    /// The current state group.
    pub current_state_group: i64,
    /// The events no other event references yet (the next event's `prev_events`).
    pub forward_extremities: Vec<String>,
    /// The depth of the newest of them.
    pub tip_depth: i64,
}

/// A stored event.
#[derive(Debug, Clone, Queryable, Selectable, QueryableByName)]
#[diesel(table_name = events)]
pub struct EventRow {
    /// Event ID.
    pub event_id: String,
    /// Room ID.
    pub room_id: String,
    /// Position in the event stream.
    pub stream_ordering: i64,
    /// Depth in the room DAG.
    pub depth: i64,
    /// Sender.
    pub sender: String,
    /// Event type.
    pub event_type: String,
    /// State key, for state events.
    pub state_key: Option<String>,
    /// The full signed PDU.
    pub pdu: Value,
    /// State after the event (`None` for an outlier, which has no state of its own).
    pub state_group: Option<i64>,
    /// The redaction that redacted this event, if any.
    pub redacted_by: Option<String>,
}

impl EventRow {
    /// Where the event is and what it is, as history visibility judges it.
    pub fn placement(&self) -> Placement<'_> {
        Placement {
            room_id: &self.room_id,
            stream_ordering: self.stream_ordering,
            depth: self.depth,
            event_type: &self.event_type,
            state_key: self.state_key.as_deref(),
            state_group: self.state_group,
        }
    }
}

/// An event's place in its room without its content: all history visibility needs, so a
/// reader that only counts visible events need not load and parse their PDUs.
#[derive(Debug, Clone, Copy)]
pub struct Placement<'a> {
    /// Room ID.
    pub room_id: &'a str,
    /// Position in the event stream.
    pub stream_ordering: i64,
    /// Depth in the room DAG.
    pub depth: i64,
    /// Event type.
    pub event_type: &'a str,
    /// State key, for state events.
    pub state_key: Option<&'a str>,
    /// State after the event (`None` for an outlier).
    pub state_group: Option<i64>,
}

/// Insert form for `events` (its position is the one the transaction just took).
pub struct NewEvent<'a> {
    /// Event ID.
    pub event_id: &'a str,
    /// Room ID.
    pub room_id: &'a str,
    /// Depth.
    pub depth: i64,
    /// Sender.
    pub sender: &'a str,
    /// Event type.
    pub event_type: &'a str,
    /// State key.
    pub state_key: Option<&'a str>,
    /// Origin timestamp.
    pub origin_server_ts: i64,
    /// The full signed PDU.
    pub pdu: &'a Value,
    /// State after the event.
    pub state_group: i64,
}

/// Creates the room row.
pub async fn insert_room(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    version: &str,
    creator: &str,
    state_group: i64,
    now: i64,
) -> QueryResult<()> {
    diesel::insert_into(rooms::table)
        .values((
            rooms::room_id.eq(room_id),
            rooms::room_version.eq(version),
            rooms::creator.eq(creator),
            rooms::current_state_group.eq(state_group),
            rooms::created_ts.eq(now),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Looks a room up.
pub async fn get_room(mut conn: &AsyncPgConnection, room_id: &str) -> QueryResult<Option<RoomRow>> {
    rooms::table
        .find(room_id)
        .select(RoomRow::as_select())
        .first(&mut conn)
        .await
        .optional()
}

/// Moves a room to a new current state group.
pub async fn set_current_state_group(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    group: i64,
) -> QueryResult<()> {
    diesel::update(rooms::table.find(room_id))
        .set(rooms::current_state_group.eq(group))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Publishes a room in (or removes it from) the room directory.
pub async fn set_room_public(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    public: bool,
) -> QueryResult<bool> {
    Ok(diesel::update(rooms::table.find(room_id))
        .set(rooms::is_public.eq(public))
        .execute(&mut conn)
        .await?
        > 0)
}

/// A room published in the directory: its joined-member count and the content of the state
/// events a directory entry shows, by type.
#[derive(QueryableByName)]
pub struct PublicRoomRow {
    /// Room ID.
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub room_id: String,
    /// Joined members.
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub joined: i64,
    /// `{event type: content}` of its name, topic, alias, avatar, join rules, history
    /// visibility, guest access and create events.
    #[diesel(sql_type = diesel::sql_types::Jsonb)]
    pub state: Value,
}

/// Every room published in the directory, oldest first, in one query.
pub async fn get_public_rooms(mut conn: &AsyncPgConnection) -> QueryResult<Vec<PublicRoomRow>> {
    crate::storage::cached_sql(
        "SELECT r.room_id,
                COALESCE((SELECT c.members FROM room_member_counts c
                           WHERE c.room_id = r.room_id AND c.membership = 'join'), 0) AS joined,
                (SELECT COALESCE(jsonb_object_agg(cs.event_type, e.pdu->'content'), '{}')
                   FROM room_current_state cs JOIN events e ON e.event_id = cs.event_id
                  WHERE cs.room_id = r.room_id AND cs.state_key = ''
                    AND cs.event_type IN ('m.room.name', 'm.room.topic', 'm.room.canonical_alias',
                        'm.room.avatar', 'm.room.join_rules', 'm.room.history_visibility',
                        'm.room.guest_access', 'm.room.create')) AS state
         FROM rooms r WHERE r.is_public ORDER BY r.created_ts",
    )
    .load(&mut conn)
    .await
}

/// Stores an event at the position the transaction just took ([`super::streams::next_position`],
/// which may be sent just before, in the same pipeline), or at an explicit `provisional`
/// position (see [`renumber_provisional_positions`]).
pub async fn insert_event(
    mut conn: &AsyncPgConnection,
    event: &NewEvent<'_>,
    provisional: Option<i64>,
) -> QueryResult<()> {
    use diesel::sql_types::{BigInt, Jsonb, Nullable, Text};
    fn sql(position: &str) -> String {
        format!(
            "INSERT INTO events (event_id, room_id, stream_ordering, depth, sender, event_type, \
             state_key, origin_server_ts, pdu, state_group) \
             VALUES ($1, $2, {position}, $3, $4, $5, $6, $7, $8, $9)"
        )
    }
    static AT_TAKEN: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(|| sql(super::streams::TAKEN_EVENT_POSITION));
    static AT_PROVISIONAL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| sql("$10"));
    let query = crate::storage::cached_sql(match provisional {
        Some(_) => AT_PROVISIONAL.as_str(),
        None => AT_TAKEN.as_str(),
    })
    .bind::<Text, _>(event.event_id)
    .bind::<Text, _>(event.room_id)
    .bind::<BigInt, _>(event.depth)
    .bind::<Text, _>(event.sender)
    .bind::<Text, _>(event.event_type)
    .bind::<Nullable<Text>, _>(event.state_key)
    .bind::<BigInt, _>(event.origin_server_ts)
    .bind::<Jsonb, _>(event.pdu)
    .bind::<BigInt, _>(event.state_group);
    match provisional {
        Some(position) => query.bind::<BigInt, _>(position).execute(&mut conn).await,
        None => query.execute(&mut conn).await,
    }
    .map(drop)
}

/// Provisional positions (see [`renumber_provisional_positions`]) are at or below this; the
/// positions of backfilled events, also negative, stay above it.
pub const PROVISIONAL_POSITIONS_BELOW: i64 = -(1 << 40);

/// Gives the events a multi-event transaction (createRoom, an upgrade) stored at provisional
/// positions their real positions, in the order they were stored, all taken at once just
/// before commit: readers are held below a transaction's positions until it commits, so they
/// are taken as late as possible, not at the transaction's first event. Rows that copy an
/// event's position (push actions, relations, memberships) follow it.
pub async fn renumber_provisional_positions(
    mut conn: &AsyncPgConnection,
    room_ids: &[&str],
    count: i64,
) -> QueryResult<()> {
    use diesel::sql_types::{Array, BigInt, Text};
    if count == 0 {
        return Ok(());
    }
    // Push actions name their event by its position alone, so they move in the events'
    // statement, by the old position each event's update returns beside its new one.
    let events_and_push_actions = crate::storage::cached_sql(MOVE_EVENTS_AND_PUSH_ACTIONS)
        .bind::<Array<Text>, _>(room_ids)
        .bind::<BigInt, _>(count)
        .bind::<BigInt, _>(PROVISIONAL_POSITIONS_BELOW)
        .execute(&mut conn);
    let (relations, memberships) = (
        follow_event_positions(conn, FOLLOW_RELATIONS, room_ids),
        follow_event_positions(conn, FOLLOW_MEMBERSHIPS, room_ids),
    );
    tokio::try_join!(events_and_push_actions, relations, memberships).map(drop)
}

// The position bound is written into the text, not bound: only a literal lets PostgreSQL use
// the partial indexes of provisional rows (migration 000036) in a plan made once (and keeps
// the push actions' range on their index of positions small whatever the plan).
const MOVE_EVENTS_AND_PUSH_ACTIONS: &str =
    "WITH taken AS (SELECT myelin_take_positions('events', $2::INT) AS positions), \
     moved AS ( \
         UPDATE events e SET stream_ordering = taken.positions[r.rn] \
         FROM taken, (SELECT event_id, stream_ordering, \
                             row_number() OVER (ORDER BY stream_ordering DESC) AS rn \
                      FROM events WHERE room_id = ANY($1) AND stream_ordering <= $3) r \
         WHERE e.event_id = r.event_id \
         RETURNING r.stream_ordering AS provisional, e.stream_ordering AS position) \
     UPDATE event_push_actions a SET stream_ordering = m.position FROM moved m \
     WHERE a.stream_ordering = m.provisional AND a.stream_ordering <= -1099511627776";
const FOLLOW_RELATIONS: &str = "UPDATE event_relations t SET stream_ordering = e.stream_ordering \
    FROM events e WHERE t.event_id = e.event_id AND t.room_id = ANY($1) \
    AND t.stream_ordering <= -1099511627776";
const FOLLOW_MEMBERSHIPS: &str =
    "UPDATE room_memberships t SET stream_ordering = e.stream_ordering \
    FROM events e WHERE t.event_id = e.event_id AND t.room_id = ANY($1) \
    AND t.stream_ordering <= -1099511627776";

/// Moves rows that copy a provisionally stored event's position to its real one.
async fn follow_event_positions(
    mut conn: &AsyncPgConnection,
    sql: &'static str,
    room_ids: &[&str],
) -> QueryResult<usize> {
    crate::storage::cached_sql(sql)
        .bind::<diesel::sql_types::Array<diesel::sql_types::Text>, _>(room_ids)
        .execute(&mut conn)
        .await
}

/// Loads one event served to clients (see [`SERVED_TO_CLIENTS`]).
pub async fn get_event(
    mut conn: &AsyncPgConnection,
    event_id: &str,
) -> QueryResult<Option<EventRow>> {
    events::table
        .find(event_id)
        .filter(served())
        .select(EventRow::as_select())
        .first(&mut conn)
        .await
        .optional()
}

/// Loads several events served to clients (missing ones are skipped).
pub async fn get_events(
    mut conn: &AsyncPgConnection,
    event_ids: &[String],
) -> QueryResult<Vec<EventRow>> {
    // Callers often have nothing to look up (no redactions on a page): skip the round trip.
    if event_ids.is_empty() {
        return Ok(Vec::new());
    }
    events::table
        .filter(events::event_id.eq_any(event_ids))
        .filter(served())
        .select(EventRow::as_select())
        .load(&mut conn)
        .await
}

/// Loads one event that a state names (a state group, a membership, current state).
pub async fn get_state_event(
    conn: &AsyncPgConnection,
    event_id: &str,
) -> QueryResult<Option<EventRow>> {
    let ids = [event_id.to_owned()];
    Ok(get_state_events(conn, &ids).await?.into_iter().next())
}

/// Loads the events a state names (missing ones are skipped). A state is served as it was
/// resolved: it may name outliers (auth events fetched on their own are state events like any
/// other) and soft-failed events (a later event may bring one into the state), never a
/// rejected one (filtered here as a guard).
pub async fn get_state_events(
    mut conn: &AsyncPgConnection,
    event_ids: &[String],
) -> QueryResult<Vec<EventRow>> {
    if event_ids.is_empty() {
        return Ok(Vec::new());
    }
    events::table
        .filter(events::event_id.eq_any(event_ids))
        .filter(events::rejected_reason.is_null())
        .select(EventRow::as_select())
        .load(&mut conn)
        .await
}

/// Marks an event as redacted by `redaction_id` and replaces its PDU with the pruned form.
pub async fn set_redacted(
    mut conn: &AsyncPgConnection,
    event_id: &str,
    redaction_id: &str,
    pruned_pdu: &Value,
) -> QueryResult<()> {
    // The first redaction is the one clients are told about; the PDU is pruned either way.
    // The room's count tells every process's cached parts of the event that they are stale.
    crate::storage::cached_sql(
        "WITH redacted AS ( \
             UPDATE events SET pdu = $2, redacted_by = COALESCE(redacted_by, $3) \
             WHERE event_id = $1 RETURNING room_id \
         ) \
         UPDATE rooms SET redactions = redactions + 1 \
         WHERE room_id IN (SELECT room_id FROM redacted)",
    )
    .bind::<diesel::sql_types::Text, _>(event_id)
    .bind::<diesel::sql_types::Jsonb, _>(pruned_pdu)
    .bind::<diesel::sql_types::Text, _>(redaction_id)
    .execute(&mut conn)
    .await?;
    // A redacted member event no longer names anyone or shows an avatar.
    diesel::update(room_memberships::table.filter(room_memberships::event_id.eq(event_id)))
        .set((
            room_memberships::display_name.eq(None::<String>),
            room_memberships::avatar_url.eq(None::<String>),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// How many redactions the room has had (`None` for a room not stored): what tells the state
/// events a process keeps in memory apart from stale ones.
pub async fn get_redaction_count(
    mut conn: &AsyncPgConnection,
    room_id: &str,
) -> QueryResult<Option<i64>> {
    rooms::table
        .filter(rooms::room_id.eq(room_id))
        .select(rooms::redactions)
        .first(&mut conn)
        .await
        .optional()
}

/// The event a client transaction produced, if any.
pub async fn get_txn_event(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    device_id: &str,
    txn_id: &str,
) -> QueryResult<Option<String>> {
    event_txns::table
        .find((user_id, device_id, txn_id))
        .select(event_txns::event_id)
        .first(&mut conn)
        .await
        .optional()
}

/// Records a client transaction; a concurrent duplicate fails with a unique violation.
pub async fn insert_txn(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    device_id: &str,
    txn_id: &str,
    event_id: &str,
    now: i64,
) -> QueryResult<()> {
    diesel::insert_into(event_txns::table)
        .values((
            event_txns::user_id.eq(user_id),
            event_txns::device_id.eq(device_id),
            event_txns::txn_id.eq(txn_id),
            event_txns::event_id.eq(event_id),
            event_txns::created_ts.eq(now),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Updates the current state with one state event.
pub async fn set_current_state(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    event_type: &str,
    state_key: &str,
    event_id: &str,
) -> QueryResult<()> {
    diesel::insert_into(room_current_state::table)
        .values((
            room_current_state::room_id.eq(room_id),
            room_current_state::event_type.eq(event_type),
            room_current_state::state_key.eq(state_key),
            room_current_state::event_id.eq(event_id),
        ))
        .on_conflict((
            room_current_state::room_id,
            room_current_state::event_type,
            room_current_state::state_key,
        ))
        .do_update()
        .set(room_current_state::event_id.eq(event_id))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// The current state of a room as `(type, state_key, event_id)`.
pub async fn get_current_state_ids(
    mut conn: &AsyncPgConnection,
    room_id: &str,
) -> QueryResult<Vec<(String, String, String)>> {
    room_current_state::table
        .filter(room_current_state::room_id.eq(room_id))
        .select((
            room_current_state::event_type,
            room_current_state::state_key,
            room_current_state::event_id,
        ))
        .load(&mut conn)
        .await
}

/// One current state event ID.
pub async fn get_current_state_id(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    event_type: &str,
    state_key: &str,
) -> QueryResult<Option<String>> {
    room_current_state::table
        .find((room_id, event_type, state_key))
        .select(room_current_state::event_id)
        .first(&mut conn)
        .await
        .optional()
}

/// The current state event of `(type, state_key)`, if any.
pub async fn get_current_state_event(
    conn: &AsyncPgConnection,
    room_id: &str,
    event_type: &str,
    state_key: &str,
) -> QueryResult<Option<EventRow>> {
    let rows = get_current_state_events(conn, room_id, &[(event_type, state_key)]).await?;
    Ok(rows.into_iter().next())
}

/// The current state events of several `(type, state_key)` pairs, in one query; pairs with
/// no current state are absent from the result.
///
/// Each pair is looked up by the whole key of `room_current_state`, then its event by ID, in
/// subqueries the planner cannot turn into a scan: as a join filtered by the lists of types and
/// keys, the plan PostgreSQL kept from a new server's empty tables read every state entry of
/// the room (20,000 in a room of 20,000 members, for each join's auth events).
pub async fn get_current_state_events(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    keys: &[(&str, &str)],
) -> QueryResult<Vec<EventRow>> {
    use diesel::sql_types::{Array, Text};
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "SELECT e.* FROM unnest($2::TEXT[], $3::TEXT[]) AS k(event_type, state_key) \
             CROSS JOIN LATERAL ( \
                 SELECT {EVENT_COLUMNS} FROM events WHERE event_id = ( \
                     SELECT c.event_id FROM room_current_state c \
                     WHERE c.room_id = $1 AND c.event_type = k.event_type \
                       AND c.state_key = k.state_key) \
                 OFFSET 0) e"
        )
    });
    // A pair asked twice (a join's sender and target are one user) is one row.
    let mut pairs = keys.to_vec();
    pairs.sort_unstable();
    pairs.dedup();
    let types: Vec<&str> = pairs.iter().map(|(kind, _)| *kind).collect();
    let state_keys: Vec<&str> = pairs.iter().map(|(_, key)| *key).collect();
    super::cached_sql(SQL.as_str())
        .bind::<Text, _>(room_id)
        .bind::<Array<Text>, _>(types)
        .bind::<Array<Text>, _>(state_keys)
        .load(&mut conn)
        .await
}

/// Creates an alias; a taken alias fails with a unique violation.
pub async fn insert_alias(
    mut conn: &AsyncPgConnection,
    alias: &str,
    room_id: &str,
    creator: &str,
    now: i64,
) -> QueryResult<()> {
    diesel::insert_into(room_aliases::table)
        .values((
            room_aliases::room_alias.eq(alias),
            room_aliases::room_id.eq(room_id),
            room_aliases::creator.eq(creator),
            room_aliases::created_ts.eq(now),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Resolves an alias to `(room_id, creator)`.
pub async fn get_alias(
    mut conn: &AsyncPgConnection,
    alias: &str,
) -> QueryResult<Option<(String, String)>> {
    room_aliases::table
        .find(alias)
        .select((room_aliases::room_id, room_aliases::creator))
        .first(&mut conn)
        .await
        .optional()
}

/// Deletes an alias.
pub async fn delete_alias(mut conn: &AsyncPgConnection, alias: &str) -> QueryResult<bool> {
    Ok(diesel::delete(room_aliases::table.find(alias))
        .execute(&mut conn)
        .await?
        > 0)
}

/// All local aliases of a room.
pub async fn get_room_aliases(
    mut conn: &AsyncPgConnection,
    room_id: &str,
) -> QueryResult<Vec<String>> {
    room_aliases::table
        .filter(room_aliases::room_id.eq(room_id))
        .order(room_aliases::created_ts)
        .select(room_aliases::room_alias)
        .load(&mut conn)
        .await
}

/// The stored signing key `(key_id, pkcs8 DER)`, if one exists.
pub async fn get_signing_key(
    mut conn: &AsyncPgConnection,
) -> QueryResult<Option<(String, Vec<u8>)>> {
    server_signing_keys::table
        .order((server_signing_keys::created_ts, server_signing_keys::key_id))
        .select((server_signing_keys::key_id, server_signing_keys::secret_der))
        .first(&mut conn)
        .await
        .optional()
}

/// Stores a signing key unless one exists already (the first writer wins).
pub async fn insert_signing_key(
    mut conn: &AsyncPgConnection,
    key_id: &str,
    der: &[u8],
    now: i64,
) -> QueryResult<()> {
    diesel::insert_into(server_signing_keys::table)
        .values((
            server_signing_keys::key_id.eq(key_id),
            server_signing_keys::secret_der.eq(der),
            server_signing_keys::created_ts.eq(now),
        ))
        .on_conflict_do_nothing()
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Points every alias of one room at another (room upgrades).
pub async fn move_aliases(mut conn: &AsyncPgConnection, from: &str, to: &str) -> QueryResult<()> {
    diesel::update(room_aliases::table.filter(room_aliases::room_id.eq(from)))
        .set(room_aliases::room_id.eq(to))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Transaction IDs of a user's device among the given events (for the remote echo).
pub async fn get_txn_ids_for_device(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    device_id: &str,
    event_ids: &[String],
) -> QueryResult<Vec<(String, String)>> {
    event_txns::table
        .filter(event_txns::user_id.eq(user_id))
        .filter(event_txns::device_id.eq(device_id))
        .filter(event_txns::event_id.eq_any(event_ids))
        .select((event_txns::event_id, event_txns::txn_id))
        .load(&mut conn)
        .await
}

/// Sends a PostgreSQL notification: inside a [`super::transaction::transaction`] (every
/// transaction of the server) right after its commit, and only if it commits; outside one at once.
pub async fn notify(mut conn: &AsyncPgConnection, channel: &str, payload: &str) -> QueryResult<()> {
    if super::transaction::defer_notification(channel, payload) {
        return Ok(());
    }
    crate::storage::cached_sql("SELECT pg_notify($1, $2)")
        .bind::<diesel::sql_types::Text, _>(channel)
        .bind::<diesel::sql_types::Text, _>(payload)
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Sends notifications, as (channel, payload), in one statement.
pub async fn notify_all(
    mut conn: &AsyncPgConnection,
    notifications: &[(String, String)],
) -> QueryResult<()> {
    let (channels, payloads): (Vec<&str>, Vec<&str>) = notifications
        .iter()
        .map(|(channel, payload)| (channel.as_str(), payload.as_str()))
        .unzip();
    crate::storage::cached_sql(
        "SELECT pg_notify(n.channel, n.payload) FROM unnest($1::TEXT[], $2::TEXT[]) AS n(channel, payload)",
    )
    .bind::<diesel::sql_types::Array<diesel::sql_types::Text>, _>(channels)
    .bind::<diesel::sql_types::Array<diesel::sql_types::Text>, _>(payloads)
    .execute(&mut conn)
    .await
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn followers_name_the_provisional_bound_their_indexes_are_made_for() {
        let bound = format!("<= {PROVISIONAL_POSITIONS_BELOW}");
        for sql in [
            MOVE_EVENTS_AND_PUSH_ACTIONS,
            FOLLOW_RELATIONS,
            FOLLOW_MEMBERSHIPS,
        ] {
            assert!(sql.ends_with(&bound), "{sql}");
        }
    }
}
