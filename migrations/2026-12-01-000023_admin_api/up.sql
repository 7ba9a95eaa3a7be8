-- What the Synapse-compatible admin API keeps: erased accounts, per-user rate-limit overrides,
-- rooms blocked from joining, quarantined media, and the background room deletions it reports.

ALTER TABLE users ADD COLUMN erased BOOLEAN NOT NULL DEFAULT FALSE;

-- The device behind an admin's "login as user" token: it works like any other but is not
-- listed, so the user does not see it among their sessions.
ALTER TABLE devices ADD COLUMN hidden BOOLEAN NOT NULL DEFAULT FALSE;

CREATE TABLE user_ratelimit_overrides (
    user_id             TEXT PRIMARY KEY REFERENCES users (user_id) ON DELETE CASCADE,
    messages_per_second BIGINT NOT NULL,
    burst_count         BIGINT NOT NULL
);

-- A room may be blocked before this server has ever seen it (as in Synapse), so no foreign key.
CREATE TABLE blocked_rooms (
    room_id    TEXT PRIMARY KEY,
    blocked_by TEXT NOT NULL,
    created_ts BIGINT NOT NULL
);

-- The admin who quarantined it; quarantined media is served to nobody.
ALTER TABLE media ADD COLUMN quarantined_by TEXT;

CREATE TABLE admin_room_deletions (
    delete_id  TEXT PRIMARY KEY,
    room_id    TEXT NOT NULL,
    status     TEXT NOT NULL,
    error      TEXT,
    result     JSONB,
    created_ts BIGINT NOT NULL
);
CREATE INDEX admin_room_deletions_room_id_idx ON admin_room_deletions (room_id);
