DROP TABLE media_thumbnails;
DROP TABLE media;
