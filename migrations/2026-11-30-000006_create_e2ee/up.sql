-- End-to-end encryption: key material the server stores and routes but cannot read.

CREATE TABLE device_keys (
    user_id   TEXT NOT NULL,
    device_id TEXT NOT NULL,
    keys      JSONB NOT NULL,
    PRIMARY KEY (user_id, device_id),
    FOREIGN KEY (user_id, device_id) REFERENCES devices (user_id, device_id) ON DELETE CASCADE
);

CREATE TABLE one_time_keys (
    user_id   TEXT NOT NULL,
    device_id TEXT NOT NULL,
    algorithm TEXT NOT NULL,
    -- "algorithm:id"
    key_id    TEXT NOT NULL,
    key       JSONB NOT NULL,
    PRIMARY KEY (user_id, device_id, key_id),
    FOREIGN KEY (user_id, device_id) REFERENCES devices (user_id, device_id) ON DELETE CASCADE
);
CREATE INDEX one_time_keys_claim_idx ON one_time_keys (user_id, device_id, algorithm);

-- One fallback key per device and algorithm; handed out (repeatedly) when OTKs run out.
CREATE TABLE fallback_keys (
    user_id   TEXT NOT NULL,
    device_id TEXT NOT NULL,
    algorithm TEXT NOT NULL,
    key_id    TEXT NOT NULL,
    key       JSONB NOT NULL,
    used      BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (user_id, device_id, algorithm),
    FOREIGN KEY (user_id, device_id) REFERENCES devices (user_id, device_id) ON DELETE CASCADE
);

-- master, self_signing and user_signing keys.
CREATE TABLE cross_signing_keys (
    user_id  TEXT NOT NULL REFERENCES users (user_id) ON DELETE CASCADE,
    key_type TEXT NOT NULL,
    key      JSONB NOT NULL,
    PRIMARY KEY (user_id, key_type)
);

-- Signatures added later (/keys/signatures/upload), merged into /keys/query answers.
CREATE TABLE key_signatures (
    target_user_id TEXT NOT NULL,
    -- A device ID or a cross-signing public key.
    target_key_id  TEXT NOT NULL,
    signer_user_id TEXT NOT NULL,
    -- "ed25519:..."
    signer_key_id  TEXT NOT NULL,
    signature      TEXT NOT NULL,
    PRIMARY KEY (target_user_id, target_key_id, signer_user_id, signer_key_id)
);

-- One row per change to a user's devices or keys (/sync device_lists, /keys/changes).
CREATE TABLE device_list_changes (
    stream_ordering BIGINT PRIMARY KEY,
    user_id         TEXT NOT NULL
);
CREATE INDEX device_list_changes_user_id_idx ON device_list_changes (user_id, stream_ordering);

-- Per-device inbox: a message stays until the device syncs with a token past it, so a lost
-- response loses nothing.
CREATE TABLE to_device_inbox (
    user_id         TEXT NOT NULL,
    device_id       TEXT NOT NULL,
    stream_ordering BIGINT NOT NULL,
    sender          TEXT NOT NULL,
    event_type      TEXT NOT NULL,
    content         JSONB NOT NULL,
    PRIMARY KEY (user_id, device_id, stream_ordering)
);
CREATE TABLE to_device_txns (
    user_id    TEXT NOT NULL,
    device_id  TEXT NOT NULL,
    txn_id     TEXT NOT NULL,
    created_ts BIGINT NOT NULL,
    PRIMARY KEY (user_id, device_id, txn_id)
);
INSERT INTO stream_positions (stream, position) VALUES ('device_lists', 0), ('to_device', 0);

CREATE TABLE backup_versions (
    user_id   TEXT NOT NULL REFERENCES users (user_id) ON DELETE CASCADE,
    version   BIGINT NOT NULL,
    algorithm TEXT NOT NULL,
    auth_data JSONB NOT NULL,
    -- Bumped on every change to the version's keys.
    etag      BIGINT NOT NULL DEFAULT 0,
    deleted   BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (user_id, version)
);
CREATE TABLE backup_keys (
    user_id             TEXT NOT NULL,
    version             BIGINT NOT NULL,
    room_id             TEXT NOT NULL,
    session_id          TEXT NOT NULL,
    first_message_index BIGINT NOT NULL,
    forwarded_count     BIGINT NOT NULL,
    is_verified         BOOLEAN NOT NULL,
    session_data        JSONB NOT NULL,
    PRIMARY KEY (user_id, version, room_id, session_id),
    FOREIGN KEY (user_id, version) REFERENCES backup_versions (user_id, version) ON DELETE CASCADE
);
