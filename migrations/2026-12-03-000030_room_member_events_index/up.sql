-- A room's newest membership event without walking back through its messages: the room-change
-- index reads it for each room on first use after a start (see service/sync/room_index.rs).
CREATE INDEX events_room_members_idx ON events (room_id, stream_ordering)
    WHERE event_type = 'm.room.member';
