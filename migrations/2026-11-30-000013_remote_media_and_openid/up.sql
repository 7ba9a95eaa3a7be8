-- Media of other servers, fetched on a client's request and kept, keyed by the server in its
-- mxc:// URI and its ID there. The bytes share the local store (one file per SHA-256).
CREATE TABLE remote_media (
    origin       TEXT NOT NULL,
    media_id     TEXT NOT NULL,
    content_type TEXT,
    filename     TEXT,
    size         BIGINT NOT NULL,
    sha256       TEXT NOT NULL,
    fetched_ts   BIGINT NOT NULL,
    PRIMARY KEY (origin, media_id)
);
CREATE INDEX remote_media_sha256_idx ON remote_media (sha256);

-- Thumbnails of remote media, asked of their server at our standard sizes.
CREATE TABLE remote_media_thumbnails (
    origin       TEXT NOT NULL,
    media_id     TEXT NOT NULL,
    width        INTEGER NOT NULL,
    height       INTEGER NOT NULL,
    method       TEXT NOT NULL,
    content_type TEXT NOT NULL,
    sha256       TEXT NOT NULL,
    size         BIGINT NOT NULL,
    PRIMARY KEY (origin, media_id, width, height, method)
);

-- OpenID tokens (/user/{userId}/openid/request_token), only as SHA-256, each for an hour.
CREATE TABLE openid_tokens (
    token_hash BYTEA PRIMARY KEY,
    user_id    TEXT NOT NULL,
    expires_ts BIGINT NOT NULL
);
CREATE INDEX openid_tokens_expires_idx ON openid_tokens (expires_ts);
