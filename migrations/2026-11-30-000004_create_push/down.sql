DROP TABLE pushers;
DROP TABLE event_push_actions;
ALTER TABLE room_memberships DROP COLUMN display_name;
