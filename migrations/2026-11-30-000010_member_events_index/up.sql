-- A user's own member events in a room, newest first: history visibility asks "did this user
-- join after position P?" of departed users, once per room and request.
CREATE INDEX events_room_id_member_stream_ordering_idx
    ON events (room_id, state_key, stream_ordering)
    WHERE event_type = 'm.room.member';
