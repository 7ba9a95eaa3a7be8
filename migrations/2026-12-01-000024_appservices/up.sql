-- Delivery state of each application service: a cursor in the event stream, the last
-- transaction ID used (IDs increase forever: bridges deduplicate by ID), the transaction in
-- flight (stored before its first attempt and resent unchanged until a 2xx), and the backoff.
CREATE TABLE appservice_states (
    appservice_id TEXT PRIMARY KEY,
    events_upto BIGINT NOT NULL,
    last_txn_id BIGINT NOT NULL DEFAULT 0,
    txn_id BIGINT,
    txn_body JSONB,
    failures INTEGER NOT NULL DEFAULT 0,
    retry_at_ts BIGINT NOT NULL DEFAULT 0
);
