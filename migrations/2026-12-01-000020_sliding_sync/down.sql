DROP TABLE sliding_sync_rooms;
DROP TABLE sliding_sync_connections;
DROP SEQUENCE sliding_sync_versions;
