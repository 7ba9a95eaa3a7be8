-- A room's joined members by the server part of their user IDs (the text after the first
-- ':', as room_servers.rs reads it): which servers are in a room is found by skipping from
-- one server to the next in this index, a few probes per server, instead of reading every
-- member (20,000 in a big room, for every typing notice, receipt and presence change sent
-- to other servers); and one server's members are read as a range.
CREATE INDEX room_memberships_joined_server_idx
    ON room_memberships (room_id, (substr(user_id, strpos(user_id, ':') + 1)))
    INCLUDE (user_id)
    WHERE membership = 'join';
