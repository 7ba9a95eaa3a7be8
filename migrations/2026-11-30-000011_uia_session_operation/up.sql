-- The operation a UIA session was started for: a session completed for one request cannot
-- authorise another (as Synapse refuses 'operation changed').
ALTER TABLE uia_sessions ADD COLUMN operation TEXT;
