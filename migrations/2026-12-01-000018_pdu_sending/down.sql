DROP TABLE federation_pdu_cursor;
DELETE FROM federation_outbox WHERE event_id IS NOT NULL;
ALTER TABLE federation_outbox
    DROP CONSTRAINT federation_outbox_kind_check,
    ALTER COLUMN edu_type SET NOT NULL,
    DROP COLUMN event_id;
