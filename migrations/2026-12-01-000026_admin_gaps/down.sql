DROP TABLE admin_history_purges;
