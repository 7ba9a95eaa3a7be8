-- Global account data by type: what finds the few members of a room with push rules of their
-- own (read for every event) from those users, whatever the planner's statistics say. Without
-- it the read could only start from the room's members, all of them, and did wherever the
-- tables had never been analysed (1.3 ms an event in a room of 6,000, growing with the room).
CREATE INDEX account_data_global_type_user_idx ON account_data (data_type, user_id)
    WHERE room_id = '';
