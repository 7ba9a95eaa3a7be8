-- Sending to other servers. Each destination has at most one transaction in flight: its ID and
-- body are stored before the first attempt and resent unchanged until the destination answers
-- 200, so a crash mid-send resends the same transaction (the receiver deduplicates).
CREATE TABLE federation_destinations (
    destination TEXT PRIMARY KEY,
    -- Failed attempts since the last success (or since the destination last contacted us).
    failures INTEGER NOT NULL DEFAULT 0,
    -- No attempt before this time (ms since 1970).
    retry_at_ts BIGINT NOT NULL DEFAULT 0,
    -- The transaction in flight, if any.
    txn_id TEXT,
    txn_body JSONB
);

-- EDUs queued for a destination (to-device messages, later device lists and signing keys),
-- durable until the destination has acknowledged the transaction that carried them.
CREATE TABLE federation_outbox (
    outbox_id BIGSERIAL PRIMARY KEY,
    destination TEXT NOT NULL,
    edu_type TEXT NOT NULL,
    content JSONB NOT NULL,
    -- The transaction carrying the EDU once one has been built.
    txn_id TEXT,
    created_ts BIGINT NOT NULL
);
CREATE INDEX federation_outbox_destination_outbox_id_idx
    ON federation_outbox (destination, outbox_id);

-- Transactions received from other servers and what we answered, so a replay (also a
-- concurrent one) gets the same answer and applies nothing twice. Kept a day.
CREATE TABLE federation_received_txns (
    origin TEXT NOT NULL,
    txn_id TEXT NOT NULL,
    response JSONB NOT NULL,
    received_ts BIGINT NOT NULL,
    PRIMARY KEY (origin, txn_id)
);
CREATE INDEX federation_received_txns_received_ts_idx ON federation_received_txns (received_ts);

-- message_ids of to-device EDUs received, so one sent again in a new transaction is
-- delivered once. Kept a day.
CREATE TABLE federation_received_to_device (
    origin TEXT NOT NULL,
    message_id TEXT NOT NULL,
    received_ts BIGINT NOT NULL,
    PRIMARY KEY (origin, message_id)
);
CREATE INDEX federation_received_to_device_received_ts_idx
    ON federation_received_to_device (received_ts);
