-- A run parked for approvals that no process holds: its owner stored the
-- parked round, wrote `parked_calls` (how many calls it waits on) and
-- `parked_wake_at` (the soonest rule timeout, if any), and gave the thread
-- up. It is **waiting** — no process takes its thread for it — until one
-- of these makes it due: a decision on every call, the timeout, a cancel
-- request, or an `interrupt` submission queued on its thread. Whoever
-- takes the thread then carries the run on (and clears `parked_calls`).
ALTER TABLE rein_runs ADD COLUMN IF NOT EXISTS parked_calls INT;
ALTER TABLE rein_runs ADD COLUMN IF NOT EXISTS parked_wake_at TIMESTAMPTZ;
