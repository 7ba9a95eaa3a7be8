-- Stream positions come from one sequence per stream instead of a counter row locked until
-- commit (which made every writer of a stream wait for the one before it to commit).
--
-- The persisted-up-to position a reader may advance to is below every position a writer has
-- taken and not yet committed. A writer holds a transaction-level advisory lock on the lowest
-- position it takes (two-key form: key 1 = 1297678336 + stream_no * 256 + position / 2^31,
-- key 2 = position mod 2^31) until its transaction ends; readers look for those locks in
-- pg_locks. So a reader never sees a position that is taken but not yet locked, taking one
-- holds the guard lock (1297678335, 0) shared and reading holds it exclusively, each for
-- microseconds. A crashed or rolled-back writer's lock goes with it: its positions become
-- gaps, which readers pass.
ALTER TABLE stream_positions ADD COLUMN stream_no INT;
UPDATE stream_positions SET stream_no = CASE stream
    WHEN 'events' THEN 1 WHEN 'account_data' THEN 2 WHEN 'receipts' THEN 3
    WHEN 'presence' THEN 4 WHEN 'device_lists' THEN 5 WHEN 'to_device' THEN 6 END;
ALTER TABLE stream_positions ALTER COLUMN stream_no SET NOT NULL;
ALTER TABLE stream_positions ADD CONSTRAINT stream_positions_stream_no_key UNIQUE (stream_no);

CREATE SEQUENCE stream_events_seq MINVALUE 0;
CREATE SEQUENCE stream_account_data_seq MINVALUE 0;
CREATE SEQUENCE stream_receipts_seq MINVALUE 0;
CREATE SEQUENCE stream_presence_seq MINVALUE 0;
CREATE SEQUENCE stream_device_lists_seq MINVALUE 0;
CREATE SEQUENCE stream_to_device_seq MINVALUE 0;
SELECT setval(format('stream_%s_seq', stream)::regclass, position, true) FROM stream_positions;
ALTER TABLE stream_positions DROP COLUMN position;

-- Takes `n` positions of a stream (ascending; not necessarily consecutive) and locks the lowest
-- until this transaction ends.
CREATE FUNCTION myelin_take_positions(stream_name TEXT, n INT) RETURNS BIGINT[]
LANGUAGE plpgsql AS $$
DECLARE
    number INT;
    taken BIGINT[];
BEGIN
    SELECT stream_no INTO STRICT number FROM stream_positions WHERE stream = stream_name;
    PERFORM pg_advisory_lock_shared(1297678335, 0);
    BEGIN
        SELECT array_agg(p ORDER BY p) INTO taken
          FROM (SELECT nextval(format('stream_%s_seq', stream_name)::regclass) AS p
                  FROM generate_series(1, n)) positions;
        PERFORM pg_advisory_xact_lock(1297678336 + number * 256 + (taken[1] >> 31)::INT,
                                      (taken[1] & 2147483647)::INT);
    EXCEPTION WHEN OTHERS THEN
        PERFORM pg_advisory_unlock_shared(1297678335, 0);
        RAISE;
    END;
    PERFORM pg_advisory_unlock_shared(1297678335, 0);
    RETURN taken;
END $$;

-- Every stream's persisted-up-to position (below every uncommitted one) and the highest
-- position taken.
CREATE FUNCTION myelin_stream_positions()
RETURNS TABLE (stream TEXT, persisted BIGINT, taken BIGINT)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_lock(1297678335, 0);
    BEGIN
        RETURN QUERY
        WITH heads AS (
            SELECT s.stream, s.stream_no,
                   pg_sequence_last_value(format('stream_%s_seq', s.stream)::regclass) AS head
              FROM stream_positions s
        ), held AS (
            SELECT (l.classid::BIGINT - 1297678336) / 256 AS stream_no,
                   min((((l.classid::BIGINT - 1297678336) % 256) << 31) | l.objid::BIGINT) AS lowest
              FROM pg_locks l
             WHERE l.locktype = 'advisory' AND l.objsubid = 2
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
               AND l.classid::BIGINT >= 1297678336 + 256
               AND l.classid::BIGINT < 1297678336 + 256 * 64
             GROUP BY 1
        )
        SELECT h.stream, COALESCE(LEAST(held.lowest - 1, h.head), h.head), h.head
          FROM heads h LEFT JOIN held ON held.stream_no = h.stream_no;
    EXCEPTION WHEN OTHERS THEN
        PERFORM pg_advisory_unlock(1297678335, 0);
        RAISE;
    END;
    PERFORM pg_advisory_unlock(1297678335, 0);
END $$;
