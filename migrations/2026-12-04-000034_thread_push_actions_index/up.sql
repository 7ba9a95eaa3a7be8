-- Unread counts read each room's push actions from the member's read position on. Thread
-- replies are read from the latest unthreaded receipt (each thread's own receipt is checked
-- per row), so they get an index of their own: a room's main-timeline actions, most of its
-- history, stay out of that range.
CREATE INDEX event_push_actions_threads_idx ON event_push_actions (user_id, room_id, stream_ordering)
    WHERE thread_id <> '';
