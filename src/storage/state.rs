//! State snapshots as delta chains (`state_groups` + `state_group_entries`): skip deltas on
//! a snapshot, see [`insert_state_delta`].

use std::collections::HashMap;

use diesel::{
    prelude::*,
    sql_types::{Array, BigInt, Bool, Integer, Nullable, Text},
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::schema::{state_group_entries, state_groups};

/// A state map: `(event type, state key) -> event ID`.
pub type StateIds = HashMap<(String, String), String>;

/// Longest delta chain before a full snapshot is written (skip deltas stay far below it;
/// chains written before them may reach it).
pub const STATE_CHAIN_LIMIT: i32 = 64;

/// Fewest state changes between two snapshots of a lineage: small rooms' snapshots are
/// small, and writing one for every few changes would cost more than it saves.
const MIN_CHANGES_PER_SNAPSHOT: i32 = 64;

/// SQL that starts with the delta chain of group `$1` as `chain (state_group, parent_group,
/// level)`, nearest first, followed by the rest of the statement given. Each step is one
/// primary-key lookup of the parent (the `LIMIT` keeps the planner from joining instead): as a
/// join, PostgreSQL planned the step once for a guessed ten rows and, for a table of a few
/// thousand groups, hashed all of it again at every step (19 ms for 64 steps at 3,000 groups,
/// statistics fresh; 0.16 ms as lookups).
macro_rules! with_chain {
    ($($rest:tt)+) => {
        concat!(
            "WITH RECURSIVE chain (state_group, parent_group, level) AS ( \
                 SELECT state_group, parent_group, 0 FROM state_groups WHERE state_group = $1 \
                 UNION ALL \
                 SELECT g.state_group, g.parent_group, c.level + 1 \
                 FROM chain c CROSS JOIN LATERAL ( \
                     SELECT state_group, parent_group FROM state_groups \
                     WHERE state_group = c.parent_group LIMIT 1 \
                 ) g \
             )",
            $($rest)+
        )
    };
}

/// SQL after [`with_chain`]: the state's entries `e (event_type, state_key, event_id)`, each
/// group's entries read by index (`OFFSET 0` keeps the planner from turning that into a hash
/// join over every group's entries: 13 ms instead of 1 ms for a 24-group chain once
/// `state_group_entries` held 45,000 rows), nearer deltas winning.
macro_rules! chain_entries {
    () => {
        " SELECT DISTINCT ON (e.event_type, e.state_key) e.event_type, e.state_key, e.event_id \
         FROM chain c CROSS JOIN LATERAL ( \
             SELECT event_type, state_key, event_id FROM state_group_entries \
             WHERE state_group = c.state_group OFFSET 0 \
         ) e \
         ORDER BY e.event_type, e.state_key, c.level"
    };
}

/// SQL of a chain step's entries `(event_type, state_key, event_id)` of group `c.state_group`
/// but its member events: the ranges of types before and after `m.room.member`, each read by
/// index (for the lazy-loading reads, which add the members they want).
macro_rules! entries_but_members {
    () => {
        " SELECT event_type, state_key, event_id FROM state_group_entries \
         WHERE state_group = c.state_group AND event_type < 'm.room.member' \
         UNION ALL \
         SELECT event_type, state_key, event_id FROM state_group_entries \
         WHERE state_group = c.state_group AND event_type > 'm.room.member'"
    };
}

/// [`chain_entries`] with only the member entries of the users in `$2`: each group's entries
/// are read by index as the ranges before, at and after `m.room.member`, so a big room's
/// thousands of members are not read to be dropped.
macro_rules! chain_entries_with_members {
    () => {
        concat!(
            " SELECT DISTINCT ON (e.event_type, e.state_key) e.event_type, e.state_key, \
             e.event_id FROM chain c CROSS JOIN LATERAL (",
            entries_but_members!(),
            " UNION ALL \
             SELECT event_type, state_key, event_id FROM state_group_entries \
             WHERE state_group = c.state_group AND event_type = 'm.room.member' \
               AND state_key = ANY($2) \
             OFFSET 0 \
         ) e \
         ORDER BY e.event_type, e.state_key, c.level"
        )
    };
}

/// SQL after [`with_chain`] and `, entries AS (` one of the entry selections `)`: the
/// entries' event IDs, each with the room's redaction count (`rooms.redactions`) read in the
/// same snapshot, as root 1.
macro_rules! ids_of_entries {
    () => {
        " SELECT 1::BIGINT AS root, entries.event_id, ( \
             SELECT r.redactions FROM state_groups g JOIN rooms r ON r.room_id = g.room_id \
             WHERE g.state_group = $1 \
         ) AS room_redactions \
         FROM entries"
    };
}

/// SQL of a bound on the entries of the `state_groups` row in scope, as `most_entries`,
/// known without reading them: a snapshot's count, or for a skip delta at depth d (a delta
/// on the group at `d & (d - 1)`) the changes since that group, at most d's lowest set bit.
macro_rules! most_entries {
    () => {
        " CASE WHEN parent_group IS NULL THEN snapshot_rows \
         ELSE delta_depth & -delta_depth END AS most_entries"
    };
}

#[derive(QueryableByName)]
struct Entry {
    #[diesel(sql_type = Text)]
    event_type: String,
    #[diesel(sql_type = Text)]
    state_key: String,
    #[diesel(sql_type = Text)]
    event_id: String,
}

/// The full state of a group: its chain of deltas, nearer deltas winning.
pub async fn get_state_ids(mut conn: &AsyncPgConnection, group: i64) -> QueryResult<StateIds> {
    let entries: Vec<Entry> = crate::storage::cached_sql(with_chain!(chain_entries!()))
        .bind::<BigInt, _>(group)
        .load(&mut conn)
        .await?;
    Ok(state_map(entries))
}

fn state_map(entries: Vec<Entry>) -> StateIds {
    entries
        .into_iter()
        .map(|e| ((e.event_type, e.state_key), e.event_id))
        .collect()
}

/// The state of a group, as [`get_state_ids`], with only the members in `members` of its
/// member entries (a lazy-loading sync's).
pub async fn get_state_ids_with_members(
    mut conn: &AsyncPgConnection,
    group: i64,
    members: &[String],
) -> QueryResult<StateIds> {
    let entries: Vec<Entry> =
        crate::storage::cached_sql(with_chain!(chain_entries_with_members!()))
            .bind::<BigInt, _>(group)
            .bind::<Array<Text>, _>(members)
            .load(&mut conn)
            .await?;
    Ok(state_map(entries))
}

/// A state's event IDs, and how many redactions its room had when they were read.
#[derive(Debug, Default)]
pub struct CountedStateIds {
    /// The state's event IDs, in no order.
    pub event_ids: Vec<String>,
    /// The room's redaction count in the same snapshot (0 for an empty state).
    pub room_redactions: i64,
}

#[derive(QueryableByName)]
struct CountedEntry {
    #[diesel(sql_type = BigInt)]
    root: i64,
    #[diesel(sql_type = Text)]
    event_id: String,
    #[diesel(sql_type = BigInt)]
    room_redactions: i64,
}

/// The event IDs of a group's state, with the room's redaction count in the same snapshot
/// (what tells cached client parts of them apart from stale ones).
pub async fn get_counted_state_ids(
    mut conn: &AsyncPgConnection,
    group: i64,
) -> QueryResult<CountedStateIds> {
    let entries: Vec<CountedEntry> = crate::storage::cached_sql(with_chain!(
        ", entries AS (",
        chain_entries!(),
        ")",
        ids_of_entries!()
    ))
    .bind::<BigInt, _>(group)
    .load(&mut conn)
    .await?;
    Ok(counted_states(1, entries).pop().unwrap_or_default())
}

/// [`get_counted_state_ids`] of many groups in one statement, with only the member events
/// of each group's `members` (one list per group, a lazy-loading sync's), in the groups'
/// order. PostgreSQL planned the statement of one group anew for each, at three times its
/// execution (0.22 ms against 0.07 ms in a lazy sync of 300 rooms), so a sync's batch of rooms
/// shares one plan. A whole state is read a group a statement: dropping the entries a nearer
/// delta replaced sorts them, and many small sorts cost less than one of a whole batch (a full
/// sync of 300 rooms of 300 members: 190 ms of PostgreSQL's CPU in batches of 32, 150 ms a
/// room at a time).
pub async fn get_counted_member_state_ids_of_groups(
    mut conn: &AsyncPgConnection,
    groups: &[i64],
    members: &[&[String]],
) -> QueryResult<Vec<CountedStateIds>> {
    if groups.is_empty() {
        return Ok(Vec::new());
    }
    // All the members in one array, root r's from `starts[r]` to `starts[r + 1] - 1` (both
    // 1-based, as SQL's), so each chain step takes its own root's slice: unnesting the whole
    // batch's (root, user) pairs at every step and keeping the root's cost 14 ms for 32 rooms
    // of 11 wanted members (a lazy sync of 500 rooms went from 150 to 300 ms).
    // A step reads its group's member entries in one of two ways, chosen by a bound on the
    // group's size that needs no statistics (`most_entries`): a group of at most four entries
    // per wanted member is read whole and filtered, a bigger one looked up one wanted member
    // at a time (the `LIMIT` keeps each a primary-key lookup). Both give the same rows. Filtering
    // alone made a big account's batch 2.5x slower (300 members read for 2 wanted), lookups
    // alone scenario 5's 1.7x (11 lookups in groups of 4 entries).
    let mut starts: Vec<i32> = Vec::with_capacity(members.len() + 1);
    let mut users: Vec<&str> = Vec::new();
    for room_members in members {
        starts.push(sql_index(users.len())?);
        users.extend(room_members.iter().map(String::as_str));
    }
    starts.push(sql_index(users.len())?);
    // The chain of each group ("root", numbered from 1), each step a primary-key lookup as in
    // `with_chain`, then each step's entries as in `chain_entries_with_members`.
    let entries: Vec<CountedEntry> = crate::storage::cached_sql(concat!(
        "WITH RECURSIVE roots AS ( \
             SELECT r.i AS root, r.g AS state_group, ( \
                 SELECT rm.redactions FROM state_groups sg \
                 JOIN rooms rm ON rm.room_id = sg.room_id WHERE sg.state_group = r.g \
             ) AS room_redactions \
             FROM unnest($1::BIGINT[]) WITH ORDINALITY AS r(g, i) \
         ), chain (root, state_group, parent_group, most_entries, level) AS ( \
             SELECT roots.root, g.state_group, g.parent_group, g.most_entries, 0 \
             FROM roots CROSS JOIN LATERAL ( \
                 SELECT state_group, parent_group, ",
        most_entries!(),
        " FROM state_groups WHERE state_group = roots.state_group LIMIT 1 \
             ) g \
             UNION ALL \
             SELECT c.root, g.state_group, g.parent_group, g.most_entries, c.level + 1 \
             FROM chain c CROSS JOIN LATERAL ( \
                 SELECT state_group, parent_group, ",
        most_entries!(),
        " FROM state_groups WHERE state_group = c.parent_group LIMIT 1 \
             ) g \
         ), entries AS ( \
             SELECT DISTINCT ON (c.root, e.event_type, e.state_key) c.root, e.event_id \
             FROM chain c \
             CROSS JOIN LATERAL (SELECT $3[$2[c.root]:$2[c.root + 1] - 1] AS wanted OFFSET 0) w \
             CROSS JOIN LATERAL (",
        entries_but_members!(),
        " UNION ALL \
                 SELECT event_type, state_key, event_id FROM state_group_entries \
                 WHERE c.most_entries <= 4 * cardinality(w.wanted) \
                   AND state_group = c.state_group AND event_type = 'm.room.member' \
                   AND state_key = ANY(w.wanted) \
                 UNION ALL \
                 SELECT s.event_type, s.state_key, s.event_id \
                 FROM unnest(w.wanted) AS m(user_id) CROSS JOIN LATERAL ( \
                     SELECT event_type, state_key, event_id FROM state_group_entries \
                     WHERE state_group = c.state_group AND event_type = 'm.room.member' \
                       AND state_key = m.user_id LIMIT 1 \
                 ) s \
                 WHERE c.most_entries > 4 * cardinality(w.wanted) \
                 OFFSET 0 \
             ) e \
             ORDER BY c.root, e.event_type, e.state_key, c.level \
         ) \
         SELECT entries.root, entries.event_id, roots.room_redactions \
         FROM entries JOIN roots ON roots.root = entries.root"
    ))
    .bind::<Array<BigInt>, _>(groups)
    .bind::<Array<Integer>, _>(starts)
    .bind::<Array<Text>, _>(users)
    .load(&mut conn)
    .await?;
    Ok(counted_states(groups.len(), entries))
}

/// A 0-based place in a Rust list as a 1-based SQL array subscript.
fn sql_index(place: usize) -> QueryResult<i32> {
    i32::try_from(place + 1).map_err(|err| diesel::result::Error::SerializationError(err.into()))
}

/// The states of `roots` roots (numbered from 1) from their entries.
fn counted_states(roots: usize, entries: Vec<CountedEntry>) -> Vec<CountedStateIds> {
    let mut states: Vec<CountedStateIds> = (0..roots).map(|_| Default::default()).collect();
    for entry in entries {
        let state = usize::try_from(entry.root - 1)
            .ok()
            .and_then(|i| states.get_mut(i));
        if let Some(state) = state {
            state.room_redactions = entry.room_redactions;
            state.event_ids.push(entry.event_id);
        }
    }
    states
}

/// Where a group stands in its lineage (the groups since a snapshot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// Groups read after this one to resolve it (0 for a snapshot).
    pub chain_length: i32,
    /// State changes since the lineage's snapshot.
    pub depth: i32,
    /// Entries of the lineage's snapshot.
    pub snapshot_rows: i32,
}

