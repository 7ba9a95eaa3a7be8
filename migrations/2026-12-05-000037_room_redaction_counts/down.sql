ALTER TABLE rooms DROP COLUMN redactions;
