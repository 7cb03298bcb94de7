-- The client message ids a thread has seen (AG-UI sends the whole
-- conversation each time; only messages with new ids are appended).
-- Checked and recorded under the thread's advisory lock, in the
-- submission's own transaction, so every process and a restart agree.
CREATE TABLE IF NOT EXISTS rein_message_ids (
    thread_id  TEXT NOT NULL,
    message_id TEXT NOT NULL,
    PRIMARY KEY (thread_id, message_id)
);
