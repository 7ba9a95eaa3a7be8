-- Other servers' signing keys, fetched from /_matrix/key/v2/server and cached. Keys a server
-- has retired (its old_verify_keys) stay, with expired_ts, to verify the events they signed.
CREATE TABLE remote_server_keys (
    server_name TEXT NOT NULL,
    key_id TEXT NOT NULL,
    -- Unpadded base64 of the ed25519 public key.
    public_key TEXT NOT NULL,
    -- Until when the server says the key may be used (ms since 1970).
    valid_until_ts BIGINT NOT NULL,
    -- When the server retired the key; NULL while it is current.
    expired_ts BIGINT,
    fetched_ts BIGINT NOT NULL,
    PRIMARY KEY (server_name, key_id)
);
