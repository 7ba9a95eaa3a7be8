-- Delayed events (MSC4140): an event a client asked to be sent later. A row stays after it is
-- finalised (sent, cancelled or failed) for a while, so the outcome can be looked up.
CREATE TABLE delayed_events (
    delay_id      TEXT PRIMARY KEY,
    user_id       TEXT NOT NULL,
    device_id     TEXT,
    room_id       TEXT NOT NULL,
    event_type    TEXT NOT NULL,
    state_key     TEXT,
    content       JSONB NOT NULL,
    delay_ms      BIGINT NOT NULL,
    -- When it is due: creation (or the last restart) plus `delay_ms`.
    send_ts       BIGINT NOT NULL,
    -- scheduled -> sending (claimed by one process) -> sent | failed; scheduled -> cancelled.
    status        TEXT NOT NULL DEFAULT 'scheduled',
    claimed_ts    BIGINT,
    event_id      TEXT,
    error         TEXT,
    created_ts    BIGINT NOT NULL,
    finalised_ts  BIGINT,
    -- The client transaction of a delayed `/send`: a retry gets the same delay ID.
    txn_id        TEXT
);
CREATE UNIQUE INDEX delayed_events_user_id_device_id_txn_id_idx
    ON delayed_events (user_id, device_id, txn_id) WHERE txn_id IS NOT NULL;
CREATE INDEX delayed_events_send_ts_idx ON delayed_events (send_ts) WHERE status = 'scheduled';
CREATE INDEX delayed_events_user_id_send_ts_idx ON delayed_events (user_id, send_ts);
CREATE INDEX delayed_events_room_id_event_type_state_key_idx
    ON delayed_events (room_id, event_type, state_key)
    WHERE status = 'scheduled' AND state_key IS NOT NULL;
CREATE INDEX delayed_events_status_idx ON delayed_events (status) WHERE status = 'sending';
CREATE INDEX delayed_events_finalised_ts_idx ON delayed_events (finalised_ts)
    WHERE finalised_ts IS NOT NULL;

-- A delayed state event is cancelled when anyone else sets the same state first (MSC4140). A
-- trigger on the current state catches every way state changes (local sends, federation,
-- state resolution) in the transaction that changes it.
CREATE FUNCTION delayed_events_cancel_on_state() RETURNS trigger AS $$
DECLARE
    new_sender TEXT;
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.event_id = NEW.event_id THEN
        RETURN NEW;
    END IF;
    IF NOT EXISTS (
        SELECT 1 FROM delayed_events
        WHERE room_id = NEW.room_id AND event_type = NEW.event_type
          AND state_key = NEW.state_key AND status = 'scheduled'
    ) THEN
        RETURN NEW;
    END IF;
    SELECT sender INTO new_sender FROM events WHERE event_id = NEW.event_id;
    UPDATE delayed_events
       SET status = 'cancelled',
           error = 'the state was set by someone else',
           finalised_ts = (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT
     WHERE room_id = NEW.room_id AND event_type = NEW.event_type
       AND state_key = NEW.state_key AND status = 'scheduled'
       AND user_id IS DISTINCT FROM new_sender;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER room_current_state_cancels_delayed_events
    AFTER INSERT OR UPDATE OF event_id ON room_current_state
    FOR EACH ROW EXECUTE FUNCTION delayed_events_cancel_on_state();

-- Dehydrated devices (MSC3814): at most one per user; the device itself is a row in
-- `devices` (it receives to-device messages like any other); deleting that device, by any
-- path, forgets it here too.
CREATE TABLE dehydrated_devices (
    user_id     TEXT PRIMARY KEY,
    device_id   TEXT NOT NULL,
    device_data JSONB NOT NULL,
    created_ts  BIGINT NOT NULL,
    FOREIGN KEY (user_id, device_id) REFERENCES devices (user_id, device_id) ON DELETE CASCADE
);
