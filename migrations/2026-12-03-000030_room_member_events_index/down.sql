DROP INDEX events_room_members_idx;
