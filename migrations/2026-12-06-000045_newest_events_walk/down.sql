DROP FUNCTION myelin_newest_events(TEXT[], BIGINT[], BIGINT[], BIGINT[]);
