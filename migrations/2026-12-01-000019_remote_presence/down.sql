DELETE FROM presence WHERE user_id NOT IN (SELECT user_id FROM users);
ALTER TABLE presence ADD CONSTRAINT presence_user_id_fkey
    FOREIGN KEY (user_id) REFERENCES users (user_id) ON DELETE CASCADE;
