-- Search ranks each match by its body's text vector. Built from the JSON at read time, a common
-- word in a room of a million events took 1.4 s (the vector built twice per match, to match and
-- to rank); stored with the row, 0.33 s. PostgreSQL computes it on every insert and on the
-- redaction's rewrite of the PDU, whatever writes the row. Adding it rewrites the table once
-- (about 15 s for a million events on a 2-core machine).
ALTER TABLE events ADD COLUMN body_vector tsvector NOT NULL
    GENERATED ALWAYS AS (to_tsvector('simple', COALESCE(pdu->'content'->>'body', ''))) STORED;
DROP INDEX events_body_search_idx;
CREATE INDEX events_body_vector_idx ON events USING GIN (body_vector);
