DROP TRIGGER room_memberships_count_update ON room_memberships;
DROP TRIGGER room_memberships_count_insert_delete ON room_memberships;
DROP FUNCTION count_room_membership();
DROP TABLE room_member_counts;
