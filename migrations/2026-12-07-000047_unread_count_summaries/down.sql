DROP TABLE unread_count_summaries;
