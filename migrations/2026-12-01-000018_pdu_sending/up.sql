-- Sending our own events (PDUs) to the other servers in their rooms (Federation 2).

-- The outbox holds PDUs beside EDUs: a PDU row names its event and holds the PDU exactly as
-- it is sent (signed, without `unsigned`); an EDU row has a type and its content. Each
-- destination's rows leave in `outbox_id` order, which for PDUs is stream order (only the
-- sending process queues them, in stream order).
ALTER TABLE federation_outbox
    ADD COLUMN event_id TEXT,
    ALTER COLUMN edu_type DROP NOT NULL,
    ADD CONSTRAINT federation_outbox_kind_check CHECK ((edu_type IS NULL) <> (event_id IS NULL));

-- How far the sending process has queued the event stream: every event at or below this
-- position that goes to other servers is in the outbox (or was delivered). Advanced in the
-- transaction that queues the events; never beyond the persisted-up-to position. One row.
CREATE TABLE federation_pdu_cursor (
    single BOOLEAN PRIMARY KEY DEFAULT true CHECK (single),
    stream_ordering BIGINT NOT NULL
);
-- Events written before this migration were never meant for other servers: start after them.
INSERT INTO federation_pdu_cursor (stream_ordering)
SELECT GREATEST(COALESCE(max(stream_ordering), 0), 0) FROM events;
