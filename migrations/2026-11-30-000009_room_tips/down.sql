CREATE TABLE room_forward_extremities (
    room_id  TEXT NOT NULL,
    event_id TEXT NOT NULL,
    PRIMARY KEY (room_id, event_id)
);
INSERT INTO room_forward_extremities (room_id, event_id)
SELECT room_id, unnest(forward_extremities) FROM rooms;
ALTER TABLE rooms DROP COLUMN forward_extremities, DROP COLUMN tip_depth;
