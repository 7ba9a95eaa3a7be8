-- Presence: one row per user who has ever been online. Every change takes a position in the
-- presence stream, so /sync sends only what changed since its token.
CREATE TABLE presence (
    user_id         TEXT PRIMARY KEY REFERENCES users (user_id) ON DELETE CASCADE,
    state           TEXT NOT NULL,
    status_msg      TEXT,
    -- Last time the user did something (a sync or a presence change counts).
    last_active_ts  BIGINT NOT NULL,
    -- Last sync or presence update: a user silent for long enough goes offline.
    last_seen_ts    BIGINT NOT NULL,
    stream_ordering BIGINT NOT NULL
);
CREATE INDEX presence_stream_ordering_idx ON presence (stream_ordering);
CREATE INDEX presence_online_idx ON presence (last_seen_ts) WHERE state <> 'offline';
INSERT INTO stream_positions (stream, position) VALUES ('presence', 0);
