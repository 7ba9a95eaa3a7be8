-- Two more cursors per application service: the to-device stream (messages to the devices
-- of its users, MSC2409/MSC4203) and the device-list stream (MSC3202). Existing appservices
-- start at the current positions: they are sent what happens from now on.
ALTER TABLE appservice_states
    ADD COLUMN to_device_upto BIGINT,
    ADD COLUMN device_lists_upto BIGINT;
UPDATE appservice_states SET
    to_device_upto = COALESCE(
        (SELECT persisted FROM myelin_stream_positions() WHERE stream = 'to_device'), 0),
    device_lists_upto = COALESCE(
        (SELECT persisted FROM myelin_stream_positions() WHERE stream = 'device_lists'), 0);
ALTER TABLE appservice_states
    ALTER COLUMN to_device_upto SET NOT NULL,
    ALTER COLUMN device_lists_upto SET NOT NULL;

-- The appservice sender reads every inbox by position.
CREATE INDEX to_device_inbox_stream_ordering_idx ON to_device_inbox (stream_ordering);