/// Where `group` stands.
pub async fn get_place(mut conn: &AsyncPgConnection, group: i64) -> QueryResult<Place> {
    let (chain_length, depth, snapshot_rows) = state_groups::table
        .find(group)
        .select((
            state_groups::chain_length,
            state_groups::delta_depth,
            state_groups::snapshot_rows,
        ))
        .first(&mut conn)
        .await?;
    Ok(Place {
        chain_length,
        depth,
        snapshot_rows,
    })
}

/// Stores a full snapshot; `prev` is the group the state came from, if any (the state
/// before the event that made it).
pub async fn insert_state_snapshot(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    prev: Option<i64>,
    entries: &[(&str, &str, &str)],
) -> QueryResult<(i64, Place)> {
    let place = Place {
        chain_length: 0,
        depth: 0,
        snapshot_rows: i32::try_from(entries.len()).unwrap_or(i32::MAX),
    };
    let group = insert_group(conn, room_id, None, prev, place).await?;
    let rows: Vec<_> = entries
        .iter()
        .map(|(event_type, state_key, event_id)| {
            (
                state_group_entries::state_group.eq(group),
                state_group_entries::event_type.eq(*event_type),
                state_group_entries::state_key.eq(*state_key),
                state_group_entries::event_id.eq(*event_id),
            )
        })
        .collect();
    for chunk in rows.chunks(5000) {
        diesel::insert_into(state_group_entries::table)
            .values(chunk)
            .execute(&mut conn)
            .await?;
    }
    Ok((group, place))
}

