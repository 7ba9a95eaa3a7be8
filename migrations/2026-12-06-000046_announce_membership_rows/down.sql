CREATE OR REPLACE FUNCTION announce_room_membership() RETURNS trigger AS $$
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
