-- The edge tables of migration 000017 go: every event's `prev_events` and `auth_events` are in
-- its PDU, which is what federation's graph walks (missing events, auth chains) read, and
-- nothing read `event_auth_edges` or either table's reverse index. Their rows were a sixth of
-- the database's growth per message and one more statement in every write.
DROP TABLE event_auth_edges;
DROP TABLE event_edges;