/// A new group's row: a delta on `base` (a snapshot without), made from the state of `prev`.
async fn insert_group(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    base: Option<i64>,
    prev: Option<i64>,
    place: Place,
) -> QueryResult<i64> {
    diesel::insert_into(state_groups::table)
        .values((
            state_groups::room_id.eq(room_id),
            state_groups::parent_group.eq(base),
            state_groups::prev_group.eq(prev),
            state_groups::chain_length.eq(place.chain_length),
            state_groups::delta_depth.eq(place.depth),
            state_groups::snapshot_rows.eq(place.snapshot_rows),
        ))
        .returning(state_groups::state_group)
        .get_result(&mut conn)
        .await
}

#[derive(QueryableByName)]
struct Base {
    #[diesel(sql_type = BigInt)]
    state_group: i64,
    #[diesel(sql_type = Integer)]
    chain_length: i32,
}

/// Stores the state of `prev` with `changes` applied: a delta, or a snapshot once the
/// changes since the last one outnumber its entries (so resolving a group reads at most
/// about twice the state's size, and snapshots cost about one entry per change).
pub async fn insert_state_after(
    conn: &AsyncPgConnection,
    room_id: &str,
    prev: (i64, Place),
    changes: &[(&str, &str, &str)],
) -> QueryResult<(i64, Place)> {
    if let Some(stored) = insert_state_delta(conn, room_id, prev, changes).await? {
        return Ok(stored);
    }
    let mut state = get_state_ids(conn, prev.0).await?;
    for (kind, key, id) in changes {
        state.insert(((*kind).to_owned(), (*key).to_owned()), (*id).to_owned());
    }
    let entries: Vec<(&str, &str, &str)> = state
        .iter()
        .map(|((kind, key), id)| (kind.as_str(), key.as_str(), id.as_str()))
        .collect();
    insert_state_snapshot(conn, room_id, Some(prev.0), &entries).await
}

