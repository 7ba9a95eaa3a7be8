ALTER TABLE event_push_actions RENAME TO event_push_actions_numeric;
ALTER TABLE event_push_actions_numeric RENAME CONSTRAINT event_push_actions_pkey
    TO event_push_actions_numeric_pkey;
ALTER INDEX event_push_actions_notifications_idx RENAME TO event_push_actions_numeric_notifications_idx;
ALTER INDEX event_push_actions_threads_idx RENAME TO event_push_actions_numeric_threads_idx;

CREATE TABLE event_push_actions (
    user_id         TEXT NOT NULL,
    room_id         TEXT NOT NULL,
    event_id        TEXT NOT NULL,
    stream_ordering BIGINT NOT NULL,
    thread_id       TEXT NOT NULL,
    notify          BOOLEAN NOT NULL,
    highlight       BOOLEAN NOT NULL,
    unread          BOOLEAN NOT NULL,
    actions         JSONB NOT NULL,
    ts              BIGINT NOT NULL,
    PRIMARY KEY (user_id, room_id, stream_ordering)
);
INSERT INTO event_push_actions
SELECT u.user_id, r.room_id, e.event_id, a.stream_ordering, a.thread_id, a.notify, a.highlight,
       a.unread, COALESCE(a.actions, myelin_implied_push_actions(a.notify, a.highlight, a.default_sound)),
       e.origin_server_ts
FROM event_push_actions_numeric a
JOIN users u ON u.nid = a.user_nid
JOIN rooms r ON r.nid = a.room_nid
JOIN events e ON e.stream_ordering = a.stream_ordering;
DROP TABLE event_push_actions_numeric;
CREATE INDEX event_push_actions_event_id_idx ON event_push_actions (event_id);
CREATE INDEX event_push_actions_notifications_idx ON event_push_actions (user_id, stream_ordering)
    WHERE notify;
CREATE INDEX event_push_actions_threads_idx ON event_push_actions (user_id, room_id, stream_ordering)
    WHERE thread_id <> '';
CREATE INDEX event_push_actions_provisional_idx ON event_push_actions (room_id)
    WHERE stream_ordering <= -1099511627776;

DROP FUNCTION myelin_implied_push_actions(BOOLEAN, BOOLEAN, BOOLEAN);
ALTER TABLE rooms DROP COLUMN nid;
ALTER TABLE users DROP COLUMN nid;
