-- A per-user counter that moves with every change to the user's memberships, whatever
-- writes them (member events, forgetting a room, purging a room), so a server process may
-- keep a user's membership list in memory and check that it is current with one row read.
-- Users whose memberships never changed since this table was made have no row (version 0).
CREATE TABLE user_membership_versions (
    user_id TEXT PRIMARY KEY,
    version BIGINT NOT NULL
);

CREATE FUNCTION bump_user_membership_version() RETURNS trigger AS $$
DECLARE
    changed_user TEXT := CASE WHEN TG_OP = 'DELETE' THEN OLD.user_id ELSE NEW.user_id END;
BEGIN
    -- Incremented under the row's lock, so concurrent writers for one user serialise here
    -- and every committed change leaves a larger number behind.
    INSERT INTO user_membership_versions AS v (user_id, version)
    VALUES (changed_user, 1)
    ON CONFLICT (user_id) DO UPDATE SET version = v.version + 1;
    RETURN NULL;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER room_memberships_version_insert_delete
    AFTER INSERT OR DELETE ON room_memberships
    FOR EACH ROW EXECUTE FUNCTION bump_user_membership_version();

-- A display name dropped by a redaction is not part of the list: it does not count.
CREATE TRIGGER room_memberships_version_update
    AFTER UPDATE ON room_memberships
    FOR EACH ROW
    WHEN ((OLD.membership, OLD.event_id, OLD.stream_ordering, OLD.forgotten)
          IS DISTINCT FROM (NEW.membership, NEW.event_id, NEW.stream_ordering, NEW.forgotten))
    EXECUTE FUNCTION bump_user_membership_version();
