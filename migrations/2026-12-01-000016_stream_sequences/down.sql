DROP FUNCTION myelin_stream_positions();
DROP FUNCTION myelin_take_positions(TEXT, INT);
ALTER TABLE stream_positions ADD COLUMN position BIGINT;
UPDATE stream_positions
   SET position = pg_sequence_last_value(format('stream_%s_seq', stream)::regclass);
ALTER TABLE stream_positions ALTER COLUMN position SET NOT NULL;
DROP SEQUENCE stream_events_seq;
DROP SEQUENCE stream_account_data_seq;
DROP SEQUENCE stream_receipts_seq;
DROP SEQUENCE stream_presence_seq;
DROP SEQUENCE stream_device_lists_seq;
DROP SEQUENCE stream_to_device_seq;
ALTER TABLE stream_positions DROP CONSTRAINT stream_positions_stream_no_key;
ALTER TABLE stream_positions DROP COLUMN stream_no;
