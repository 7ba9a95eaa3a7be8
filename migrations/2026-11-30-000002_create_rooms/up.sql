-- Rooms and the event graph.

-- The server's ed25519 signing keys; generated once, never regenerated.
CREATE TABLE server_signing_keys (
    key_id     TEXT PRIMARY KEY,
    secret_der BYTEA NOT NULL,
    created_ts BIGINT NOT NULL
);

-- One counter row per stream. A writer bumps its stream's row as the last statement of its
-- transaction; the row lock makes positions commit in order, so a reader that has seen
-- position N has seen everything below N (no event is skipped under concurrency).
CREATE TABLE stream_positions (
    stream   TEXT PRIMARY KEY,
    position BIGINT NOT NULL
);
INSERT INTO stream_positions (stream, position) VALUES ('events', 0);
INSERT INTO stream_positions (stream, position)
    SELECT 'account_data', COALESCE(MAX(stream_ordering), 0) FROM account_data;
ALTER TABLE account_data ALTER COLUMN stream_ordering DROP DEFAULT;
DROP SEQUENCE account_data_stream_seq;

CREATE TABLE rooms (
    room_id             TEXT PRIMARY KEY,
    room_version        TEXT NOT NULL,
    creator             TEXT NOT NULL,
    is_public           BOOLEAN NOT NULL DEFAULT FALSE,
    current_state_group BIGINT NOT NULL,
    created_ts          BIGINT NOT NULL
);

-- State snapshots stored as deltas: each group holds only what changed since its parent;
-- every STATE_CHAIN_LIMIT changes a group is written as a full snapshot (parent NULL), so
-- resolving a group reads a bounded chain and storage per state change stays one or two rows.
CREATE TABLE state_groups (
    state_group  BIGSERIAL PRIMARY KEY,
    room_id      TEXT NOT NULL REFERENCES rooms (room_id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
    parent_group BIGINT REFERENCES state_groups (state_group),
    chain_length INTEGER NOT NULL
);
CREATE TABLE state_group_entries (
    state_group BIGINT NOT NULL REFERENCES state_groups (state_group) ON DELETE CASCADE,
    event_type  TEXT NOT NULL,
    state_key   TEXT NOT NULL,
    event_id    TEXT NOT NULL,
    PRIMARY KEY (state_group, event_type, state_key)
);
ALTER TABLE rooms ADD FOREIGN KEY (current_state_group) REFERENCES state_groups (state_group)
    DEFERRABLE INITIALLY DEFERRED;

CREATE TABLE events (
    event_id         TEXT PRIMARY KEY,
    room_id          TEXT NOT NULL REFERENCES rooms (room_id) DEFERRABLE INITIALLY DEFERRED,
    stream_ordering  BIGINT NOT NULL UNIQUE,
    depth            BIGINT NOT NULL,
    sender           TEXT NOT NULL,
    event_type       TEXT NOT NULL,
    state_key        TEXT,
    origin_server_ts BIGINT NOT NULL,
    pdu              JSONB NOT NULL,
    -- The room state after this event.
    state_group      BIGINT NOT NULL REFERENCES state_groups (state_group),
    redacted_by      TEXT
);
CREATE INDEX events_room_id_stream_ordering_idx ON events (room_id, stream_ordering);
CREATE INDEX events_room_id_origin_server_ts_idx ON events (room_id, origin_server_ts);

-- Client transaction IDs, kept forever: a retry a week later gets the same event.
CREATE TABLE event_txns (
    user_id    TEXT NOT NULL,
    device_id  TEXT NOT NULL,
    txn_id     TEXT NOT NULL,
    event_id   TEXT NOT NULL,
    created_ts BIGINT NOT NULL,
    PRIMARY KEY (user_id, device_id, txn_id)
);
CREATE INDEX event_txns_event_id_idx ON event_txns (event_id);

CREATE TABLE room_forward_extremities (
    room_id  TEXT NOT NULL,
    event_id TEXT NOT NULL,
    PRIMARY KEY (room_id, event_id)
);

-- Derived from events (rebuildable): current state and current membership per room.
CREATE TABLE room_current_state (
    room_id    TEXT NOT NULL,
    event_type TEXT NOT NULL,
    state_key  TEXT NOT NULL,
    event_id   TEXT NOT NULL,
    PRIMARY KEY (room_id, event_type, state_key)
);
CREATE TABLE room_memberships (
    room_id         TEXT NOT NULL,
    user_id         TEXT NOT NULL,
    membership      TEXT NOT NULL,
    event_id        TEXT NOT NULL,
    stream_ordering BIGINT NOT NULL,
    forgotten       BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (room_id, user_id)
);
CREATE INDEX room_memberships_user_id_membership_idx ON room_memberships (user_id, membership);

CREATE TABLE room_aliases (
    room_alias TEXT PRIMARY KEY,
    room_id    TEXT NOT NULL,
    creator    TEXT NOT NULL,
    created_ts BIGINT NOT NULL
);
CREATE INDEX room_aliases_room_id_idx ON room_aliases (room_id);

ALTER TABLE users ADD COLUMN shadow_banned BOOLEAN NOT NULL DEFAULT FALSE;
