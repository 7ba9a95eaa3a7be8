-- Media repository metadata; the bytes live on disk under the data directory, one file per
-- distinct SHA-256, so identical uploads are stored once.
CREATE TABLE media (
    media_id     TEXT PRIMARY KEY,
    uploader     TEXT NOT NULL,
    content_type TEXT,
    filename     TEXT,
    -- NULL while an asynchronous upload (/media/v1/create) is still pending.
    size         BIGINT,
    sha256       TEXT,
    created_ts   BIGINT NOT NULL,
    -- When a pending ID stops accepting its upload.
    expires_ts   BIGINT
);
CREATE INDEX media_sha256_idx ON media (sha256);
CREATE INDEX media_pending_idx ON media (uploader, expires_ts) WHERE sha256 IS NULL;

-- Thumbnails, made on first request at the standard sizes.
CREATE TABLE media_thumbnails (
    media_id     TEXT NOT NULL REFERENCES media (media_id) ON DELETE CASCADE,
    width        INTEGER NOT NULL,
    height       INTEGER NOT NULL,
    method       TEXT NOT NULL,
    content_type TEXT NOT NULL,
    sha256       TEXT NOT NULL,
    size         BIGINT NOT NULL,
    PRIMARY KEY (media_id, width, height, method)
);
