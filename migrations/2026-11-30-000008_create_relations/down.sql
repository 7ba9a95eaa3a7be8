DROP INDEX events_body_search_idx;
DROP TABLE event_relations;
