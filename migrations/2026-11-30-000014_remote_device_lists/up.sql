-- Other servers' users' device lists and cross-signing keys, cached from
-- GET /_matrix/federation/v1/user/devices and kept current by m.device_list_update and
-- m.signing_key_update EDUs.
CREATE TABLE remote_device_lists (
    user_id          TEXT PRIMARY KEY,
    -- The origin's position in the user's device-list stream that the cached list reflects.
    stream_id        BIGINT NOT NULL,
    -- An update arrived that does not follow on from stream_id: resync before use.
    stale            BOOLEAN NOT NULL,
    master_key       JSONB,
    self_signing_key JSONB,
    updated_ts       BIGINT NOT NULL
);

CREATE TABLE remote_devices (
    user_id      TEXT NOT NULL REFERENCES remote_device_lists (user_id) ON DELETE CASCADE,
    device_id    TEXT NOT NULL,
    -- The device's signed identity keys, when it has any.
    keys         JSONB,
    display_name TEXT,
    PRIMARY KEY (user_id, device_id)
);
