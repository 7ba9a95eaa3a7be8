-- Background history purges of the admin API (`/_synapse/admin/v1/purge_history`), kept so
-- `purge_history_status` can report them.
CREATE TABLE admin_history_purges (
    purge_id   TEXT PRIMARY KEY,
    room_id    TEXT NOT NULL,
    status     TEXT NOT NULL,
    error      TEXT,
    created_ts BIGINT NOT NULL
);
