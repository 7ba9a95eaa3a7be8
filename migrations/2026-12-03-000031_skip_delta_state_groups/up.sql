-- Skip deltas (storage/state.rs, insert_state_delta): a group's parent_group is now the base
-- its delta is against, which need not be the group the state came from; prev_group records
-- that one (NULL in older groups, whose parent was it). delta_depth counts the state changes
-- since the lineage's snapshot and snapshot_rows is that snapshot's size (both 0 in older
-- groups: each is then taken as a lineage's start, and their chains keep the old limit).
-- Constant defaults: PostgreSQL adds the columns without rewriting the table.
ALTER TABLE state_groups
    ADD COLUMN prev_group BIGINT,
    ADD COLUMN delta_depth INTEGER NOT NULL DEFAULT 0,
    ADD COLUMN snapshot_rows INTEGER NOT NULL DEFAULT 0;
