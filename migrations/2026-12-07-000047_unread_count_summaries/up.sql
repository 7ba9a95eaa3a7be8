-- A member's unread counts of a room's main timeline as of a position, kept by the syncs that
-- count them, so that the next count reads what changed since instead of every unread push
-- action again (a member thousands of messages behind in a busy room recounted all of them at
-- every sync). Derived and rebuilt as needed: a lost row only makes one count slower, so the
-- table is not written to the WAL (a crash empties it) and a sync's write does not wait for
-- the disk.
CREATE UNLOGGED TABLE unread_count_summaries (
    user_nid      INT NOT NULL,
    room_nid      INT NOT NULL,
    -- The counts are of the member's main-timeline push actions after read_from up to and
    -- including counted_to.
    read_from     BIGINT NOT NULL,
    counted_to    BIGINT NOT NULL,
    -- rooms.redactions when counted: a redaction or a purge since took push actions away.
    redactions    BIGINT NOT NULL,
    notifications BIGINT NOT NULL,
    highlights    BIGINT NOT NULL,
    unread        BIGINT NOT NULL,
    PRIMARY KEY (user_nid, room_nid)
);