/// Stores the state of `prev` with `changes` applied, as a delta: `None` when a snapshot is
/// due (see [`insert_state_after`]) or the chain would pass [`STATE_CHAIN_LIMIT`].
///
/// Deltas are skip deltas: the group at depth `d` is a delta on the group at depth
/// `d & (d - 1)` of its lineage, holding every change since then. A chain then has at most
/// one group per bit of `d`, and a change is copied into about log2(d) / 2 groups on
/// average, so a room of 20,000 members neither reads long chains nor writes a snapshot of
/// every member every few joins (which made storage grow with the square of its size).
async fn insert_state_delta(
    mut conn: &AsyncPgConnection,
    room_id: &str,
    prev: (i64, Place),
    changes: &[(&str, &str, &str)],
) -> QueryResult<Option<(i64, Place)>> {
    let (prev_group, prev_place) = prev;
    let depth = prev_place.depth + 1;
    if depth > prev_place.snapshot_rows.max(MIN_CHANGES_PER_SNAPSHOT) {
        return Ok(None);
    }
    // The base is `hops` groups down the previous group's chain: from depth `d - 1`, each
    // hop clears its lowest set bit, and `d - 1` has `hops` more set bits than `d & (d - 1)`.
    let hops = depth.trailing_zeros() as i32;
    let base = if hops == 0 {
        Base {
            state_group: prev_group,
            chain_length: prev_place.chain_length,
        }
    } else {
        let found: Option<Base> = crate::storage::cached_sql(with_chain!(
            " SELECT c.state_group, g.chain_length FROM chain c \
             JOIN state_groups g ON g.state_group = c.state_group WHERE c.level = $2"
        ))
        .bind::<BigInt, _>(prev_group)
        .bind::<Integer, _>(hops)
        .get_result(&mut conn)
        .await
        .optional()?;
        // A chain shorter than its depth says cannot be extended: start a new lineage.
        let Some(base) = found else {
            return Ok(None);
        };
        base
    };
    if base.chain_length >= STATE_CHAIN_LIMIT {
        return Ok(None);
    }
    let place = Place {
        chain_length: base.chain_length + 1,
        depth,
        snapshot_rows: prev_place.snapshot_rows,
    };
    let group = insert_group(
        conn,
        room_id,
        Some(base.state_group),
        Some(prev_group),
        place,
    )
    .await?;
    let (types, keys, ids): (Vec<&str>, Vec<&str>, Vec<&str>) = changes.iter().copied().fold(
        (Vec::new(), Vec::new(), Vec::new()),
        |(mut types, mut keys, mut ids), (kind, key, id)| {
            types.push(kind);
            keys.push(key);
            ids.push(id);
            (types, keys, ids)
        },
    );
    // The changes, plus what the groups between the previous one and the base changed
    // (nearer winning) that the changes do not replace.
    crate::storage::cached_sql(with_chain!(
        " INSERT INTO state_group_entries (state_group, event_type, state_key, event_id) \
         SELECT $2, n.t, n.k, n.i FROM unnest($3::text[], $4::text[], $5::text[]) AS n (t, k, i) \
         UNION ALL \
         SELECT $2, m.event_type, m.state_key, m.event_id FROM ( \
             SELECT DISTINCT ON (e.event_type, e.state_key) e.event_type, e.state_key, e.event_id \
             FROM chain c CROSS JOIN LATERAL ( \
                 SELECT event_type, state_key, event_id FROM state_group_entries \
                 WHERE state_group = c.state_group OFFSET 0 \
             ) e \
             WHERE c.level < $6 \
             ORDER BY e.event_type, e.state_key, c.level \
         ) m \
         WHERE NOT EXISTS ( \
             SELECT 1 FROM unnest($3::text[], $4::text[]) AS n (t, k) \
             WHERE n.t = m.event_type AND n.k = m.state_key \
         )"
    ))
    .bind::<BigInt, _>(prev_group)
    .bind::<BigInt, _>(group)
    .bind::<Array<Text>, _>(&types)
    .bind::<Array<Text>, _>(&keys)
    .bind::<Array<Text>, _>(&ids)
    .bind::<Integer, _>(hops)
    .execute(&mut conn)
    .await?;
    Ok(Some((group, place)))
}

