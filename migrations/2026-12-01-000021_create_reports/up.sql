-- Reports users make of events, rooms and users, for the server's admins (the admin API's
-- event reports read the first).
CREATE TABLE event_reports (
    report_id BIGSERIAL PRIMARY KEY,
    received_ts BIGINT NOT NULL,
    room_id TEXT NOT NULL,
    event_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    reason TEXT,
    score BIGINT,
    content JSONB NOT NULL
);
CREATE INDEX event_reports_room_id_idx ON event_reports (room_id);
CREATE INDEX event_reports_user_id_idx ON event_reports (user_id);

CREATE TABLE room_reports (
    report_id BIGSERIAL PRIMARY KEY,
    received_ts BIGINT NOT NULL,
    room_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    reason TEXT NOT NULL
);

CREATE TABLE user_reports (
    report_id BIGSERIAL PRIMARY KEY,
    received_ts BIGINT NOT NULL,
    target_user_id TEXT NOT NULL,
    user_id TEXT NOT NULL,
    reason TEXT NOT NULL
);
