-- Who took a decision: the API token's name (or `rein run`); NULL when
-- not known (no auth). `decided_at` says when.
ALTER TABLE rein_decisions ADD COLUMN IF NOT EXISTS decided_by TEXT;
