DROP TABLE remote_server_keys;
