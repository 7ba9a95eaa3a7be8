-- The newest served events of many rooms, each room's up to its own limit within its own
-- window of stream positions, newest first: what a sync reads for the rooms it sends.
--
-- Each room's events come from walking `(room_id, stream_ordering)` backwards from the window's
-- end, whatever the planner's statistics say. As a plain statement, on tables never analysed
-- (a new server filling up), PostgreSQL could read a room through the topological index
-- instead (its partial predicate is the served filter, so it looks the cheaper index) and sort
-- every event of the room for each sync: a member's first sync of a room of 20,000 members
-- took 66 ms in that read. With sorts and bitmap scans disabled inside this function the
-- ordered walk is the only plan left, as in `myelin_room_history` (migration 000043).
--
-- The served-to-clients predicate is `SERVED_TO_CLIENTS` in the code.
CREATE FUNCTION myelin_newest_events(
    rooms TEXT[], after_streams BIGINT[], up_to_streams BIGINT[], max_rows BIGINT[]
)
RETURNS TABLE (
    event_id TEXT, room_id TEXT, stream_ordering BIGINT, depth BIGINT, sender TEXT,
    event_type TEXT, state_key TEXT, pdu JSONB, state_group BIGINT, redacted_by TEXT
)
LANGUAGE plpgsql STABLE
SET enable_sort = off
SET enable_incremental_sort = off
SET enable_bitmapscan = off
AS $$
BEGIN
    RETURN QUERY
    SELECT e.* FROM unnest(rooms, after_streams, up_to_streams, max_rows)
        AS w(room, after_stream, up_to_stream, lim)
    CROSS JOIN LATERAL (
        SELECT v.event_id, v.room_id, v.stream_ordering, v.depth, v.sender, v.event_type,
               v.state_key, v.pdu, v.state_group, v.redacted_by
        FROM events v
        WHERE v.room_id = w.room
          AND v.stream_ordering > w.after_stream AND v.stream_ordering <= w.up_to_stream
          AND NOT v.outlier AND v.rejected_reason IS NULL AND NOT v.soft_failed
        ORDER BY v.stream_ordering DESC
        LIMIT w.lim
    ) e;
END
$$;