#[derive(QueryableByName)]
struct MemberChange {
    #[diesel(sql_type = Nullable<BigInt>)]
    parent_group: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    user_id: Option<String>,
    #[diesel(sql_type = Bool)]
    joined: bool,
    #[diesel(sql_type = Bool)]
    was_joined: bool,
}

/// What a delta group changed of its parent's memberships.
#[derive(Debug, Default)]
pub struct MemberChanges {
    /// The group it is a delta on; `None` for a snapshot (whose changes are not read).
    pub parent: Option<i64>,
    /// `(user, joined in the group, joined in its parent)` for each member entry of the delta.
    pub members: Vec<(String, bool, bool)>,
}

/// The member entries of `group`'s own delta, each with whether the user is joined in the
/// group and whether they were in its parent's state (the nearest of the parent's chain
/// holding their entry). Reads only the delta's entries and one lookup per entry up the
/// chain: a skip delta at depth d holds at most d's lowest set bit of changes, a handful for
/// most groups, so a join into a big room reads a few rows rather than every member. Each
/// lookup up the chain is a scalar subquery by the whole primary key: as a join, tables never
/// analysed got a hash join whose inner side read every member entry of every group (150 ms a
/// group at 20,000 members).
pub async fn get_member_changes(
    mut conn: &AsyncPgConnection,
    group: i64,
) -> QueryResult<MemberChanges> {
    let rows: Vec<MemberChange> = crate::storage::cached_sql(with_chain!(
        " SELECT c.parent_group, d.state_key AS user_id, COALESCE(d.joined, false) AS joined, \
                COALESCE(d.was_joined, false) AS was_joined \
         FROM chain c LEFT JOIN LATERAL ( \
             SELECT m.state_key, \
                    (SELECT ev.pdu->'content'->>'membership' = 'join' FROM events ev \
                     WHERE ev.event_id = m.event_id LIMIT 1) AS joined, \
                    (SELECT (SELECT ev.pdu->'content'->>'membership' = 'join' FROM events ev \
                             WHERE ev.event_id = up.event_id LIMIT 1) \
                     FROM ( \
                         SELECT p.level, ( \
                             SELECT event_id FROM state_group_entries \
                             WHERE state_group = p.state_group AND event_type = 'm.room.member' \
                               AND state_key = m.state_key) AS event_id \
                         FROM chain p WHERE p.level > 0 OFFSET 0 \
                     ) up \
                     WHERE up.event_id IS NOT NULL ORDER BY up.level LIMIT 1) AS was_joined \
             FROM state_group_entries m \
             WHERE m.state_group = c.state_group AND m.event_type = 'm.room.member' \
               AND c.parent_group IS NOT NULL \
         ) d ON true \
         WHERE c.level = 0"
    ))
    .bind::<BigInt, _>(group)
    .load(&mut conn)
    .await?;
    let parent = rows.iter().find_map(|row| row.parent_group);
    let members = rows
        .into_iter()
        .filter_map(|row| Some((row.user_id?, row.joined, row.was_joined)))
        .collect();
    Ok(MemberChanges { parent, members })
}

