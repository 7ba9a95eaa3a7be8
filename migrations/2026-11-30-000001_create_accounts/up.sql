-- Accounts, devices, sessions and per-user settings: the Foundation's durable facts.

CREATE TABLE users (
    user_id       TEXT PRIMARY KEY,
    localpart     TEXT NOT NULL UNIQUE,
    password_hash TEXT,
    is_admin      BOOLEAN NOT NULL DEFAULT FALSE,
    deactivated   BOOLEAN NOT NULL DEFAULT FALSE,
    created_ts    BIGINT NOT NULL
);

-- Profile fields (displayname, avatar_url and custom keys), one row per field.
CREATE TABLE profile_fields (
    user_id    TEXT NOT NULL REFERENCES users (user_id) ON DELETE CASCADE,
    field_name TEXT NOT NULL,
    value      JSONB NOT NULL,
    PRIMARY KEY (user_id, field_name)
);

CREATE TABLE devices (
    user_id      TEXT NOT NULL REFERENCES users (user_id) ON DELETE CASCADE,
    device_id    TEXT NOT NULL,
    display_name TEXT,
    last_seen_ts BIGINT,
    last_seen_ip TEXT,
    created_ts   BIGINT NOT NULL,
    PRIMARY KEY (user_id, device_id)
);

-- Only SHA-256 hashes of tokens are stored; a database leak does not leak sessions.
CREATE TABLE refresh_tokens (
    token_hash BYTEA PRIMARY KEY,
    user_id    TEXT NOT NULL,
    device_id  TEXT NOT NULL,
    created_ts BIGINT NOT NULL,
    FOREIGN KEY (user_id, device_id) REFERENCES devices (user_id, device_id) ON DELETE CASCADE
);

CREATE TABLE access_tokens (
    token_hash         BYTEA PRIMARY KEY,
    user_id            TEXT NOT NULL,
    device_id          TEXT NOT NULL,
    expires_ts         BIGINT,
    refresh_token_hash BYTEA REFERENCES refresh_tokens (token_hash) ON DELETE CASCADE,
    created_ts         BIGINT NOT NULL,
    FOREIGN KEY (user_id, device_id) REFERENCES devices (user_id, device_id) ON DELETE CASCADE
);
CREATE INDEX access_tokens_user_id_device_id_idx ON access_tokens (user_id, device_id);
CREATE INDEX refresh_tokens_user_id_device_id_idx ON refresh_tokens (user_id, device_id);

CREATE TABLE registration_tokens (
    token        TEXT PRIMARY KEY,
    uses_allowed INTEGER,
    pending      INTEGER NOT NULL DEFAULT 0,
    completed    INTEGER NOT NULL DEFAULT 0,
    expiry_ts    BIGINT,
    created_ts   BIGINT NOT NULL
);

-- User-interactive auth sessions live in the database so any server process can continue one.
CREATE TABLE uia_sessions (
    session_id       TEXT PRIMARY KEY,
    user_id          TEXT,
    completed_stages JSONB NOT NULL DEFAULT '[]',
    registration_token TEXT,
    created_ts       BIGINT NOT NULL
);

-- Global account data has room_id = ''; every write takes a new stream position for /sync.
CREATE SEQUENCE account_data_stream_seq;
CREATE TABLE account_data (
    user_id         TEXT NOT NULL REFERENCES users (user_id) ON DELETE CASCADE,
    room_id         TEXT NOT NULL DEFAULT '',
    data_type       TEXT NOT NULL,
    content         JSONB NOT NULL,
    stream_ordering BIGINT NOT NULL DEFAULT nextval('account_data_stream_seq'),
    PRIMARY KEY (user_id, room_id, data_type)
);
CREATE INDEX account_data_user_id_stream_ordering_idx ON account_data (user_id, stream_ordering);

CREATE TABLE filters (
    user_id   TEXT NOT NULL REFERENCES users (user_id) ON DELETE CASCADE,
    filter_id BIGSERIAL NOT NULL,
    content   JSONB NOT NULL,
    PRIMARY KEY (user_id, filter_id)
);
