"""Copies the users and rooms of a Myelin database into a stopped Synapse's database.

For benchmark set-ups that Synapse's API would take hours to build (the big account's 89,700
joins run at 14 to 25 a second there, the big room's 20,000 at 5 to 9; the long history's
million events are loaded into Myelin through SQL): Myelin builds them through its API, and this gives
Synapse the same users, rooms and events, so both servers then answer the same measured
requests over the same data.

The events are Myelin's own PDUs (with `unsigned` as Synapse keeps it): both servers are named `localhost` in the
benchmark, so to Synapse they are local events, and their IDs are the reference hashes of
those PDUs, which Synapse recomputes on read. What Synapse keeps beside each event is derived
here as Synapse derives it when it persists one:
- state groups: one per state event (the state after it), stored as a delta on the group
  before, with a full snapshot once a chain would pass 100 hops, Synapse's own limit;
- every event points at the state group after it; state events have `state_events` rows;
- the room's current state, memberships (every member event, and the current one per local
  user), DAG edges, auth edges, forward extremities and depth;
- the event stream's sequence and position, so Synapse starts at the loaded events' end;
- search entries for messages' bodies and rooms' names and topics.

Only linear rooms (one forward extremity, events in stream order), as a benchmark's set-up
through one server makes them. Users matching the application service registration's user
namespaces belong to that service, as when registered through it.

Usage: python synapse_load.py MYELIN_DATABASE_URL SYNAPSE_DATABASE_URL REGISTRATION_YAML
Run with Synapse stopped, on a Synapse database whose schema Synapse has created and that
holds no rooms yet.
Statistics are left as they are: myelin-bench vacuums and analyses the database after a
set-up (unless `--no-analyze`), for a loaded one as for one set up through the API.
"""

import io
import json
import re
import sys
import time

import psycopg2
import yaml
from synapse.api.room_versions import KNOWN_ROOM_VERSIONS

MAX_STATE_DELTA_HOPS = 100
PAGE = 2000
# The field of each event type that Synapse indexes for search.
SEARCHED = {"m.room.message": "body", "m.room.name": "name", "m.room.topic": "topic"}


def format_version(room_version):
    """Synapse's event format for a room version (its own table: the loader runs in Synapse's
    virtual environment)."""
    return KNOWN_ROOM_VERSIONS[room_version].event_format


# Tables written through a staging table, with a column computed from the value given.
COMPUTED = {
    # Synapse's PostgreSQL search: an English text-search vector of the searched field.
    "event_search": {"vector": "to_tsvector('english', {})"},
}
# The staging tables made in this run's one transaction.
STAGED = set()


def copy_field(value):
    """A value in COPY's text format."""
    if value is None:
        return "\\N"
    if isinstance(value, bool):
        return "t" if value else "f"
    text = str(value)
    return (text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
            .replace("\r", "\\r"))


def insert(cur, table, columns, rows):
    """Writes rows through COPY (the start-up's ten million events would take hours as
    INSERTs); a computed column goes through a temporary table."""
    if not rows:
        return
    text = io.StringIO("".join("\t".join(map(copy_field, row)) + "\n" for row in rows))
    computed = COMPUTED.get(table)
    if computed is None:
        cur.copy_expert(f"COPY {table} ({', '.join(columns)}) FROM STDIN", text)
        return
    if table not in STAGED:
        cur.execute(f"CREATE TEMP TABLE staged_{table} (LIKE {table}) ON COMMIT DROP")
        for column in computed:
            cur.execute(f"ALTER TABLE staged_{table} ALTER COLUMN {column} TYPE text")
        STAGED.add(table)
    cur.copy_expert(f"COPY staged_{table} ({', '.join(columns)}) FROM STDIN", text)
    values = ", ".join(computed.get(c, "{}").format(c) for c in columns)
    cur.execute(f"INSERT INTO {table} ({', '.join(columns)}) "
                f"SELECT {values} FROM staged_{table}; TRUNCATE staged_{table}")


def insert_all(cur, tables, rows_by_table):
    """Inserts each table's rows, tables in the order `tables` names them."""
    for table, columns in tables.items():
        insert(cur, table, columns, rows_by_table[table])


