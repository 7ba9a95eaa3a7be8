ALTER TABLE state_groups DROP COLUMN prev_group, DROP COLUMN delta_depth,
    DROP COLUMN snapshot_rows;
