DROP INDEX to_device_inbox_stream_ordering_idx;
ALTER TABLE appservice_states DROP COLUMN to_device_upto, DROP COLUMN device_lists_upto;
