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
