DROP SEQUENCE backfill_position_seq;
DROP INDEX events_room_id_depth_stream_ordering_idx;
-- A linear history cannot hold them: an outlier has no state group, and the others would be
-- served to clients as ordinary events.
DELETE FROM events WHERE outlier OR rejected_reason IS NOT NULL OR soft_failed;
ALTER TABLE events
    DROP CONSTRAINT events_outlier_state_group_check,
    ALTER COLUMN state_group SET NOT NULL,
    DROP COLUMN soft_failed,
    DROP COLUMN rejected_reason,
    DROP COLUMN outlier;
DROP TABLE event_auth_edges;
DROP TABLE event_edges;
