-- Push: what each event means for each local member (notify, highlight, unread), and pushers.

-- The member's display name in the room, for the contains_display_name push condition.
ALTER TABLE room_memberships ADD COLUMN display_name TEXT;
UPDATE room_memberships m SET display_name = e.pdu->'content'->>'displayname'
    FROM events e WHERE e.event_id = m.event_id;

-- Derived (rebuildable from events, receipts and push rules): one row per event and local
-- member it notifies or counts as unread for. Counts are never stored: /sync counts the rows
-- after the user's read receipt, so a receipt and a new event racing cannot skew them.
CREATE TABLE event_push_actions (
    user_id         TEXT NOT NULL,
    room_id         TEXT NOT NULL,
    event_id        TEXT NOT NULL,
    stream_ordering BIGINT NOT NULL,
    -- '' for the main timeline, else the thread root.
    thread_id       TEXT NOT NULL,
    notify          BOOLEAN NOT NULL,
    highlight       BOOLEAN NOT NULL,
    unread          BOOLEAN NOT NULL,
    actions         JSONB NOT NULL,
    ts              BIGINT NOT NULL,
    PRIMARY KEY (user_id, room_id, stream_ordering)
);
CREATE INDEX event_push_actions_event_id_idx ON event_push_actions (event_id);
-- GET /notifications: the user's notifications, newest first.
CREATE INDEX event_push_actions_notifications_idx ON event_push_actions (user_id, stream_ordering)
    WHERE notify;

CREATE TABLE pushers (
    user_id             TEXT NOT NULL REFERENCES users (user_id) ON DELETE CASCADE,
    app_id              TEXT NOT NULL,
    pushkey             TEXT NOT NULL,
    kind                TEXT NOT NULL,
    app_display_name    TEXT NOT NULL,
    device_display_name TEXT NOT NULL,
    profile_tag         TEXT,
    lang                TEXT NOT NULL,
    data                JSONB NOT NULL,
    -- The access token's device, so the pusher goes when the device does.
    device_id           TEXT,
    created_ts          BIGINT NOT NULL,
    -- Notifications up to here have been sent (or given up on).
    last_stream_ordering BIGINT NOT NULL,
    PRIMARY KEY (user_id, app_id, pushkey)
);
CREATE INDEX pushers_app_id_pushkey_idx ON pushers (app_id, pushkey);
