DROP INDEX events_body_vector_idx;
ALTER TABLE events DROP COLUMN body_vector;
CREATE INDEX events_body_search_idx ON events
    USING GIN (to_tsvector('simple', COALESCE(pdu->'content'->>'body', '')));
