DELETE FROM stream_positions WHERE stream = 'presence';
DROP TABLE presence;
