DROP TABLE admin_room_deletions;
ALTER TABLE media DROP COLUMN quarantined_by;
DROP TABLE blocked_rooms;
DROP TABLE user_ratelimit_overrides;
ALTER TABLE devices DROP COLUMN hidden;
ALTER TABLE users DROP COLUMN erased;