def load_users(myelin, cur, registration):
    service = registration["id"]
    namespaces = [
        re.compile(entry["regex"]) for entry in registration.get("namespaces", {}).get("users", [])
    ]
    with myelin.cursor() as m:
        m.execute("SELECT user_id, localpart, created_ts, is_admin, deactivated FROM users")
        users = m.fetchall()
    rows, profiles = [], []
    for user_id, localpart, created_ts, is_admin, deactivated in users:
        owner = service if any(n.fullmatch(user_id) for n in namespaces) else None
        rows.append((user_id, None, created_ts // 1000, int(is_admin), owner, int(deactivated), False))
        profiles.append((localpart, user_id, localpart))
    insert(cur, "users", ["name", "password_hash", "creation_ts", "admin", "appservice_id",
                          "deactivated", "shadow_banned"], rows)
    insert(cur, "profiles", ["user_id", "full_user_id", "displayname"], profiles)
    return len(rows)


class Room:
    """What Synapse keeps beside one room's events, built event by event."""

    def __init__(self, room_id, next_group):
        self.room_id = room_id
        self.next_group = next_group
        self.state = {}  # (type, state_key) -> (event_id, stream_ordering, membership)
        self.group = None
        self.hops = 0
        self.last_event = None

    def add(self, out, event_id, ordering, pdu, content):
        event_type, state_key = pdu["type"], pdu.get("state_key")
        if state_key is not None:
            key = (event_type, state_key)
            replaced = self.state.get(key)
            membership = content.get("membership") if event_type == "m.room.member" else None
            self.state[key] = (event_id, ordering, membership)
            out["state_events"].append(
                (event_id, self.room_id, event_type, state_key, replaced and replaced[0])
            )
            group = self.next_group()
            out["state_groups"].append((group, self.room_id, event_id))
            if self.group is not None and self.hops < MAX_STATE_DELTA_HOPS:
                out["state_group_edges"].append((group, self.group))
                entries = [(key, event_id)]
                self.hops += 1
            else:
                entries = [(k, v[0]) for k, v in self.state.items()]
                self.hops = 0
            out["state_groups_state"].extend(
                (group, self.room_id, t, sk, e) for (t, sk), e in entries
            )
            self.group = group
            if membership is not None:
                display_name = content.get("displayname")
                avatar_url = content.get("avatar_url")
                out["room_memberships"].append((
                    event_id, state_key, pdu["sender"], self.room_id, membership,
                    display_name if isinstance(display_name, str) else None,
                    avatar_url if isinstance(avatar_url, str) else None,
                    ordering,
                ))
        if self.group is not None:
            out["event_to_state_groups"].append((event_id, self.group))
        out["event_edges"].extend(
            (event_id, prev, self.room_id, False) for prev in pdu.get("prev_events", [])
        )
        out["event_auth"].extend(
            (event_id, auth, self.room_id) for auth in pdu.get("auth_events", [])
        )
        self.last_event = event_id


def load_rooms(myelin, cur, local_users):
    cur.execute("SELECT COALESCE(MAX(id), 0) FROM state_groups")
    last_group = [cur.fetchone()[0]]

    def next_group():
        last_group[0] += 1
        return last_group[0]

    with myelin.cursor() as m:
        m.execute("SELECT room_id, room_version, creator, is_public, tip_depth FROM rooms")
        rooms = m.fetchall()
    insert(cur, "rooms", ["room_id", "is_public", "creator", "room_version", "has_auth_chain_index"],
           [(r, public, creator, version, False) for r, version, creator, public, _ in rooms])
    insert(cur, "room_depth", ["room_id", "min_depth"], [(r[0], 1) for r in rooms])
    versions = {r[0]: r[1] for r in rooms}
    tables = {
        "events": ["topological_ordering", "event_id", "type", "room_id", "processed", "outlier",
                   "depth", "origin_server_ts", "received_ts", "sender", "contains_url",
                   "instance_name", "stream_ordering", "state_key"],
        "event_json": ["event_id", "room_id", "internal_metadata", "json", "format_version"],
        "state_events": ["event_id", "room_id", "type", "state_key", "prev_state"],
        "state_groups": ["id", "room_id", "event_id"],
        "state_group_edges": ["state_group", "prev_state_group"],
        "state_groups_state": ["state_group", "room_id", "type", "state_key", "event_id"],
        "event_to_state_groups": ["event_id", "state_group"],
        "room_memberships": ["event_id", "user_id", "sender", "room_id", "membership",
                             "display_name", "avatar_url", "event_stream_ordering"],
        "event_edges": ["event_id", "prev_event_id", "room_id", "is_state"],
        "event_auth": ["event_id", "auth_id", "room_id"],
        "event_search": ["event_id", "room_id", "key", "vector", "stream_ordering",
                         "origin_server_ts"],
    }
    state = {}
    events = 0
    max_ordering = 0
    # Events as clients are served them: not outliers, not rejected, not soft-failed.
    with myelin.cursor(name="events") as m:
        m.itersize = PAGE
        m.execute(
            "SELECT event_id, room_id, stream_ordering, depth, pdu::text FROM events "
            "WHERE NOT outlier AND rejected_reason IS NULL AND NOT soft_failed "
            "ORDER BY stream_ordering"
        )
        out = {t: [] for t in tables}
        for event_id, room_id, ordering, depth, text in m:
            pdu = json.loads(text)
            pdu.pop("event_id", None)
            # As Synapse stores a local event: `age_ts` in `unsigned`, from which it serves
            # `age`.
            pdu["unsigned"] = {"age_ts": pdu["origin_server_ts"]}
            room = state.get(room_id)
            if room is None:
                room = state[room_id] = Room(room_id, next_group)
            content = pdu.get("content") if isinstance(pdu.get("content"), dict) else {}
            out["events"].append((
                depth, event_id, pdu["type"], room_id, True, False, depth, pdu["origin_server_ts"],
                pdu["origin_server_ts"], pdu["sender"], isinstance(content.get("url"), str),
                "master", ordering, pdu.get("state_key"),
            ))
            out["event_json"].append((
                event_id, room_id, "{}", json.dumps(pdu, separators=(",", ":"), ensure_ascii=False),
                format_version(versions[room_id]),
            ))
            room.add(out, event_id, ordering, pdu, content)
            searched = SEARCHED.get(pdu["type"])
            if searched and isinstance(content.get(searched), str):
                text = content[searched].replace("\0", " ")  # as Synapse cleans it
                out["event_search"].append((
                    event_id, room_id, f"content.{searched}", text, ordering,
                    pdu["origin_server_ts"],
                ))
            events += 1
            max_ordering = max(max_ordering, ordering)
            if len(out["events"]) >= PAGE:
                insert_all(cur, tables, out)
                out = {t: [] for t in tables}
        insert_all(cur, tables, out)

    current, local = [], []
    for room in state.values():
        for (event_type, state_key), (event_id, ordering, membership) in room.state.items():
            current.append((event_id, room.room_id, event_type, state_key, membership, ordering))
            if membership is not None and state_key in local_users:
                local.append((room.room_id, state_key, event_id, membership, ordering))
    insert(cur, "current_state_events",
           ["event_id", "room_id", "type", "state_key", "membership", "event_stream_ordering"],
           current)
    insert(cur, "local_current_membership",
           ["room_id", "user_id", "event_id", "membership", "event_stream_ordering"], local)
    insert(cur, "event_forward_extremities", ["event_id", "room_id"],
           [(room.last_event, room.room_id) for room in state.values()])
    insert(cur, "room_stats_current",
           ["room_id", "current_state_events", "joined_members", "invited_members",
            "left_members", "banned_members", "knocked_members", "local_users_in_room",
            "completed_delta_stream_id"],
           [room_stats(room, local_users, max_ordering) for room in state.values()])

    # Synapse starts its event stream after the loaded events, and checks at start that the
    # sequence is not behind the table.
    cur.execute("SELECT setval('events_stream_seq', %s)", (max(max_ordering, 1),))
    cur.execute("DELETE FROM stream_positions WHERE stream_name = 'events'")
    cur.execute("INSERT INTO stream_positions (stream_name, instance_name, stream_id) "
                "VALUES ('events', 'master', %s)", (max_ordering,))
    cur.execute("SELECT setval('state_group_id_seq', %s)", (max(last_group[0], 1),))
    return len(state), events


def room_stats(room, local_users, position):
    counts = {}
    local = 0
    for (event_type, state_key), (_, _, membership) in room.state.items():
        if event_type == "m.room.member":
            counts[membership] = counts.get(membership, 0) + 1
            local += membership == "join" and state_key in local_users
    return (room.room_id, len(room.state), counts.get("join", 0), counts.get("invite", 0),
            counts.get("leave", 0), counts.get("ban", 0), counts.get("knock", 0), local, position)


def main():
    myelin_url, synapse_url, registration_path = sys.argv[1:4]
    registration = yaml.safe_load(open(registration_path))
    started = time.monotonic()
    myelin = psycopg2.connect(myelin_url)
    myelin.set_session(readonly=True)
    synapse = psycopg2.connect(synapse_url)
    with synapse, synapse.cursor() as cur:
        cur.execute("SELECT count(*) FROM rooms")
        if cur.fetchone()[0]:
            sys.exit("synapse_load: the Synapse database already holds rooms")
        users = load_users(myelin, cur, registration)
        cur.execute("SELECT name FROM users")
        local_users = {row[0] for row in cur.fetchall()}
        rooms, events = load_rooms(myelin, cur, local_users)
    print(f"synapse_load: {users} users, {rooms} rooms, {events} events "
          f"in {time.monotonic() - started:.1f} s")


if __name__ == "__main__":
    main()
