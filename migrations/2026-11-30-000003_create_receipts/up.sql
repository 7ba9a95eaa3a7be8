-- Read receipts (public m.read and private m.read.private), one per user, type and thread.
CREATE TABLE receipts (
    room_id         TEXT NOT NULL,
    user_id         TEXT NOT NULL,
    receipt_type    TEXT NOT NULL,
    thread_id       TEXT NOT NULL DEFAULT '',
    event_id        TEXT NOT NULL,
    -- Position of the receipted event: a receipt never moves back to an earlier one.
    event_stream    BIGINT NOT NULL,
    ts              BIGINT NOT NULL,
    stream_ordering BIGINT NOT NULL,
    PRIMARY KEY (room_id, user_id, receipt_type, thread_id)
);
CREATE INDEX receipts_stream_ordering_idx ON receipts (stream_ordering);
INSERT INTO stream_positions (stream, position) VALUES ('receipts', 0);
