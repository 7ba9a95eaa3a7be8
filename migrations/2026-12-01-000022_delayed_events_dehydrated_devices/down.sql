DROP TABLE dehydrated_devices;
DROP TRIGGER room_current_state_cancels_delayed_events ON room_current_state;
DROP FUNCTION delayed_events_cancel_on_state();
DROP TABLE delayed_events;
