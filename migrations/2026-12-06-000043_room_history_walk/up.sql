-- A page of a room's history (`/messages`, `/context`), read in topological order by the one
-- index that holds it in that order, whatever the planner's statistics say of the room.
--
-- As a plain statement the page was planned from the room's row estimate. A room that grew
-- since `events` was last analysed (a busy room on a big server, where a tenth of the table
-- is a lot of events, or any room in the minutes after a server is filled) looks small, and
-- for a small room reading all of it through another index and sorting costs about the same
-- as walking the topological index: the plan flipped to reading every event of the room for
-- every page. With sorts and bitmap scans disabled inside this function the ordered walk is
-- the only plan left. PL/pgSQL keeps the query's plan per connection, as a prepared statement
-- would be kept.
--
-- The served-to-clients predicate is the topological index's own (and `SERVED_TO_CLIENTS`
-- in the code).
CREATE FUNCTION myelin_room_history(
    room TEXT, after_depth BIGINT, after_stream BIGINT, up_to_depth BIGINT, up_to_stream BIGINT,
    backwards BOOLEAN, max_rows BIGINT
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
    IF backwards THEN
        RETURN QUERY
        SELECT e.event_id, e.room_id, e.stream_ordering, e.depth, e.sender, e.event_type,
               e.state_key, e.pdu, e.state_group, e.redacted_by
        FROM events e
        WHERE e.room_id = room
          AND (e.depth, e.stream_ordering) > (after_depth, after_stream)
          AND (e.depth, e.stream_ordering) <= (up_to_depth, up_to_stream)
          AND NOT e.outlier AND e.rejected_reason IS NULL AND NOT e.soft_failed
        ORDER BY e.depth DESC, e.stream_ordering DESC
        LIMIT max_rows;
    ELSE
        RETURN QUERY
        SELECT e.event_id, e.room_id, e.stream_ordering, e.depth, e.sender, e.event_type,
               e.state_key, e.pdu, e.state_group, e.redacted_by
        FROM events e
        WHERE e.room_id = room
          AND (e.depth, e.stream_ordering) > (after_depth, after_stream)
          AND (e.depth, e.stream_ordering) <= (up_to_depth, up_to_stream)
          AND NOT e.outlier AND e.rejected_reason IS NULL AND NOT e.soft_failed
        ORDER BY e.depth, e.stream_ordering
        LIMIT max_rows;
    END IF;
END
$$;
