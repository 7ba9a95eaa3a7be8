-- How many times an event of the room has been redacted in place. Each process caches state
-- events' client parts, which only a redaction changes; a cached part is served only while
-- its room's count is the one it was read with, so a redaction made through any process is
-- seen at once by every other.
ALTER TABLE rooms ADD COLUMN redactions BIGINT NOT NULL DEFAULT 0;
