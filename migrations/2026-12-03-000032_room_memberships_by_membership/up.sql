-- A room's members by membership, in user ID order: counts of one membership (the room
-- summary, push rules' member count, sliding sync's counts) read an index range instead of
-- every member, and the summary's heroes are the range's first entries.
CREATE INDEX room_memberships_room_membership_user_idx
    ON room_memberships (room_id, membership, user_id);
