DROP TABLE user_reports;
DROP TABLE room_reports;
DROP TABLE event_reports;
