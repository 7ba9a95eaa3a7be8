-- Relations between events (edits, reactions, threads, references), written with the event.
-- Derived from the events' content; a redacted event's relation row is removed.
CREATE TABLE event_relations (
    event_id        TEXT PRIMARY KEY,
    relates_to      TEXT NOT NULL,
    rel_type        TEXT NOT NULL,
    room_id         TEXT NOT NULL,
    sender          TEXT NOT NULL,
    event_type      TEXT NOT NULL,
    -- Reactions: the emoji (or other key).
    aggregation_key TEXT,
    stream_ordering BIGINT NOT NULL
);
CREATE INDEX event_relations_relates_to_idx ON event_relations (relates_to, rel_type, stream_ordering);
CREATE INDEX event_relations_threads_idx ON event_relations (room_id, stream_ordering)
    WHERE rel_type = 'm.thread';

-- Full-text search over message bodies.
CREATE INDEX events_body_search_idx ON events
    USING GIN (to_tsvector('simple', COALESCE(pdu->'content'->>'body', '')));
