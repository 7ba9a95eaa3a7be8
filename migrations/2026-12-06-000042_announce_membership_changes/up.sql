-- Each server process keeps, for the rooms written to lately, whom the room's events wake
-- (its joined, invited and knocking members), instead of reading them again at every event
-- (every member of a room of 20,000, for each message and each typing change). A change of
-- anyone's membership announces the room on `myelin_members` at commit, whatever writes it
-- (member events local or federated, state resets, invites over federation, purges), and
-- every process forgets the room's list. A trigger, so that no write path can forget to.
CREATE FUNCTION announce_room_membership() RETURNS trigger AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        PERFORM pg_notify('myelin_members', OLD.room_id);
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        PERFORM pg_notify('myelin_members', NEW.room_id);
    END IF;
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER room_memberships_announce_insert_delete
    AFTER INSERT OR DELETE ON room_memberships
    FOR EACH ROW EXECUTE FUNCTION announce_room_membership();

-- A new display name or avatar, or a row's position moving, wakes nobody new.
CREATE TRIGGER room_memberships_announce_update
    AFTER UPDATE ON room_memberships
    FOR EACH ROW
    WHEN (OLD.membership IS DISTINCT FROM NEW.membership OR OLD.room_id IS DISTINCT FROM NEW.room_id
          OR OLD.user_id IS DISTINCT FROM NEW.user_id)
    EXECUTE FUNCTION announce_room_membership();
