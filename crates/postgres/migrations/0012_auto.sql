-- Auto mode in the service (docs/auto-mode.md): a round's session state
-- travels with its run row, so the next round may run in any process; a
-- thread's stored defaults and session totals live in their own row.
ALTER TABLE rein_runs ADD COLUMN IF NOT EXISTS auto JSONB;

CREATE TABLE IF NOT EXISTS rein_thread_auto (
    thread_id  TEXT PRIMARY KEY,
    -- The stored default mode ('auto' or 'single'), NULL when never set.
    run_mode   TEXT,
    -- The stored default policy; `policy_set` tells a stored "no policy"
    -- (NULL policy) from none stored.
    policy     JSONB,
    policy_set BOOLEAN NOT NULL DEFAULT false,
    tokens     BIGINT  NOT NULL DEFAULT 0,
    reports    JSONB   NOT NULL DEFAULT '[]'::jsonb
);
