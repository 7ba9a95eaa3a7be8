-- Each current membership keeps its member event's avatar URL beside its display name, both
-- only when the event gives them as strings, so `/joined_members` reads the memberships alone
-- instead of taking the fields out of every member's stored event.
ALTER TABLE room_memberships ADD COLUMN avatar_url TEXT;
UPDATE room_memberships m
   SET display_name = CASE WHEN jsonb_typeof(e.pdu->'content'->'displayname') = 'string'
                           THEN e.pdu->'content'->>'displayname' END,
       avatar_url = CASE WHEN jsonb_typeof(e.pdu->'content'->'avatar_url') = 'string'
                         THEN e.pdu->'content'->>'avatar_url' END
  FROM events e
 WHERE e.event_id = m.event_id;
