-- Listing runs and threads (`GET /v1/runs`, `GET /v1/threads`), newest
-- first. A sub-agent's run names its parent run from its start, before
-- its record does.
ALTER TABLE rein_runs ADD COLUMN IF NOT EXISTS parent_run_id TEXT;

CREATE INDEX IF NOT EXISTS rein_runs_listing
    ON rein_runs (created_at DESC, run_id DESC);

CREATE INDEX IF NOT EXISTS rein_runs_parent
    ON rein_runs (parent_run_id) WHERE parent_run_id IS NOT NULL;
