-- Push actions, one row per event and local member it notifies or counts as unread for, were
-- half of the database's growth per message: each row held the user, room and event IDs as
-- text (about 115 bytes), the event's timestamp and its actions as JSON, and the text IDs again
-- in both of its big indexes. Now a row holds the user's and the room's number, the event's
-- position (it identifies the event: `events.stream_ordering` is unique), its flags and thread,
-- and its actions only when they are not the ones its flags imply (almost never: the default
-- rules' actions are). The event's ID and timestamp are read from the event.

ALTER TABLE users ADD COLUMN nid INT GENERATED ALWAYS AS IDENTITY;
ALTER TABLE users ADD CONSTRAINT users_nid_key UNIQUE (nid);
ALTER TABLE rooms ADD COLUMN nid INT GENERATED ALWAYS AS IDENTITY;
ALTER TABLE rooms ADD CONSTRAINT rooms_nid_key UNIQUE (nid);

-- The actions a push action's flags imply: notify or not, the default sound or not, highlight
-- or not. Those of the default push rules are all of this shape (`.m.rule.message` notifies,
-- `.m.rule.room_one_to_one` adds the sound, the mention rules the sound and the highlight), and
-- an event that only counts as unread has none. Writers store NULL for actions equal to what
-- their flags imply, and readers read them back through this one definition.
CREATE FUNCTION myelin_implied_push_actions(notify BOOLEAN, highlight BOOLEAN, default_sound BOOLEAN)
RETURNS JSONB LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN NOT notify THEN '[]'::jsonb ELSE
        '["notify"]'::jsonb
        || CASE WHEN default_sound THEN '[{"set_tweak": "sound", "value": "default"}]'::jsonb
                ELSE '[]'::jsonb END
        || CASE WHEN highlight THEN '[{"set_tweak": "highlight"}]'::jsonb ELSE '[]'::jsonb END
    END
$$;

ALTER TABLE event_push_actions RENAME TO event_push_actions_text;
CREATE TABLE event_push_actions (
    user_nid        INT NOT NULL,
    room_nid        INT NOT NULL,
    stream_ordering BIGINT NOT NULL,
    notify          BOOLEAN NOT NULL,
    highlight       BOOLEAN NOT NULL,
    unread          BOOLEAN NOT NULL,
    -- The actions hold the default sound tweak.
    default_sound   BOOLEAN NOT NULL,
    -- '' for the main timeline, else the thread root.
    thread_id       TEXT NOT NULL,
    -- NULL: myelin_implied_push_actions(notify, highlight, default_sound).
    actions         JSONB
);
INSERT INTO event_push_actions
SELECT u.nid, r.nid, a.stream_ordering, a.notify, a.highlight, a.unread, s.default_sound,
       a.thread_id, NULLIF(a.actions, myelin_implied_push_actions(a.notify, a.highlight, s.default_sound))
FROM event_push_actions_text a
CROSS JOIN LATERAL (
    SELECT a.actions @> '[{"set_tweak": "sound", "value": "default"}]' AS default_sound
) s
JOIN users u ON u.user_id = a.user_id
JOIN rooms r ON r.room_id = a.room_id;
DROP TABLE event_push_actions_text;

ALTER TABLE event_push_actions ADD PRIMARY KEY (user_nid, room_nid, stream_ordering);
-- GET /notifications and the push sender: a user's notifications in stream order.
CREATE INDEX event_push_actions_notifications_idx ON event_push_actions (user_nid, stream_ordering)
    WHERE notify;
-- Unread counts of threads (see migration 000034).
CREATE INDEX event_push_actions_threads_idx ON event_push_actions (user_nid, room_nid, stream_ordering)
    WHERE thread_id <> '';
-- An event's actions for every member: a redaction or a purge deletes them, and createRoom's
-- provisional positions (at or below -2^40, see migration 000036) move to real ones. The
-- members of one event share one entry.
CREATE INDEX event_push_actions_stream_ordering_idx ON event_push_actions (stream_ordering);
