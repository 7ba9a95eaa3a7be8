-- Simplified sliding sync (MSC4186): what each connection has sent of each room.
-- Versions are global, so a `pos` never matches another connection's state.
CREATE SEQUENCE sliding_sync_versions;

-- One connection per (user, device, conn_id). `base_version` is the newest version a request
-- proved the client holds; `pending_versions` those handed out since from it (normally one;
-- more when a request the client gave up on answered too).
CREATE TABLE sliding_sync_connections (
    conn_key BIGSERIAL PRIMARY KEY,
    user_id TEXT NOT NULL,
    device_id TEXT NOT NULL,
    conn_id TEXT NOT NULL,
    base_version BIGINT NOT NULL,
    pending_versions BIGINT[] NOT NULL DEFAULT '{}',
    last_used_ts BIGINT NOT NULL,
    UNIQUE (user_id, device_id, conn_id),
    FOREIGN KEY (user_id, device_id) REFERENCES devices (user_id, device_id) ON DELETE CASCADE
);
CREATE INDEX sliding_sync_connections_last_used ON sliding_sync_connections (last_used_ts);

-- A room's status as of a version (no row: never sent). `events_from` NULL: everything up to
-- the `pos` was sent; otherwise updates after that event position are still unsent.
CREATE TABLE sliding_sync_rooms (
    conn_key BIGINT NOT NULL REFERENCES sliding_sync_connections ON DELETE CASCADE,
    room_id TEXT NOT NULL,
    version BIGINT NOT NULL,
    membership TEXT NOT NULL,
    events_from BIGINT,
    timeline_limit INTEGER NOT NULL,
    required_state JSONB NOT NULL,
    PRIMARY KEY (conn_key, room_id, version)
);
