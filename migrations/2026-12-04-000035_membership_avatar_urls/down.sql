ALTER TABLE room_memberships DROP COLUMN avatar_url;
