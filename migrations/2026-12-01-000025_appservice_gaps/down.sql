ALTER TABLE appservice_states DROP COLUMN to_device_upto, DROP COLUMN device_lists_upto;
