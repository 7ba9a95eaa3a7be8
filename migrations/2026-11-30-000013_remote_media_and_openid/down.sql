DROP TABLE openid_tokens;
DROP TABLE remote_media_thumbnails;
DROP TABLE remote_media;
