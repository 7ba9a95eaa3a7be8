DELETE FROM stream_positions WHERE stream = 'receipts';
DROP TABLE receipts;