#[derive(QueryableByName)]
struct Member {
    #[diesel(sql_type = Text)]
    user_id: String,
}

/// The users whose membership in the state of `group` is `join` (read like
/// [`get_state_ids`], member entries only). Each member event is looked up by primary key
/// (the `LIMIT` keeps the planner from joining): as a join, a plan made while `events` was
/// small scanned all of it for every group, 7 ms a call at 23,000 events on a server whose
/// tables were never analysed, for the federation sender on every new state group.
pub async fn get_joined_users(
    mut conn: &AsyncPgConnection,
    group: i64,
) -> QueryResult<Vec<String>> {
    let members: Vec<Member> = crate::storage::cached_sql(with_chain!(
        ", members AS ( \
             SELECT DISTINCT ON (e.state_key) e.state_key, e.event_id \
             FROM chain c CROSS JOIN LATERAL ( \
                 SELECT state_key, event_id FROM state_group_entries \
                 WHERE state_group = c.state_group AND event_type = 'm.room.member' OFFSET 0 \
             ) e \
             ORDER BY e.state_key, c.level \
         ) \
         SELECT m.state_key AS user_id FROM members m CROSS JOIN LATERAL ( \
             SELECT 1 FROM events ev WHERE ev.event_id = m.event_id \
               AND ev.pdu->'content'->>'membership' = 'join' LIMIT 1 \
         ) joined"
    ))
    .bind::<BigInt, _>(group)
    .load(&mut conn)
    .await?;
    Ok(members.into_iter().map(|m| m.user_id).collect())
}
