-- createRoom and upgrades store their events at provisional positions (at or below -2^40) and
-- move them to real ones just before commit; the rows that copy an event's position (push
-- actions, relations) follow by room. Neither table had an index that starts with the room,
-- so every room created scanned every push action and relation on the server. These indexes
-- hold only the rows at provisional positions: empty outside those transactions.
CREATE INDEX event_push_actions_provisional_idx ON event_push_actions (room_id)
    WHERE stream_ordering <= -1099511627776;
CREATE INDEX event_relations_provisional_idx ON event_relations (room_id)
    WHERE stream_ordering <= -1099511627776;
