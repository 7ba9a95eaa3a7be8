ALTER TABLE uia_sessions DROP COLUMN operation;
