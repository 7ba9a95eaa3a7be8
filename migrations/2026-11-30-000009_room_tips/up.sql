-- A room's forward extremities (and the depth of the newest) live on its row: each event is
-- then one in-place update of a column no index covers, instead of a deleted and an inserted
-- row whose dead index entries every later send had to step over.
ALTER TABLE rooms
    ADD COLUMN forward_extremities TEXT[] NOT NULL DEFAULT '{}',
    ADD COLUMN tip_depth BIGINT NOT NULL DEFAULT 0;

UPDATE rooms r
SET forward_extremities = tips.event_ids, tip_depth = tips.depth
FROM (
    SELECT f.room_id, array_agg(f.event_id ORDER BY f.event_id) AS event_ids, max(e.depth) AS depth
    FROM room_forward_extremities f
    JOIN events e ON e.event_id = f.event_id
    GROUP BY f.room_id
) tips
WHERE r.room_id = tips.room_id;

DROP TABLE room_forward_extremities;
