-- Threads, their histories, and who owns each thread.
--
-- `fence` counts the changes of a thread's owner; every write of a
-- thread's history names the fence its writer holds, and a write whose
-- fence is not the current one is refused (a stale owner writes nothing).
CREATE TABLE IF NOT EXISTS rein_threads (
    thread_id   TEXT PRIMARY KEY,
    owner       TEXT,
    fence       BIGINT NOT NULL DEFAULT 0,
    lease_until TIMESTAMPTZ,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS rein_messages (
    thread_id TEXT   NOT NULL REFERENCES rein_threads (thread_id) ON DELETE CASCADE,
    seq       BIGINT NOT NULL,
    message   JSONB  NOT NULL,
    PRIMARY KEY (thread_id, seq)
);
