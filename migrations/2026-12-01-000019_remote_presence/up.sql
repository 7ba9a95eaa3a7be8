-- Presence of other servers' users (from m.presence EDUs) is kept beside our users' own, so
-- the table no longer refers to local accounts only.
ALTER TABLE presence DROP CONSTRAINT presence_user_id_fkey;
