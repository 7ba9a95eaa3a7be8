-- The room DAG (Federation 2): the graph's edges, what an event's status lets us do with it,
-- topological order for history, and positions for backfilled events.

-- `prev_events` and `auth_events` of every event, written with the event. The referenced
-- event may be missing (a gap, or an auth event not fetched yet), so there is no foreign
-- key: a referenced ID with no `events` row is a backward extremity.
CREATE TABLE event_edges (
    event_id      TEXT NOT NULL,
    prev_event_id TEXT NOT NULL,
    room_id       TEXT NOT NULL,
    PRIMARY KEY (event_id, prev_event_id)
);
CREATE INDEX event_edges_prev_event_id_idx ON event_edges (prev_event_id);

CREATE TABLE event_auth_edges (
    event_id      TEXT NOT NULL,
    auth_event_id TEXT NOT NULL,
    room_id       TEXT NOT NULL,
    PRIMARY KEY (event_id, auth_event_id)
);
CREATE INDEX event_auth_edges_auth_event_id_idx ON event_auth_edges (auth_event_id);

INSERT INTO event_edges (event_id, prev_event_id, room_id)
SELECT e.event_id, prev.id, e.room_id
FROM events e, jsonb_array_elements_text(e.pdu->'prev_events') AS prev (id)
WHERE jsonb_typeof(e.pdu->'prev_events') = 'array'
ON CONFLICT DO NOTHING;

INSERT INTO event_auth_edges (event_id, auth_event_id, room_id)
SELECT e.event_id, auth.id, e.room_id
FROM events e, jsonb_array_elements_text(e.pdu->'auth_events') AS auth (id)
WHERE jsonb_typeof(e.pdu->'auth_events') = 'array'
ON CONFLICT DO NOTHING;

-- An event's status. Clients are served only events that are none of these (the condition
-- `NOT outlier AND rejected_reason IS NULL AND NOT soft_failed`, written once in
-- `storage/rooms.rs`):
-- - an outlier (an auth event fetched on its own) has no place in the timeline and no state
--   of its own, so no state group; a state group may still name it;
-- - a rejected event failed authorisation: never served to clients, never a forward
--   extremity, never in any state;
-- - a soft-failed event passed the auth rules but not the current state: stored and served
--   over federation only, never in /sync, never a forward extremity.
-- Tables derived from served events (relations, push actions, current state, memberships,
-- receipts) get no rows for the others.
ALTER TABLE events
    ADD COLUMN outlier BOOLEAN NOT NULL DEFAULT false,
    ADD COLUMN rejected_reason TEXT,
    ADD COLUMN soft_failed BOOLEAN NOT NULL DEFAULT false,
    ALTER COLUMN state_group DROP NOT NULL,
    ADD CONSTRAINT events_outlier_state_group_check CHECK (outlier = (state_group IS NULL));

-- History (`/messages`, `/context`) goes in topological order, `(depth, stream_ordering)`,
-- over served events only; partial, so the index stays out of every other query's way.
CREATE INDEX events_room_id_depth_stream_ordering_idx ON events (room_id, depth, stream_ordering)
    WHERE NOT outlier AND rejected_reason IS NULL AND NOT soft_failed;

-- Backfilled (old) events get positions from here: negative, descending, never reused, so
-- `/sync`, which reads positions after its token (never below zero), never reports them as
-- new. The bound keeps them clear of the far lower provisional positions of multi-event
-- transactions (`DeferredPositions` in `service/rooms/writer.rs`).
CREATE SEQUENCE backfill_position_seq
    INCREMENT BY -1 START WITH -1 MAXVALUE -1 MINVALUE -1099511627775 NO CYCLE;

-- `rooms.forward_extremities` is a set from now on: an event removes its `prev_events` from
-- it and adds itself; `rooms.tip_depth` is the greatest depth written to the room.
